"""Release matrix: `kvspec check --adapter sglang` against SGLang's own radix tree in every 0.5 release.

SGLang's cache layer (``sglang/srt/mem_cache``, the scheduler's ``Req``) is pure Python, so each
release is installed with ``--no-deps`` into its own cached folder (``$KVSPEC_SGLANG_CACHE/<version>/site``,
default ``~/.cache/kvspec/sglang``) and run by the current interpreter (the SGLang extra's venv: torch,
transformers, ...) with that folder first on PYTHONPATH. Two things of a newer dependency set are
bridged by a folder of stand-ins put after it (``<cache>/shims``): an ``sgl_kernel`` package shell that
keeps the installed kernel package's pure-Python submodules but no native library (older releases
import it through ``memory_pool_host``; its ``__init__`` needs libcuda; any kernel call raises), and a
``sitecustomize`` that lets a release re-register a config transformers already defines. A release
that still cannot import the adapter's modules is listed as skipped, with the reason.

For each release it runs

    python -m kvspec.cli check --adapter sglang --profile PROFILE --seed SEED [--max-examples N]

and writes a table (release x verdict x steps x the violated invariant and shrunk case) into
docs/sglang-matrix.md between the markers, plus the raw rows as JSON in docs/sglang-matrix.json.

Usage (from the repository root, with the SGLang venv's python):

    python benchmarks/sglang_matrix.py                              # the newest post of every 0.5.x
    python benchmarks/sglang_matrix.py --versions 0.5.20,0.5.23 --no-write
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from kvspec.bench import shard

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "sglang-matrix.md"
BEGIN, END = "<!-- matrix:begin -->", "<!-- matrix:end -->"
PACKAGE = "sglang"
OLDEST = Version("0.5.0")
PROBE = (
    "import sglang, kvspec.adapters._sglang_shims as s; v = s.load(); print('KVSPEC_PROBE', sglang.__file__, v.version)"
)

KERNEL_SHELL = '''"""kvspec's stand-in for sgl_kernel (benchmarks/sglang_matrix.py): the installed package's pure-Python
submodules import from its own folder, but its native library is never loaded; any kernel call raises."""

__path__ = [{real!r}]


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)

    def kernel(*args, **kwargs):
        raise RuntimeError(f"sgl_kernel.{{name}} is not available: kvspec runs SGLang's cache on CPU without kernels")

    return kernel
'''

SITECUSTOMIZE = '''"""kvspec (benchmarks/sglang_matrix.py): bridges from older SGLang releases to newer dependencies.

- 0.5.1 asks torch._C._cpu._is_amx_tile_supported() at import; the venv's torch has no such function (it reports
  no AMX here: the kernels that would use it are not installed either).
- older releases register configs (qwen3_asr) that the venv's transformers already defines; let them, as
  exist_ok=True does.
"""
try:
    import torch

    if not hasattr(torch._C._cpu, "_is_amx_tile_supported"):
        torch._C._cpu._is_amx_tile_supported = lambda: False
except Exception:
    pass

try:
    from transformers import AutoConfig

    _register = AutoConfig.register

    def _register_again(model_type, config, exist_ok=False):
        return _register(model_type, config, exist_ok=True)

    AutoConfig.register = staticmethod(_register_again)
except Exception:
    pass
'''


def cache_root() -> Path:
    return Path(os.environ.get("KVSPEC_SGLANG_CACHE", Path.home() / ".cache" / "kvspec" / "sglang"))


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, check=False)


def releases() -> list[str]:
    """The newest final or post release of every 0.5.x on the index, oldest first (pre-releases left out)."""
    out = pip("index", "versions", PACKAGE).stdout
    line = next((ln for ln in out.splitlines() if ln.startswith("Available versions:")), "")
    newest: dict[tuple[int, ...], Version] = {}
    for text in line.partition(":")[2].split(","):
        try:
            version = Version(text.strip())
        except InvalidVersion:
            continue
        if version >= OLDEST and not version.is_prerelease:
            newest[version.release] = max(newest.get(version.release, version), version)
    return [str(v) for v in sorted(newest.values())]


def shims_folder() -> Path:
    """The stand-ins for older releases (sgl_kernel shell, sitecustomize), written once."""
    folder = cache_root() / "shims"
    (folder / "sgl_kernel").mkdir(parents=True, exist_ok=True)
    spec = importlib.util.find_spec("sgl_kernel")
    real = str(Path(spec.origin).parent) if spec is not None and spec.origin else str(folder / "sgl_kernel")
    (folder / "sgl_kernel" / "__init__.py").write_text(KERNEL_SHELL.format(real=real))
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return folder


@dataclass
class Install:
    """One release, ready to import: PYTHONPATH entries, or the reason it cannot be."""

    version: str
    paths: list[str] = field(default_factory=list)
    skipped: str = ""


def run_env(paths: list[str], kvspec_path: str | None) -> dict[str, str]:
    """The environment of a run: the release's folders on PYTHONPATH, the Hugging Face hub offline (0.5.14-0.5.17
    validate ServerArgs by fetching the config of a model that does not exist; online that is ~25 s of retries),
    Triton's interpreter on (the adapter replaces the one kernel it calls by SGLang's torch twin where a release
    has one; before 0.5.9 the kernel itself runs, interpreted; no other kernel is called on CPU)."""
    env = dict(os.environ)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRITON_INTERPRET", "1")  # before 0.5.9 alloc_extend is a Triton kernel only: run it on CPU
    env["PYTHONPATH"] = os.pathsep.join([*([kvspec_path] if kvspec_path else []), *paths])
    return env


def probe(paths: list[str], kvspec_path: str | None) -> subprocess.CompletedProcess[str]:
    env = run_env(paths, kvspec_path)
    return subprocess.run(
        [sys.executable, "-W", "ignore", "-c", PROBE],
        capture_output=True,
        text=True,
        env=env,
        cwd=tempfile.gettempdir(),
        check=False,
    )


def install(version: str, kvspec_path: str | None, current: str) -> Install:
    """Install ``version`` (no deps) into its cache folder and probe that the adapter loads it."""
    result = Install(version)
    if version != current:
        home = cache_root() / version
        site = home / "site"
        if not (home / ".installed").exists():
            done = pip("install", "-q", "--no-deps", "--no-compile", "--target", str(site), f"{PACKAGE}=={version}")
            if done.returncode != 0:
                result.skipped = f"pip install failed: {done.stderr.strip().splitlines()[-1:]}"
                return result
            (home / ".installed").touch()
        result.paths = [str(site), str(shims_folder())]
    run = probe(result.paths, kvspec_path)
    marker = next((ln for ln in run.stdout.splitlines() if ln.startswith("KVSPEC_PROBE")), "")
    if not marker:
        tail = (run.stderr.strip().splitlines() or ["no output"])[-1]
        result.skipped = f"cannot load the adapter's modules: {tail[:200]}"
    elif result.paths and not marker.split()[1].startswith(result.paths[0]):
        result.skipped = f"imported sglang from {marker.split()[1]}, not from the release's folder"
    return result


@dataclass
class Row:
    release: str
    verdict: str  # passed | violated | error | skipped
    steps: int = 0
    examples: int = 0
    seconds: float = 0.0
    violated: list[str] = field(default_factory=list)
    case: list[dict[str, Any]] = field(default_factory=list)
    case_config: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    note: str = ""


def check(inst: Install, args: argparse.Namespace, workdir: Path) -> Row:
    """One `kvspec check` run in a subprocess; the report and the shrunk case are read back."""
    report, cases = workdir / f"{inst.version}.json", workdir / f"cases-{inst.version}"
    cmd = [sys.executable, "-W", "ignore", "-m", "kvspec.cli", "check", "--adapter", "sglang"]
    cmd += ["--profile", args.profile, "--seed", str(args.seed), "--report", str(report), "--cases-dir", str(cases)]
    # --step-timeout also lifts the constructor's limit (importing SGLang: ~20 s idle, >120 s on loaded cores).
    cmd += ["--quiet", "--step-timeout", str(args.step_timeout)]
    cmd += ["--max-examples", str(args.max_examples)] if args.max_examples else []
    env = run_env(inst.paths, args.kvspec_path)
    t0 = time.perf_counter()
    try:
        run = subprocess.run(
            cmd, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir(), timeout=args.timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return Row(inst.version, "error", seconds=round(time.perf_counter() - t0, 1), note="timed out")
    row = Row(inst.version, "error", seconds=round(time.perf_counter() - t0, 1))
    if not report.exists():
        row.note = (run.stderr.strip().splitlines() or [f"exit {run.returncode}"])[-1][:200]
        return row
    data = json.loads(report.read_text())
    row.verdict, row.steps, row.examples = data["status"], data["steps"], data["examples"]
    row.violated = [inv["name"] for inv in data["invariants"] if inv["verdict"] == "violated"]
    if data.get("error"):
        row.note = data["error"][:200]
    for path in data.get("cases", [])[:1]:
        case = json.loads(Path(path).read_text())
        row.case, row.case_config = case["ops"], case["config"]
        row.problems = list(case.get("expected", {}).get("problems", []))[:3]
    return row


def render_op(op: dict[str, Any]) -> str:
    args = [repr(op["req"])] if "req" in op else []
    if "tokens" in op:
        args.append(f"{op['tokens']}")
    if op.get("keep") is False:
        args.append("keep=False")
    return f"{op['op']}({', '.join(args)})"


def header(meta: dict[str, Any]) -> str:
    n = meta["max_examples"]
    versions = f" --versions {meta['versions']}" if meta.get("versions") else ""
    return (
        f"Generated {meta['started_at']} by `python benchmarks/sglang_matrix.py"
        f"{f' --max-examples {n}' if n else ''}{versions}`: profile `{meta['profile']}`, seed {meta['seed']}, "
        f"Python {meta['python']}, dependencies of the sglang {meta['runtime']} venv (requirements/sglang.txt)."
    )


def table(rows: list[Row]) -> str:
    lines = [
        "| release | verdict | steps | examples | s | violated | shrunk case |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        case = ""
        if r.case:
            pool = f"pool {r.case_config.get('capacity')}x{r.case_config.get('block_size')}: "
            case = pool + "; ".join(render_op(op) for op in r.case)
        note = f" ({r.note})" if r.note else ""
        lines.append(
            f"| {r.release} | {r.verdict}{note} | {r.steps} | {r.examples} | {r.seconds:.0f} | "
            f"{', '.join(r.violated)} | {case} |"
        )
    return "\n".join(lines)


def write_doc(text: str) -> None:
    doc = DOC.read_text() if DOC.exists() else f"# SGLang release matrix\n\n{BEGIN}\n{END}\n"
    if BEGIN not in doc or END not in doc:
        doc += f"\n{BEGIN}\n{END}\n"
    head, _, rest = doc.partition(BEGIN)
    _, _, tail = rest.partition(END)
    DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shard", type=shard.argument, default=None, metavar="I/N", help=shard.HELP)
    parser.add_argument("--versions", default="", help="comma-separated releases (default: newest of every 0.5.x)")
    parser.add_argument("--profile", default="ci", choices=("ci", "thorough"))
    parser.add_argument("--max-examples", type=int, default=None, help="override the profile's examples per run")
    parser.add_argument("--seed", type=int, default=0, help="Hypothesis seed (the thorough profile is random)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per check run")
    parser.add_argument("--step-timeout", type=float, default=600.0, help="seconds per adapter call and start")
    parser.add_argument("--kvspec-path", default=None, help="prepend this folder to PYTHONPATH (a kvspec build)")
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "sglang-matrix.json")
    parser.add_argument("--no-write", action="store_true", help="print the table, leave docs/ alone")
    parser.add_argument("--merge", action="store_true", help="keep the JSON's rows of releases not run now")
    args = parser.parse_args()

    versions = [v.strip() for v in args.versions.split(",") if v.strip()] or releases()
    if not versions:
        print("no releases found (is the package index reachable?)", file=sys.stderr)
        return 2
    versions = shard.take(versions, args.shard)  # with --merge, shards run one after another fill one --json
    current = probe([], args.kvspec_path).stdout.split()
    current_version = current[current.index("KVSPEC_PROBE") + 2] if "KVSPEC_PROBE" in current else ""
    rows: list[Row] = []
    installs: dict[str, Install] = {}
    meta: dict[str, Any] = {
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "profile": args.profile,
        "max_examples": args.max_examples,
        "versions": args.versions,
        "seed": args.seed,
        "python": sys.version.split()[0],
        "runtime": current_version,
    }

    earlier: list[Row] = []
    if args.merge and args.json.exists():  # rows of an earlier run stay, but for the releases run again now
        old = json.loads(args.json.read_text())
        earlier = [Row(**r) for r in old["rows"] if r["release"] not in versions]
        meta["versions"] = ",".join([*(r.release for r in earlier), *versions])

    def save() -> None:
        """Write what has run so far (a long matrix that is stopped keeps its finished rows)."""
        everything = sorted([*earlier, *rows], key=lambda r: Version(r.release), reverse=True)
        meta["installs"] = {v: asdict(i) for v, i in installs.items()}
        meta["rows"] = [asdict(r) for r in everything]
        if not args.no_write:
            write_doc(f"{header(meta)}\n\n{table(everything)}")
            args.json.write_text(json.dumps(meta, indent=1) + "\n")

    with tempfile.TemporaryDirectory(prefix="kvspec-sglang-matrix-") as tmp:
        for version in versions:
            inst = install(version, args.kvspec_path, current_version)
            installs[version] = inst
            if inst.skipped:
                rows.append(Row(version, "skipped", note=inst.skipped))
                print(f"{version}: skipped: {inst.skipped}", flush=True)
            else:
                row = check(inst, args, Path(tmp))
                rows.append(row)
                print(f"{version}: {row.verdict} {row.steps} steps {row.seconds:.0f} s {row.violated} {row.note}")
            save()
    print(table(rows))
    return 0 if all(r.verdict in ("passed", "skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
