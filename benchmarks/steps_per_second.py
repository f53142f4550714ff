"""Checked steps per second against each reference adapter, and time to the first counterexample.

Prints two tables:
1. For each bundled adapter: steps/s of the full check (Hypothesis + spec prediction
   + every invariant), steps/s of the bare adapter replaying the same ops with no
   checking (the peer, measured in the same run), and the ratio between them.
2. For each seeded bug of tests/seeded_bugs.py: examples and seconds until the
   first counterexample, total seconds including shrinking, and the shrunk length.

Usage: python benchmarks/steps_per_second.py [--examples N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from seeded_bugs import SEEDED_BUGS  # noqa: E402
from swarm import Recorder  # noqa: E402
from swarm import bare_rate as bare_replay_rate  # noqa: E402

from kvspec.adapters import load  # noqa: E402
from kvspec.stateful_tests import PROFILES, Options, Tally, run_check  # noqa: E402

ADAPTERS = ("reference", "lifecycle-sim", "scheduler-sim")


def adapter_rates(examples: int) -> list[dict[str, Any]]:
    import kvspec.stateful_tests.machine as machine_module

    rows = []
    for name in ADAPTERS:
        Recorder.log = []
        original = machine_module.Harness
        machine_module.Harness = Recorder  # type: ignore[misc]
        try:
            with TemporaryDirectory() as tmp:
                result = run_check(
                    load(name), name, Options(profile=PROFILES["ci"], max_examples=examples, cases_dir=Path(tmp))
                )
        finally:
            machine_module.Harness = original  # type: ignore[misc]
        assert result.status == "passed", result.status
        checked_rate = result.tally.steps / result.duration_s
        bare_rate, _ = bare_replay_rate(name, Recorder.log)
        rows.append(
            {
                "adapter": name,
                "examples": result.tally.examples,
                "checked_steps": result.tally.steps,
                "checked_steps_per_s": round(checked_rate),
                "bare_steps_per_s": round(bare_rate),
                "overhead_ratio": round(bare_rate / checked_rate, 1),
            }
        )
    return rows


def bug_times() -> list[dict[str, Any]]:
    rows = []
    for bug in SEEDED_BUGS:
        refine = bug.invariant.startswith("predicted_")
        with TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            tally_probe: dict[str, float] = {}

            def progress(tally: Tally, probe: dict[str, float] = tally_probe, start: float = t0) -> None:
                if tally.first_failure_at is not None and "first_s" not in probe:
                    probe["first_s"] = time.perf_counter() - start

            result = run_check(
                bug.factory,
                bug.name,
                Options(profile=PROFILES["ci"], cases_dir=Path(tmp), refine=refine),
                progress=progress,
            )
            total = time.perf_counter() - t0
        first = result.tally.first_failure_at
        rows.append(
            {
                "bug": bug.name,
                "invariant": bug.invariant,
                "found": bool(result.failure and bug.invariant in result.failure.failures)
                or any(r["name"] == bug.invariant and r["verdict"] == "violated" for r in result.report().verdicts()),
                "examples_to_first": first[0] if first else None,
                "steps_to_first": first[1] if first else None,
                "seconds_to_first": round(tally_probe.get("first_s", total), 2),
                "seconds_with_shrink": round(total, 2),
                "shrunk_ops": len(result.failure_ops),
            }
        )
    return rows


def show(rows: list[dict[str, Any]]) -> None:
    keys = list(rows[0])
    widths = [max(len(k), *(len(str(r[k])) for r in rows)) for k in keys]
    print("  ".join(k.ljust(w) for k, w in zip(keys, widths, strict=True)))
    for r in rows:
        print("  ".join(str(r[k]).ljust(w) for k, w in zip(keys, widths, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rates = adapter_rates(args.examples)
    show(rates)
    print()
    bugs = bug_times()
    show(bugs)
    if args.json:
        args.json.write_text(json.dumps({"adapters": rates, "seeded_bugs": bugs}, indent=2) + "\n")


if __name__ == "__main__":
    main()
