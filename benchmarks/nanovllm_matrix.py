"""Revision matrix: `kvspec check --adapter nano-vllm` against upstream nano-vllm revisions and the PyPI fork.

Upstream's allocator (``nanovllm/engine``) is read from a local git mirror of GeeeekExplorer/nano-vllm
(fetched outside this clone; none of its code is committed here): each revision that changed
``block_manager.py`` or ``sequence.py`` is exported with ``git archive`` into
``$KVSPEC_NANOVLLM_CACHE/<commit>/`` (default ``~/.cache/kvspec/nanovllm``) and checked with that folder
first on PYTHONPATH. The package's ``__init__`` is never run (the adapter imports the engine modules
alone), so only xxhash and numpy are needed. The PyPI fork is the one installed in this interpreter.

Each run is ``python -m kvspec.cli check --adapter nano-vllm --profile ci --keep-going``: every distinct
violated invariant, each with its shrunk case. The table goes into docs/nanovllm-matrix.md between the
markers, the raw rows into docs/nanovllm-matrix.json.

Usage (from the repository root):

    python benchmarks/nanovllm_matrix.py --mirror /path/to/nano-vllm.git
    python benchmarks/nanovllm_matrix.py --mirror /path/to/nano-vllm.git --revisions 9fa256a --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from kvspec.bench import shard

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "nanovllm-matrix.md"
BEGIN, END = "<!-- matrix:begin -->", "<!-- matrix:end -->"
FILES = ("nanovllm/engine/block_manager.py", "nanovllm/engine/sequence.py")


def git(mirror: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(mirror), *args], check=True, capture_output=True, text=True).stdout


def revisions(mirror: Path) -> list[tuple[str, str, str]]:
    """(short commit, date, subject) of every revision that changed the allocator, oldest first."""
    log = git(mirror, "log", "--reverse", "--format=%h\t%ad\t%s", "--date=short", "HEAD", "--", *FILES)
    return [tuple(line.split("\t", 2)) for line in log.splitlines()]  # type: ignore[misc]


def export(mirror: Path, commit: str, cache: Path) -> Path:
    """The revision's ``nanovllm`` package, exported once into the cache."""
    target = cache / commit
    if not (target / "nanovllm").is_dir():
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(
            ["git", "--git-dir", str(mirror), "archive", commit, "nanovllm"], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def check(path: Path | None) -> dict[str, Any]:
    """One keep-going ci run on the allocator under ``path`` (None: the installed PyPI fork)."""
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        run = subprocess.run(
            [
                *(sys.executable, "-m", "kvspec.cli", "check", "--adapter", "nano-vllm", "--profile", "ci"),
                *("--keep-going", "--quiet", "--cases-dir", str(Path(tmp) / "cases"), "--report", str(report)),
            ],
            env=env,
            capture_output=True,
            text=True,
        )
        if not report.exists():
            return {"exit": run.returncode, "error": (run.stderr.strip().splitlines() or [""])[-1]}
        data = json.loads(report.read_text())
        if data["status"] == "error":
            return {"exit": run.returncode, "error": data["error"]}
        cases = []
        for case_path in data["cases"]:
            case = json.loads(Path(case_path).read_text())
            ops = [
                f"{o['op']}({o.get('req', '')}{', ' + str(o['tokens']) if 'tokens' in o else ''})" for o in case["ops"]
            ]
            cases.append({"invariant": case["expected"]["invariant"], "config": case["config"], "ops": ops})
        return {
            "exit": run.returncode,
            "version": data["adapter_version"],
            "steps": data["steps"],
            "examples": data["examples"],
            "violated": [r["name"] for r in data["invariants"] if r["verdict"] == "violated"],
            "cases": cases,
        }


CASES = ROOT / "tests" / "data" / "nanovllm"


def replays(path: Path | None) -> dict[str, str]:
    """Each documented case (tests/data/nanovllm) replayed on the allocator: the invariant it breaks, or held."""
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    out = {}
    for case in sorted(CASES.glob("*.json")):
        run = subprocess.run(
            [sys.executable, "-m", "kvspec.cli", "replay", str(case), "--adapter", "nano-vllm"],
            env=env,
            capture_output=True,
            text=True,
        )
        named = [line.split()[1] for line in run.stdout.splitlines() if line.startswith("VIOLATED ")]
        out[case.stem] = named[0] if run.returncode == 1 and named else {0: "held"}.get(run.returncode, "error")
    return out


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| revision | date | API | verdict | first-named invariants (one shrunk case each) | steps |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        result = row["result"]
        if "version" not in result:
            lines.append(f"| {row['revision']} | {row['date']} | - | could not run: {result.get('error')} | | |")
            continue
        api = result["version"].rsplit("API generation ", 1)[-1].rstrip(")")
        named = ", ".join(f"`{c['invariant']}`" for c in result["cases"]) or "-"
        verdict = "passed" if result["exit"] == 0 else "violated"
        lines.append(f"| {row['revision']} | {row['date']} | {api} | {verdict} | {named} | {result['steps']} |")
    return "\n".join(lines)


def replay_table(rows: list[dict[str, Any]]) -> str:
    """Which revisions each documented case reproduces on (the invariant it breaks there)."""
    names = sorted({name for row in rows for name in row.get("replays", {})})
    lines = ["| revision | " + " | ".join(f"`{n}`" for n in names) + " |", "|---" * (len(names) + 1) + "|"]
    for row in rows:
        cells = [row.get("replays", {}).get(n, "-") for n in names]
        lines.append(
            f"| {row['revision']} | " + " | ".join("held" if c == "held" else f"**{c}**" for c in cells) + " |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shard", type=shard.argument, default=None, metavar="I/N", help=shard.HELP)
    parser.add_argument("--mirror", type=Path, required=True, help="a git dir of GeeeekExplorer/nano-vllm")
    parser.add_argument("--revisions", default="", help="comma-separated commits (default: every allocator change)")
    parser.add_argument("--no-write", action="store_true", help="print the table, write nothing")
    args = parser.parse_args()
    cache = Path(os.environ.get("KVSPEC_NANOVLLM_CACHE", Path.home() / ".cache" / "kvspec" / "nanovllm"))
    known = revisions(args.mirror)
    wanted = shard.take([r for r in known if not args.revisions or r[0] in args.revisions.split(",")], args.shard)
    rows = []
    for commit, date, subject in wanted:
        tree = export(args.mirror, commit, cache)
        rows.append(
            {"revision": commit, "date": date, "subject": subject, "result": check(tree), "replays": replays(tree)}
        )
        print(commit, rows[-1]["result"].get("violated"), file=sys.stderr)
    pypi = {
        "revision": "PyPI nano-vllm-fork",
        "date": "-",
        "subject": "",
        "result": check(None),
        "replays": replays(None),
    }
    if args.shard is None or args.shard[0] == 1:  # the PyPI row is the first shard's
        rows.append(pypi)
    text = table(rows) + "\n\n" + replay_table(rows)
    print(text)
    if args.shard is not None and not args.no_write:  # the doc needs every shard's rows: this shard's JSON only
        i, n = args.shard
        DOC.with_suffix(f".shard-{i}-of-{n}.json").write_text(json.dumps(rows, indent=1) + "\n")
    elif not args.no_write:
        (DOC.with_suffix(".json")).write_text(json.dumps(rows, indent=1) + "\n")
        doc = DOC.read_text()
        head, rest = doc.split(BEGIN, 1)
        DOC.write_text(head + BEGIN + "\n" + text + "\n" + END + rest.split(END, 1)[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
