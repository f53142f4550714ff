"""``kvspec check --workers N``: checked steps/s and time to the first counterexample, 1 against 2 workers.

Two tables, each run through ``stateful_tests.workers.run_workers`` (what ``--workers`` runs):
1. The reference adapter, each engine, 1 and 2 workers, the same number of examples per
   worker (so two workers do twice the work): checked steps in all, wall seconds from the
   start to the merged report (forks included), checked steps/s (median of 5 runs, 1 and 2
   workers alternating, and its range), the speed-up over one worker, and the CPU seconds the
   run took (this process and every child it waited for: workers and their adapters) with the
   checked steps per CPU second, which the load of other processes does not move.
2. A few seeded bugs of tests/seeded_bugs.py (the seeded-bug test's modes: refinement bugs
   with refinement on), each engine, 1 and 2 workers, several seeds: seconds to the first
   counterexample (the earliest worker's, from its own start: the report's
   ``seconds_to_first_failure``), wall seconds to the merged report (shrinking or
   minimising included), and whether the bug's invariant was named.

The machine is shared (two cores, other engineers' tests): every row records the load
average (1 min) before and after it, and the JSON's meta the CPU count; read the ratios.

Writes JSON and a markdown table. ``--quick`` (CI, ~40 s on the loaded two cores): 20 examples,
one bug that shrinks fast, one seed; the full run: 200 examples, six bugs, seeds 1-3.

Usage: python benchmarks/workers.py [--quick] [--json OUT] [--markdown OUT]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from seeded_bugs import SEEDED_BUGS  # noqa: E402
from test_seeded_bugs import refines  # noqa: E402

from kvspec import jsonio  # noqa: E402
from kvspec.adapters import load  # noqa: E402
from kvspec.stateful_tests import Options  # noqa: E402
from kvspec.stateful_tests.workers import run_workers  # noqa: E402

ENGINES = ("hypothesis", "swarm")
WORKERS = (1, 2)
QUICK_BUGS = ("floor-rounding",)
BUGS = (
    "forget-decrement",
    "double-decrement",
    "leak-on-refusal",
    "short-chain",
    "eager-reclaim",
    "lru-most-recent-first",
)


def _cpu() -> float:
    """CPU seconds of this process and of every child it has waited for (workers, and adapters they waited for)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def throughput_rows(examples: int, repeats: int) -> list[dict[str, Any]]:
    """Table 1: the reference adapter, each engine and worker count, ``examples`` per worker, seed 1; ``repeats``
    runs of each, 1 and 2 workers alternating (the load moves), the median rate reported."""
    factory = load("reference")
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for engine in ENGINES:
        for _ in range(repeats):
            for workers in WORKERS:
                with TemporaryDirectory() as tmp:
                    options = Options(
                        seed=1, max_examples=examples, scenarios=False, cases_dir=Path(tmp), engine=engine
                    )
                    before = _load()
                    cpu0 = _cpu()
                    t0 = time.perf_counter()
                    report = run_workers(factory, "reference", options, workers)
                    wall = time.perf_counter() - t0
                    cpu = _cpu() - cpu0
                assert report.status == "passed", report.error or report.status
                runs.setdefault((engine, workers), []).append(
                    {
                        "steps": report.steps,
                        "examples": report.examples,
                        "wall": wall,
                        "cpu": cpu,
                        "load": [before, _load()],
                    }
                )
    rows = []
    for (engine, workers), done in runs.items():
        rates = [run["steps"] / run["wall"] for run in done]
        per_cpu = [run["steps"] / run["cpu"] for run in done]
        loads = [load for run in done for load in run["load"]]
        rows.append(
            {
                "engine": engine,
                "workers": workers,
                "examples": done[0]["examples"],
                "steps": done[0]["steps"],
                "repeats": len(done),
                "wall_s": round(statistics.median(run["wall"] for run in done), 3),
                "steps_per_s": round(statistics.median(rates), 1),
                "steps_per_s_range": [round(min(rates), 1), round(max(rates), 1)],
                "cpu_s": round(statistics.median(run["cpu"] for run in done), 3),
                "steps_per_cpu_s": round(statistics.median(per_cpu), 1),
                "load": [round(min(loads), 2), round(max(loads), 2)],
            }
        )
        print(f"reference {engine} x{workers}: {rows[-1]}", file=sys.stderr)
    for row in rows:
        one = next(r for r in rows if r["engine"] == row["engine"] and r["workers"] == 1)
        row["speedup"] = round(row["steps_per_s"] / one["steps_per_s"], 2)
    return rows


def bug_rows(names: tuple[str, ...], seeds: tuple[int, ...]) -> list[dict[str, Any]]:
    """Table 2: each bug, engine and worker count, over ``seeds``: medians of first-failure and wall seconds."""
    rows = []
    for bug in (b for b in SEEDED_BUGS if b.name in names):
        for engine in ENGINES:
            for workers in WORKERS:
                first: list[float] = []
                wall: list[float] = []
                named: list[bool] = []
                loads: list[float] = []
                for seed in seeds:
                    with TemporaryDirectory() as tmp:
                        options = Options(
                            seed=seed,
                            scenarios=False,
                            cases_dir=Path(tmp),
                            engine=engine,
                            refine=refines(bug),
                            keep_going=engine == "swarm",
                        )
                        loads.append(_load())
                        t0 = time.perf_counter()
                        report = run_workers(bug.factory, bug.name, options, workers)
                        wall.append(time.perf_counter() - t0)
                    seconds = report.sections.get("seconds_to_first_failure")
                    if seconds is not None:
                        first.append(seconds)
                    named.append(report.verdict(bug.invariant) == "violated")
                loads.append(_load())
                rows.append(
                    {
                        "bug": bug.name,
                        "invariant": bug.invariant,
                        "engine": engine,
                        "workers": workers,
                        "seeds": list(seeds),
                        "found": sum(named),
                        "first_failure_s": round(statistics.median(first), 3) if first else None,
                        "wall_s": round(statistics.median(wall), 2),
                        "load": [min(loads), max(loads)],
                    }
                )
                print(f"{bug.name} {engine} x{workers}: {rows[-1]}", file=sys.stderr)
    return rows


def markdown(data: dict[str, Any]) -> str:
    meta = data["meta"]
    lines = [
        "# 1 against 2 workers (`kvspec check --workers N`)",
        "",
        f"`{meta['command']}` on {meta['machine']}; load average (1 min) {meta['load_start']} at the start, "
        f"{meta['load_end']} at the end. The machine's two cores are shared with other engineers' runs: "
        "absolute rates move with the load (each row records it); read the ratios.",
        "",
        f"Reference adapter, {data['examples']} examples of the ci profile per worker, seed 1 "
        "(worker 1 runs the derived seed; docs/workers.md):",
        "",
        "| engine | workers | examples | checked steps | runs | wall s (median) | checked steps/s (median) | range "
        "| speed-up | CPU s (median) | checked steps per CPU s | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["throughput"]:
        low, high = r["steps_per_s_range"]
        lines.append(
            f"| {r['engine']} | {r['workers']} | {r['examples']} | {r['steps']} | {r['repeats']} | {r['wall_s']} | "
            f"{r['steps_per_s']} | {low}-{high} | {r['speedup']}x | {r['cpu_s']} | {r['steps_per_cpu_s']} | "
            f"{r['load'][0]}-{r['load'][1]} |"
        )
    lines += [
        "",
        "Seeded bugs (medians over the seeds; first failure: the earliest worker's seconds from its own start; wall: "
        "to the merged report, shrinking or minimising included):",
        "",
        "| bug | invariant | engine | workers | found | first failure s | wall s | load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in data["seeded_bugs"]:
        lines.append(
            f"| {r['bug']} | {r['invariant']} | {r['engine']} | {r['workers']} | {r['found']}/{len(r['seeds'])} | "
            f"{r['first_failure_s']} | {r['wall_s']} | {r['load'][0]}-{r['load'][1]} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI: 20 examples, one bug, one seed")
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "benchmarks" / "workers.json")
    parser.add_argument("--markdown", type=Path, default=ROOT / "docs" / "benchmarks" / "workers.md")
    args = parser.parse_args(argv)
    examples = 20 if args.quick else 200
    start = _load()
    data: dict[str, Any] = {"kvspec_bench_workers": 1, "quick": args.quick, "examples": examples}
    data["throughput"] = throughput_rows(examples, 1 if args.quick else 5)
    data["seeded_bugs"] = bug_rows(QUICK_BUGS if args.quick else BUGS, (1,) if args.quick else (1, 2, 3))
    data["meta"] = {
        "command": " ".join(["python benchmarks/workers.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}",
        "load_start": start,
        "load_end": _load(),
        "note": "shared machine: other processes ran beside this benchmark; each row records the load average",
    }
    jsonio.write(args.json, data)
    jsonio.write_text(args.markdown, markdown(data))
    print(f"wrote {args.json} and {args.markdown}")
    missed = [
        f"{r['bug']} ({r['engine']}, {r['workers']} workers)"
        for r in data["seeded_bugs"]
        if r["found"] < len(r["seeds"])
    ]
    if missed:
        print(f"not found on every seed: {', '.join(missed)}", file=sys.stderr)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
