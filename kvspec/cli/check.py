"""``kvspec check``, ``kvspec replay`` and ``kvspec adapters``: the conformance suite on one adapter."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kvspec.adapter import AdapterFactory
from kvspec.adapters import AdapterLoadError, available, load
from kvspec.adapters.isolation import IsolatedAdapter, RemoteError
from kvspec.bounds import WORKERS_PER_CPU, at_most, max_workers, step_timeout
from kvspec.case import Case
from kvspec.report import ExitCode, Report
from kvspec.stateful_tests import AdapterHung, Options, Violation, not_started, replay_ops
from kvspec.stateful_tests.options import add_flags, options_from
from kvspec.stateful_tests.workers import run_workers

from .common import fail, unreadable, unwritable


def register(sub: Any) -> None:
    """Add check, replay and adapters to the ``kvspec`` subcommands."""
    check = sub.add_parser("check", help="run the conformance suite against one adapter")
    check.add_argument("--adapter", default="reference", help="adapter name or pkg.module:Factory (default: reference)")
    groups: dict[str | None, Any] = {None: check}

    def add(group: str | None) -> Any:
        if group not in groups:
            groups[group] = check.add_argument_group(group)
        return groups[group].add_argument

    add_flags(add, "cli")  # every run option: stateful_tests/options.py
    check.add_argument("--report", type=Path, default=None, help="write the JSON report here")
    check.add_argument("--junit", type=Path, default=None, help="write JUnit XML here")
    check.add_argument(
        "--html", type=Path, default=None, help="write the run as one self-contained HTML page here (kvspec[show])"
    )
    check.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="run the check in N processes, worker i with a seed derived from --seed and i, one merged report "
        "(docs/workers.md; default 1: this process)",
    )
    check.set_defaults(handler=cmd_check, on_interrupt=check_interrupted)

    replay = sub.add_parser("replay", help="replay a saved case on an adapter")
    replay.add_argument("case", type=Path)
    replay.add_argument("--adapter", default=None, help="adapter to run it on (default: the case's own)")
    replay.add_argument("--step-timeout", type=float, default=30.0, help="seconds before a step counts as hung")
    replay.set_defaults(handler=cmd_replay)

    adapters = sub.add_parser("adapters", help="list the adapters that can be loaded")
    adapters.set_defaults(handler=cmd_adapters)


def _options(args: argparse.Namespace) -> Options:
    return options_from(lambda dest: getattr(args, dest), "cli")


def _bad_options(args: argparse.Namespace) -> str | None:
    try:
        _options(args)
    except ValueError as exc:  # a run option's problem (options.py), said as its flag says it
        return str(exc)
    cap = max_workers()
    workers = at_most("--workers", args.workers, cap, f"{WORKERS_PER_CPU} per usable CPU")
    problem = workers or unwritable(args.report, args.junit, args.html)
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
        write_html(args.html, options, report, None)
        return fail(str(exc))
    report = run_workers(factory, args.adapter, options, args.workers)
    report.write(args.report, args.junit)
    write_html(args.html, options, report, factory)
    print(report.table())
    if report.status == "error":  # the check could not run: its one line on stderr, as every exit 2 has
        print(f"kvspec: {report.error}", file=sys.stderr)
    return report.exit_code


def write_html(path: Path | None, options: Options, report: Report, factory: AdapterFactory | None) -> None:
    """The run as one HTML page (``--html``), each saved case replayed on the adapter and drawn; a live run's cases
    are the logs it recorded, checked and drawn as traces (with the whole run's ``--record`` log when there is one)."""
    if path is None:
        return
    from kvspec.show import write_report_html

    live = "live" in report.sections
    record = options.live.record
    logs = [record] if live and record is not None and record.is_file() else []
    write_report_html(
        path, report, None if live else factory, refine=options.refine, step_timeout=options.step_timeout, logs=logs
    )


def check_interrupted(args: argparse.Namespace) -> None:
    """Ctrl-C before the suite had a report of its own: an interrupted report, every verdict unknown."""
    if args.report is not None or args.junit is not None or args.html is not None:
        options = _options(args)
        report = not_started(args.adapter, options, "interrupted", "interrupted")
        report.write(args.report, args.junit)
        write_html(args.html, options, report, None)


def cmd_replay(args: argparse.Namespace) -> int:
    """Replay a case's ops on an adapter (the case's own by default), each call under the step timeout."""
    problem = step_timeout("--step-timeout", args.step_timeout)
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
    expected = case.expected.get("invariant")
    past: Violation | None = None
    try:
        violation = replay_ops(adapter, case.config, case.ops)
        if violation is not None and expected and violation.invariant != expected:
            # a keep-going case: its invariant breaks after another, stepped past (docs/usage.md)
            past, violation = violation, replay_ops(adapter, case.config, case.ops, target=str(expected)) or violation
    except AdapterHung as hung:
        print(f"VIOLATED adapter_contract at step {hung.step}:\n{hung}")
        return ExitCode.VIOLATED
    finally:
        closed = _close(adapter)
    for i, op in enumerate(case.ops):
        print(f"  {i:>3}. {op}")
    if past is not None and violation is not past:
        print(f"(stepped past {past.invariant} at step {past.step}, the spec re-synchronised to the adapter)")
    if violation is None and closed is not None:  # as in kvspec check: a close that fails is the adapter's finding
        print(f"VIOLATED adapter_contract after step {len(case.ops) - 1}:\n  adapter_contract: close() {closed}")
        return ExitCode.VIOLATED
    if violation is None:
        print(f"every invariant held on {len(case.ops)} ops" + (f" (the case expected {expected})" if expected else ""))
        return ExitCode.HELD
    print(f"VIOLATED {violation.invariant} at step {violation.step}:\n{violation}")
    return ExitCode.VIOLATED


def _close(adapter: IsolatedAdapter) -> str | None:
    """Close ``adapter``; what went wrong (it raised, hung or died), or None."""
    try:
        adapter.close()
    except Exception as exc:
        kind = exc.type_name if isinstance(exc, RemoteError) else type(exc).__name__
        return f"raised {kind}: {exc}"
    return None


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
