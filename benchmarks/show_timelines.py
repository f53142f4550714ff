"""Draw docs/show/: a timeline of each seeded-bug class and of a failing trace of each format, and time the drawing.

    python benchmarks/show_timelines.py [OUT_DIR]     # default docs/show; needs the show extra (matplotlib)

For each seeded bug below (tests/seeded_bugs.py, one per class of bug), a shrunk counterexample is found with
the suite (``check_adapter``, profile ci, seed 0) unless tests/data/show/ holds one, then replayed on the spec and
the buggy adapter and drawn (``kvspec.show.picture``). For each trace, a real fixture is corrupted as the trace
tests corrupt theirs and checked and drawn as ``kvspec trace check --html`` draws it. Prints one line per picture:
the seconds to replay (or check), to build the figure, to write the PNG and the SVG, and the SVG's size; matplotlib
is imported before the first timing.
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import matplotlib  # noqa: E402,F401  (imported before timing: the first import costs about 2 s)
from seeded_bugs import by_name  # noqa: E402

from kvspec.case import Case  # noqa: E402
from kvspec.show import draw, replay, timelines  # noqa: E402
from kvspec.show import trace_run as shown_trace  # noqa: E402
from kvspec.stateful_tests import Options, check_adapter  # noqa: E402

# One bug per class of what a timeline shows (docs/show.md, the closing note of issue 19).
BUGS = (
    ("forget-decrement", "a ref count that a release forgets: one cell's ref count differs from the spec's"),
    ("leak-on-refusal", "references leaked by a refused admit"),
    ("lost-on-reclaim", "capacity lost on a reclaim: the free row differs"),
    ("most-recent-evicted", "the wrong eviction order: a different block hatched"),
    ("lifecycle-evicts-active", "a record evicted while read (record granularity)"),
    ("scheduler-stale-blind", "an entry scheduler's stale ranking (entry granularity)"),
    ("raises-on-resume", "an adapter that raises: no answer after the step"),
)


def case_of(name: str, folder: Path) -> Case:
    """The committed counterexample of ``name``, else one the suite finds and shrinks now."""
    saved = ROOT / "tests" / "data" / "show" / f"{name}.json"
    if saved.exists():
        return Case.load(saved)
    options = Options(profile="ci", seed=0, max_examples=300, cases_dir=folder, quiet=True)
    report = check_adapter(by_name(name).factory, name, options)
    if not report.cases:
        raise SystemExit(f"{name}: the suite found no counterexample ({report.status})")
    return Case.load(Path(report.cases[0]))


def timed(out: Path, name: str, prepare: float, pic: object) -> None:
    t = time.perf_counter()
    png = pic.png()  # type: ignore[attr-defined]
    t_png = time.perf_counter() - t
    t = time.perf_counter()
    svg = pic.svg()  # type: ignore[attr-defined]
    t_svg = time.perf_counter() - t
    (out / f"{name}.png").write_bytes(png)
    print(f"{name:<28} {prepare:7.2f} {t_png:7.2f} {t_svg:7.2f} {len(svg) / 1024:8.0f} KB")


def bugs(out: Path, folder: Path) -> None:
    for name, _ in BUGS:
        case = case_of(name, folder)
        t = time.perf_counter()
        runs = replay(case, by_name(name).factory)
        grids = timelines(runs)
        pic = draw(grids, case.ops, title=f"{name}: {len(case.ops)} ops")
        timed(out, name, time.perf_counter() - t, pic)


def _kvfabric_evicts_referenced(folder: Path) -> Path:
    lines = [json.loads(s) for s in (ROOT / "tests/data/kvfabric/real_2b_cache_pressure_lru_head.jsonl").open()]
    i = next(i for i, line in enumerate(lines) if line["event"] == "block_sealed")
    evict = {**lines[i], "event": "block_evicted", "state": "EVICTED"}  # evicted while its request still holds it
    lines.insert(i + 1, evict)
    for k, line in enumerate(lines):
        line["seq"] = k + 1
    path = folder / "kvfabric-evicts-referenced.jsonl"
    path.write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in lines))
    return path


def _vllm_removes_uncached(folder: Path) -> Path:
    records = [json.loads(s) for s in (ROOT / "tests/data/vllm_live_cpu.jsonl").open()]
    removed = {
        h for r in records for e in r.get("events", ()) if e["type"] == "BlockRemoved" for h in e["block_hashes"]
    }
    records = copy.deepcopy(records)
    record = next(r for r in records if any(set(e.get("block_hashes", ())) & removed for e in r.get("events", ())))
    record["events"] = [
        e for e in record["events"] if not (e["type"] == "BlockStored" and set(e["block_hashes"]) & removed)
    ]
    path = folder / "vllm-events-removes-uncached.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def traces(out: Path, folder: Path) -> None:
    for path in (_kvfabric_evicts_referenced(folder), _vllm_removes_uncached(folder)):
        t = time.perf_counter()
        traced = shown_trace.check(path, "auto")
        pic = shown_trace.picture(traced)[0]
        timed(out, f"trace-{path.stem}", time.perf_counter() - t, pic)
    for path in (ROOT / "tests/data/vllm_live_cpu.jsonl", ROOT / "tests/data/traces/vllm_inprocess_side_table.jsonl"):
        t = time.perf_counter()
        traced = shown_trace.check(path, "auto")
        page = shown_trace.shown(traced, prefix="c0")
        print(f"page of {path.name:<40} {time.perf_counter() - t:7.2f} s (check, window and overview as SVG)")
        assert page.svg and page.overview


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"{'picture':<28} {'replay':>7} {'png':>7} {'svg':>7} {'svg size':>11}   (seconds; replay includes the figure)"
    )
    with tempfile.TemporaryDirectory() as folder:
        bugs(out, Path(folder))
        traces(out, Path(folder))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "show")
