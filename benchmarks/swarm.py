"""The swarm explorer against the Hypothesis engine: steps/s, abstract states per minute, time to a counterexample.

Two tables:
1. Per bundled adapter, each engine with the same number of examples (walks) of the ci
   profile: checked steps/s, the bare adapter's steps/s replaying the very same ops with
   no checking (in this process, as benchmarks/steps_per_second.py measures it), the share
   of it the check keeps, and the distinct abstract states reached
   (``harness.abstract_state``) in all and per minute.
2. Per seeded bug of tests/seeded_bugs.py (the seeded-bug test's profile and modes), each
   engine: examples and seconds to the first counterexample, seconds including shrinking
   or minimising, the reported length, and whether the bug's invariant was named.

Table 1 also measures the swarm on the reference adapter (which reports deltas) at each
``--full-check-every`` K (default 64 and 256), isolated and in-process: the whole state is judged
every K steps and the part each step changed between (docs/incremental.md).

Writes JSON and a markdown table. ``--quick`` (CI): 20 examples per adapter and two bugs; the full run takes
about 15 minutes on two loaded cores, most of it the Hypothesis engine's shrinking.

Usage: python benchmarks/swarm.py [--quick] [--examples N] [--full-check-every K ...] [--json OUT] [--markdown OUT]
"""

from __future__ import annotations

import argparse
import platform
import resource
import sys
import time
from collections.abc import Callable, Hashable
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any, ClassVar

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from seeded_bugs import SEEDED_BUGS  # noqa: E402
from test_seeded_bugs import SEEDED_PROFILE, refines  # noqa: E402

import kvspec.stateful_tests.machine as machine_module  # noqa: E402
import kvspec.stateful_tests.swarm as swarm_module  # noqa: E402
from kvspec import jsonio  # noqa: E402
from kvspec.adapters import load  # noqa: E402
from kvspec.report import ExitCode  # noqa: E402
from kvspec.spec import Op, SpecError  # noqa: E402
from kvspec.spec.ledger import validate  # noqa: E402
from kvspec.stateful_tests import PROFILES, Harness, Options, Result, run_check  # noqa: E402
from kvspec.stateful_tests.swarm import run_swarm  # noqa: E402

ADAPTERS = ("reference", "lifecycle-sim", "scheduler-sim")
QUICK_BUGS = ("no-eviction-on-admit", "scheduler-frees-incoming-size")
QUICK_EXAMPLES = 20
ENGINES: dict[str, Callable[..., Result]] = {"hypothesis": run_check, "swarm": run_swarm}
DELTA_ADAPTER = "reference"
"""The bundled adapter that reports deltas: the one measured at each ``--full-check-every`` K."""
FULL_CHECK_EVERY = (64, 256)
IN_PROCESS = "swarm, in-process"
"""The swarm with the adapter in the kit's process (``isolate=False``): what the child process's pipe costs."""


class Recorder(Harness):
    """A harness that also records every example's ops, for the bare replay."""

    log: ClassVar[list[tuple[Any, list[Op]]]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        Recorder.log.append((self.config, self.ops))


def bare_rate(name: str, log: list[tuple[Any, list[Op]]]) -> tuple[float, float]:
    """Steps/s of the adapter alone (apply, events, observe) on the recorded ops, in this process, and the CPU
    seconds it spent per step. An op the spec rejects is given to the adapter only where it checks its input
    itself: elsewhere the kit answers it (stateful_tests/harness.py), so the bare replay skips it too."""
    adapter = load(name)()
    caps = adapter.capabilities
    n = 0
    t0, c0 = time.perf_counter(), cpu_seconds()
    for config, ops in log:
        adapter.reset(config)
        obs = adapter.observe()
        for op in ops:
            if not caps.checks_input:
                try:
                    validate(op, obs, config, caps.semantics)
                except SpecError:
                    continue
            adapter.apply(op)
            adapter.events()
            obs = adapter.observe()
            n += 1
    return n / (time.perf_counter() - t0), (cpu_seconds() - c0) / max(n, 1)


def cpu_seconds() -> float:
    """CPU seconds (user and system) of this process and of its children that have ended: an isolated adapter's
    child is joined when the run closes it, so a run's figure counts the kit's process and the adapter's."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def adapter_rows(examples: int, ks: tuple[int, ...] = (), adapters: tuple[str, ...] = ADAPTERS) -> list[dict[str, Any]]:
    """One row per adapter of ``adapters`` and engine (K = 1: the whole state judged every step); then, for the
    adapter that reports deltas (``DELTA_ADAPTER``), the swarm isolated and in-process at each K of ``ks``.

    Each adapter is built once before its runs are timed: its one-time imports (vLLM's take ~13 s) are no
    part of a checked step, as they are no part of the bare replay's, which runs after them."""
    rows = []
    runs: list[tuple[str, str, Callable[..., Result], int]] = [
        (name, engine, run, 1) for name in adapters for engine, run in [*ENGINES.items(), (IN_PROCESS, run_swarm)]
    ]
    runs += [(DELTA_ADAPTER, engine, run_swarm, k) for k in ks for engine in ("swarm", IN_PROCESS)]
    for name in adapters:
        load(name)()
    for name, engine, run, k in runs:
        Recorder.log = []
        states: set[Hashable] = set()
        originals = machine_module.Harness, swarm_module.Harness
        machine_module.Harness = swarm_module.Harness = Recorder  # type: ignore[misc]
        try:
            with TemporaryDirectory() as tmp:
                kwargs: dict[str, Any] = {} if engine == "hypothesis" else {"states": states}
                options: dict[str, Any] = {"full_check_every": k} if k > 1 else {}
                if engine == IN_PROCESS:
                    options["isolate"] = False
                if engine == "hypothesis":
                    machine_module.Harness = _counting(states)  # type: ignore[misc]
                c0 = cpu_seconds()
                result = run(
                    load(name), name,
                    Options(profile=PROFILES["ci"], max_examples=examples, cases_dir=Path(tmp), **options),
                    **kwargs,
                )  # fmt: skip
                cpu = cpu_seconds() - c0
        finally:
            machine_module.Harness, swarm_module.Harness = originals  # type: ignore[misc]
        assert result.status == "passed", result.report().table()
        checked = result.tally.steps / result.duration_s
        bare, bare_cpu = bare_rate(name, Recorder.log)
        checked_cpu = cpu / max(result.tally.steps, 1)
        rows.append(
            {
                "adapter": name,
                "engine": engine,
                "full_check_every": k,
                "examples": result.tally.examples,
                "checked_steps": result.tally.steps,
                "seconds": round(result.duration_s, 2),
                "checked_steps_per_s": round(checked),
                "bare_steps_per_s": round(bare),
                "share_of_bare": round(checked / bare, 3),
                "checked_cpu_us_per_step": round(checked_cpu * 1e6, 1),
                "bare_cpu_us_per_step": round(bare_cpu * 1e6, 1),
                "cpu_share_of_bare": round(bare_cpu / checked_cpu, 3),
                "abstract_states": len(states),
                "abstract_states_per_min": round(len(states) / result.duration_s * 60),
            }
        )
        print(rows[-1], flush=True)
    return rows


def _counting(states: set[Hashable]) -> type[Harness]:
    """The recording harness whose tally also collects abstract states (the Hypothesis engine's Tally is its own)."""

    class Counting(Recorder):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.tally.states = states

    return Counting


def bug_rows(names: tuple[str, ...] | None) -> list[dict[str, Any]]:
    rows = []
    for bug in SEEDED_BUGS:
        if names is not None and bug.name not in names:
            continue
        found_by = {bug.invariant, bug.named_first or bug.invariant}
        rows += bug_engine_rows(bug.name, bug.invariant, found_by, bug.factory, SEEDED_PROFILE, refines(bug))
    return rows


def bug_engine_rows(
    name: str, invariant: str, found_by: set[str], factory: Callable[[], Any], profile: Any, refine: bool
) -> list[dict[str, Any]]:
    """One bug run by each engine (the swarm with keep-going): the examples and seconds to its first counterexample,
    the whole run's seconds, the reported length, and whether an invariant of ``found_by`` was named."""
    rows = []
    for engine, run in ENGINES.items():
        with TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            options = Options(profile=profile, cases_dir=Path(tmp), refine=refine, keep_going=engine == "swarm")
            result = run(factory, name, options)
            total = time.perf_counter() - t0
        first = result.tally.first_failure_at
        named = {v.invariant for v, _, _ in result.more_failures}
        if result.failure is not None:
            named.add(result.failure.invariant)
        rows.append(
            {
                "bug": name,
                "invariant": invariant,
                "engine": engine,
                "found": bool(found_by & named),
                "examples_to_first": first[0] if first else None,
                "seconds_to_first": None if result.tally.first_failure_s is None else round(
                    result.tally.first_failure_s, 3),
                "seconds_total": round(total, 2),
                "reported_ops": len(result.failure_ops),
            }
        )  # fmt: skip
        print(rows[-1], flush=True)
    return rows


def adapter_table(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown table of :func:`adapter_rows`' rows."""
    lines = [
        "| adapter | engine | K | examples | checked steps | checked steps/s | bare steps/s | share of bare "
        "| CPU us/step checked | CPU us/step bare | share of bare (CPU) | abstract states | states/min |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cpu = (
            f"| {r['checked_cpu_us_per_step']} | {r['bare_cpu_us_per_step']} | {r['cpu_share_of_bare']:.1%} "
            if "cpu_share_of_bare" in r
            else "| | | "
        )
        lines.append(
            f"| {r['adapter']} | {r['engine']} | {r.get('full_check_every', 1)} | {r['examples']} "
            f"| {r['checked_steps']} | {r['checked_steps_per_s']} "
            f"| {r['bare_steps_per_s']} | {r['share_of_bare']:.1%} {cpu}| {r['abstract_states']} "
            f"| {r['abstract_states_per_min']} |"
        )
    return lines


def bug_table(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown table of :func:`bug_engine_rows`' rows."""
    lines = [
        "| bug | invariant | engine | found | examples to first | seconds to first | seconds total | reported ops |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['bug']} | {r['invariant']} | {r['engine']} | {r['found']} | {r['examples_to_first']} "
            f"| {r['seconds_to_first']} | {r['seconds_total']} | {r['reported_ops']} |"
        )
    return lines


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# The swarm explorer against the Hypothesis engine",
        "",
        f"`python benchmarks/swarm.py{' --quick' if data['quick'] else ''}"
        f"{' --bugs-from docs/benchmarks/swarm.json' if data.get('seeded_bugs_from') else ''}` on {data['machine']}; "
        f"{data['examples']} examples (walks) of the ci profile per adapter and engine.",
        "",
        "K is `--full-check-every`: the whole state judged every K steps, the part a step changed on the "
        "others (docs/incremental.md; the reference adapter reports deltas). The bare adapter replays the same ops "
        "with apply, events and a full observe, in this process. Share of bare: checked steps/s over bare steps/s "
        "(wall clock: on a loaded machine it moves by several points from run to run). CPU: CPU microseconds per "
        "step, user and system, of the kit's process and the adapter's child together (engine `swarm` and "
        "`hypothesis` run the adapter in a child); the CPU share is bare CPU over checked CPU: what a step costs "
        "in work whatever the load (the child runs the next step while the kit judges this one, so on a free "
        "second core the wall share can exceed it).",
        "",
        *adapter_table(data["adapters"]),
    ]
    lines += [
        "",
        "Seeded bugs (the seeded-bug test's profile: ci with 20 steps per example; the swarm with keep-going, so "
        "a bug whose first failing walk breaks another invariant first still counts when its own is reported)"
        + (
            f"; these rows are an earlier run's ({data['seeded_bugs_from']}), not rerun with the table above:"
            if data.get("seeded_bugs_from")
            else ":"
        ),
        "",
        *bug_table(data["seeded_bugs"]),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI: 20 examples per adapter, two seeded bugs")
    parser.add_argument("--examples", type=int, default=None, help="examples (walks) per adapter and engine")
    parser.add_argument(
        "--full-check-every",
        type=int,
        nargs="*",
        default=list(FULL_CHECK_EVERY),
        metavar="K",
        help=f"the Ks at which the swarm on {DELTA_ADAPTER} is also measured (default: %(default)s; none: K=1 only)",
    )
    parser.add_argument(
        "--bugs-from",
        type=Path,
        metavar="JSON",
        help="take the seeded-bug table from an earlier run's JSON instead of rerunning it (the markdown says so)",
    )
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "benchmarks" / "swarm.json")
    parser.add_argument("--markdown", type=Path, default=ROOT / "docs" / "benchmarks" / "swarm.md")
    args = parser.parse_args()
    earlier = None
    if args.bugs_from is not None:  # read first: before the run, and before the new JSON may replace it
        try:
            earlier = jsonio.load(args.bugs_from)
            if not isinstance(earlier, dict) or not isinstance(earlier.get("seeded_bugs"), list):
                raise ValueError("no seeded_bugs table (not a benchmarks/swarm.py JSON)")
        except (OSError, ValueError) as exc:
            print(f"kvspec: {args.bugs_from}: {exc}", file=sys.stderr)
            raise SystemExit(ExitCode.COULD_NOT_RUN) from None
    examples = args.examples or (QUICK_EXAMPLES if args.quick else 200)
    data: dict[str, Any] = {
        "kvspec_bench_swarm": 1,
        "quick": args.quick,
        "examples": examples,
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
        "full_check_every": args.full_check_every,
        "adapters": adapter_rows(examples, tuple(k for k in args.full_check_every if k > 1)),
    }
    if earlier is not None:
        data["seeded_bugs"], data["seeded_bugs_from"] = (
            earlier["seeded_bugs"],
            earlier.get("seeded_bugs_from") or f"the {args.bugs_from.name} before this run",
        )
    else:
        data["seeded_bugs"] = bug_rows(QUICK_BUGS if args.quick else None)
    jsonio.write(args.json, data)
    jsonio.write_text(args.markdown, markdown(data))
    print(f"wrote {args.json} and {args.markdown}")


if __name__ == "__main__":
    main()
