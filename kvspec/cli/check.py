"""``kvspec check``, ``kvspec replay`` and ``kvspec adapters``: the conformance suite on one adapter."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kvspec.adapter import AdapterFactory
from kvspec.adapters import AdapterLoadError, available, load
from kvspec.adapters.isolation import IsolatedAdapter
from kvspec.case import Case
from kvspec.report import ExitCode, Report
from kvspec.stateful_tests import PROFILES, AdapterHung, LiveTarget, Options, replay_ops
from kvspec.stateful_tests.dispatch import not_started
from kvspec.stateful_tests.example_db import ExampleDbError, example_db_problem, parse_example_db
from kvspec.stateful_tests.live import MODES
from kvspec.stateful_tests.workers import run_workers

from .common import fail, positive, unreadable, unwritable

ENGINES = ("hypothesis", "swarm")
"""The explorers of an in-process adapter (stateful_tests: conformance.run_check, swarm.run_swarm)."""


def register(sub: Any) -> None:
    """Add check, replay and adapters to the ``kvspec`` subcommands."""
    check = sub.add_parser("check", help="run the conformance suite against one adapter")
    check.add_argument("--adapter", default="reference", help="adapter name or pkg.module:Factory (default: reference)")
    check.add_argument("--profile", choices=sorted(PROFILES), default="ci", help="ci: deterministic, bounded (default)")
    check.add_argument(
        "--seed",
        type=int,
        default=None,
        help="seed of the run (default: a drawn one, or the ci profile's derandomized one; the report names it)",
    )
    check.add_argument("--max-examples", type=int, default=None, help="number of random op sequences")
    check.add_argument("--report", type=Path, default=None, help="write the JSON report here")
    check.add_argument("--junit", type=Path, default=None, help="write JUnit XML here")
    check.add_argument(
        "--html", type=Path, default=None, help="write the run as one self-contained HTML page here (kvspec[show])"
    )
    check.add_argument("--cases-dir", type=Path, default=Path(".kvspec/cases"), help="where counterexamples go")
    check.add_argument("--step-timeout", type=float, default=30.0, help="seconds before a step counts as hung")
    check.add_argument(
        "--safety-only", action="store_true", help="skip the refinement checks against the spec's predictions"
    )
    check.add_argument("--no-scenarios", action="store_true", help="skip the bounded-model coverage cases")
    check.add_argument("--quiet", action="store_true", help="no progress lines")
    check.add_argument(
        "--keep-going",
        action="store_true",
        help="after a violation keep exploring; report each distinct violated invariant once, with its own case",
    )
    check.add_argument(
        "--engine",
        choices=ENGINES,
        default="hypothesis",
        help="hypothesis: the state machine, shrunk by Hypothesis (default); swarm: seeded random walks, each with "
        "a drawn subset of op kinds and prompt shapes, minimised by replay (docs/swarm.md)",
    )
    check.add_argument(
        "--example-db",
        default=None,
        metavar="DIR_OR_URL",
        help="example database: a folder, or redis://host:port/db shared by processes and machines; failures "
        "found are kept there and replayed first by the next run (a swarm run's cases included; docs/workers.md)",
    )
    check.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="run the check in N processes, worker i with a seed derived from --seed and i, one merged report "
        "(docs/workers.md; default 1: this process)",
    )
    check.add_argument(
        "--full-check-every",
        type=int,
        default=None,
        metavar="K",
        help="for adapters that report what a step changed: judge the whole state every K steps and at the end of "
        "each example, the changed part on the steps between (default: the profile's, 1: the whole state every step)",
    )
    live = check.add_argument_group("live adapters (vllm-live)")
    live.add_argument("--url", default=None, help="check this running server instead of starting the tiny one")
    live.add_argument("--events", default=None, help="its KV event PUB endpoint (e.g. ipc:///path or tcp://host:port)")
    live.add_argument("--replay", default=None, help="its KV event replay endpoint, to fill sequence gaps")
    live.add_argument("--record", type=Path, default=None, metavar="FILE", help="record the run as JSON lines here")
    live.add_argument("--mode", choices=MODES, default="both", help="exact (sequential), load (concurrent) or both")
    check.set_defaults(handler=cmd_check, on_interrupt=check_interrupted)

    replay = sub.add_parser("replay", help="replay a saved case on an adapter")
    replay.add_argument("case", type=Path)
    replay.add_argument("--adapter", default=None, help="adapter to run it on (default: the case's own)")
    replay.add_argument("--step-timeout", type=float, default=30.0, help="seconds before a step counts as hung")
    replay.set_defaults(handler=cmd_replay)

    adapters = sub.add_parser("adapters", help="list the adapters that can be loaded")
    adapters.set_defaults(handler=cmd_adapters)


def _options(args: argparse.Namespace) -> Options:
    live = LiveTarget(url=args.url, events=args.events, replay=args.replay, record=args.record, mode=args.mode)
    return Options(
        profile=args.profile,
        seed=args.seed,
        max_examples=args.max_examples,
        cases_dir=args.cases_dir,
        step_timeout=args.step_timeout,
        refine=not args.safety_only,
        scenarios=not args.no_scenarios,
        quiet=args.quiet,
        keep_going=args.keep_going,
        engine=args.engine,
        example_db=None if args.example_db is None else parse_example_db(args.example_db),
        full_check_every=args.full_check_every,
        live=live,
    )


def _bad_options(args: argparse.Namespace) -> str | None:
    if args.max_examples is not None and args.max_examples < 1:
        return f"--max-examples must be at least 1, not {args.max_examples}"
    if args.full_check_every is not None and args.full_check_every < 1:
        return f"--full-check-every must be at least 1, not {args.full_check_every}"
    if args.workers < 1:
        return f"--workers must be at least 1, not {args.workers}"
    problem = positive("--step-timeout", args.step_timeout) or unwritable(args.report, args.junit, args.html)
    if problem is None and args.example_db is not None:
        try:
            problem = example_db_problem(parse_example_db(args.example_db))
        except ExampleDbError as exc:
            problem = str(exc)
    if problem is None and args.html is not None:
        from kvspec.show import matplotlib_missing

        problem = matplotlib_missing()
    return problem


def cmd_check(args: argparse.Namespace) -> int:
    """Run the suite that fits the adapter; print the table, write the report and JUnit, whatever happens."""
    problem = _bad_options(args)
    if problem is not None:
        return fail(problem)
    options = _options(args)
    try:
        factory = load(args.adapter)
    except AdapterLoadError as exc:
        report = not_started(args.adapter, options, "error", str(exc))
        report.write(args.report, args.junit)
        write_html(args, report, None)
        return fail(str(exc))
    report = run_workers(factory, args.adapter, options, args.workers)
    report.write(args.report, args.junit)
    write_html(args, report, factory)
    print(report.table())
    return report.exit_code


def write_html(args: argparse.Namespace, report: Report, factory: AdapterFactory | None) -> None:
    """The run as one HTML page (``--html``), each saved case replayed on the adapter and drawn; a live run's cases
    are the logs it recorded, checked and drawn as traces (with the whole run's ``--record`` log when there is one)."""
    if args.html is None:
        return
    from kvspec.show import write_report_html

    live = "live" in report.sections
    refine = not getattr(args, "safety_only", False)
    record = getattr(args, "record", None)
    logs = [record] if live and record is not None and record.is_file() else []
    write_report_html(
        args.html, report, None if live else factory, refine=refine, step_timeout=args.step_timeout, logs=logs
    )


def check_interrupted(args: argparse.Namespace) -> None:
    """Ctrl-C before the suite had a report of its own: an interrupted report, every verdict unknown."""
    if args.report is not None or args.junit is not None or args.html is not None:
        report = not_started(args.adapter, _options(args), "interrupted", "interrupted")
        report.write(args.report, args.junit)
        write_html(args, report, None)


def cmd_replay(args: argparse.Namespace) -> int:
    """Replay a case's ops on an adapter (the case's own by default), each call under the step timeout."""
    problem = positive("--step-timeout", args.step_timeout)
    if problem is not None:
        return fail(problem)
    try:
        case = Case.load(args.case)
    except (OSError, ValueError) as exc:
        return fail(unreadable(args.case, exc))
    name = args.adapter or case.adapter
    try:
        adapter = IsolatedAdapter(load(name), args.step_timeout)
    except (AdapterLoadError, Exception) as exc:
        return fail(f"adapter {name!r} could not start: {exc}")
    try:
        violation = replay_ops(adapter, case.config, case.ops)
    except AdapterHung as hung:
        print(f"VIOLATED adapter_contract at step {hung.step}:\n{hung}")
        return ExitCode.VIOLATED
    finally:
        adapter.close()
    for i, op in enumerate(case.ops):
        print(f"  {i:>3}. {op}")
    expected = case.expected.get("invariant")
    if violation is None:
        print(f"every invariant held on {len(case.ops)} ops" + (f" (the case expected {expected})" if expected else ""))
        return ExitCode.HELD
    print(f"VIOLATED {violation.invariant} at step {violation.step}:\n{violation}")
    return ExitCode.VIOLATED


def cmd_adapters(args: argparse.Namespace) -> int:
    for name, path in available().items():
        try:
            adapter = load(name)()
            caps = adapter.capabilities
            adapter.close()
            sem = caps.semantics
            if caps.live:
                status = "live: drives a running server (starts the tiny one unless --url)"
            else:
                status = f"{sem.granularity} granularity, {sem.eviction} eviction, ops: {', '.join(sorted(caps.ops))}"
        except Exception as exc:
            status = f"not loadable: {exc}"
        print(f"{name:<16} {path}\n{'':<16} {status}")
    return ExitCode.HELD
