"""``kvspec trace check``, ``kvspec trace record`` and ``kvspec trace convert``.

Exit codes: 0 every invariant held (or the trace was recorded), 1 a violation, 2 the
command could not run (unreadable file, malformed line, adapter failure).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kvspec import jsonio
from kvspec.adapters.isolation import IsolatedAdapter, RemoteError
from kvspec.bounds import at_least_one, positive, step_timeout
from kvspec.report import ExitCode
from kvspec.spec import Config
from kvspec.traces import AUTO, FORMATS, TraceFormatError, TraceOptions, check_trace, values
from kvspec.traces.result import TraceResult

from .common import fail

SNAPSHOT_EVERY = 64
"""`trace record`'s default K: a full observation every 64 steps, deltas between (docs/traces.md)."""


def register(subparsers: Any) -> None:
    """Add `trace check` and `trace record` to the `kvspec` subcommands."""
    trace = subparsers.add_parser("trace", help="check or record lifecycle traces (JSONL event logs)")
    sub = trace.add_subparsers(dest="trace_command", required=True)

    check = sub.add_parser("check", help="replay a recorded trace through the spec")
    check.add_argument("file", type=Path, help="the JSONL trace")
    check.add_argument(
        "--format",
        choices=[AUTO, *sorted(FORMATS)],
        default=AUTO,
        help="; ".join(f"{name}: {module.DESCRIPTION}" for name, module in FORMATS.items())
        + f"; {AUTO} (default): from the first line",
    )
    check.add_argument("--report", type=Path, default=None, help="write the JSON report (as kvspec check) here")
    check.add_argument(
        "--html",
        type=Path,
        default=None,
        help="write the check as one self-contained HTML page with the block timeline of the failing window "
        "(or of the whole trace when it holds) here (kvspec[show])",
    )
    check.add_argument("--context", type=int, default=3, help="lines shown before the first violation (default 3)")
    check.add_argument(
        "--first",
        action="store_true",
        help="stop at the first violating line (the check and report of kits before the counts); by default the "
        "whole trace is checked and each violated invariant's violating lines are counted",
    )
    check.add_argument(
        "--capacity",
        type=int,
        default=None,
        help="blocks in the pool where the log does not say (kvfabric: vLLM's num_gpu_blocks - 1; side-table)",
    )
    check.add_argument(
        "--policy",
        choices=["lru", "shared_aware", "family_protect"],
        default=None,
        help="the eviction policy where the log does not say (kvfabric, side-table)",
    )
    check.set_defaults(handler=cmd_check, on_interrupt=check_interrupted)

    convert = sub.add_parser("convert", help="convert a KVFabric lifecycle log into a side table")
    convert.add_argument("file", type=Path, help="the KVFabric lifecycle log (kvfabric_lifecycle.jsonl)")
    convert.add_argument("--from", dest="source_format", choices=["kvfabric"], default="kvfabric")
    convert.add_argument("--to", dest="target", choices=["side-table", "kvspec"], required=True)
    convert.add_argument("--out", type=Path, required=True, help="the JSONL file to write")
    convert.add_argument("--capacity", type=int, default=None, help="blocks in the pool, for the side table header")
    convert.set_defaults(handler=cmd_convert)

    record = sub.add_parser("record", help="drive an adapter with ops and write what it did as a trace")
    record.add_argument("--adapter", default="reference", help="adapter name or pkg.module:Factory")
    record.add_argument("--out", type=Path, required=True, help="the JSONL trace to write")
    record.add_argument(
        "--format", choices=["kvspec", "side-table"], default="kvspec", help="what to write (default kvspec)"
    )
    record.add_argument("--ops", type=Path, default=None, help="a case or workload JSON file with the ops to apply")
    record.add_argument("--seed", type=int, default=0, help="seed of the random valid ops (without --ops)")
    record.add_argument("--steps", type=int, default=100, help="number of random ops (without --ops)")
    record.add_argument("--capacity", type=int, default=None, help="pool size (default: the case's, else 8)")
    record.add_argument("--block-size", type=int, default=None, help="tokens per block (default: the file's, else 4)")
    record.add_argument(
        "--no-observations", action="store_true", help="kvspec format: record ops, outcomes and events only"
    )
    record.add_argument(
        "--snapshot-every",
        type=int,
        default=SNAPSHOT_EVERY,
        metavar="K",
        help=f"kvspec format: a full observation every K steps, a delta between (default {SNAPSHOT_EVERY}); "
        "1: a full observation every step (trace version 1, which older kits read)",
    )
    record.add_argument(
        "--step-timeout", type=float, default=30.0, help="seconds before an adapter call counts as hung"
    )
    record.set_defaults(handler=cmd_record)


def cmd_check(args: argparse.Namespace) -> int:
    for path, what in ((args.report, "the report"), (args.html, "the page")):
        if path is not None:
            try:
                jsonio.ensure_writable(path)
            except OSError as exc:
                return fail(f"{path}: cannot write {what}: {exc}")
    if args.html is not None:
        from kvspec.show import matplotlib_missing

        problem = matplotlib_missing()
        if problem is not None:
            return fail(problem)
    if args.context < 0:
        return fail(f"--context must be at least 0 lines, not {args.context}")
    if args.capacity is not None:
        try:
            values.blocks("--capacity", args.capacity)
        except ValueError as exc:
            return fail(str(exc))
    options = TraceOptions(capacity=args.capacity, policy=args.policy)
    traced = None
    if args.html is not None:  # the same check, keeping what each line leaves for the picture
        from kvspec.show import trace_run as shown_trace

        traced = shown_trace.check(args.file, args.format, context=args.context, options=options, first=args.first)
        result = traced.result
    else:
        result = check_trace(args.file, args.format, context=args.context, options=options, first=args.first)
    report = result.report()
    try:
        report.write(args.report)
    except OSError as exc:
        return fail(f"{args.report}: cannot write the report: {exc}")
    if traced is not None:
        from kvspec.show import write_trace_html

        try:
            write_trace_html(args.html, traced)
        except OSError as exc:
            return fail(f"{args.html}: cannot write the page: {exc}")
    print(report.table())
    if result.status == "error":
        where = f":{result.error_line}" if result.error_line is not None else ""
        print(f"kvspec: {args.file}{where}: {result.error}", file=sys.stderr)
    return result.exit_code


def cmd_convert(args: argparse.Namespace) -> int:
    from kvspec.traces.convert import ConversionError, convert

    try:
        jsonio.ensure_writable(args.out)
        if args.capacity is not None:
            values.blocks("--capacity", args.capacity)
        written = convert(args.file, args.target, args.out, capacity=args.capacity)
    except TraceFormatError as exc:
        where = f":{exc.line}" if exc.line is not None else ""
        return fail(f"{args.file}{where}: {exc.message}")
    except ConversionError as exc:
        return fail(f"{args.file}: cannot convert to {args.target}: {exc}")
    except ValueError as exc:
        return fail(str(exc))
    except OSError as exc:
        return fail(f"{args.out}: cannot write: {exc}")
    print(f"converted {written} events of {args.file} (kvfabric) to {args.out} ({args.target})")
    return ExitCode.HELD


def check_interrupted(args: argparse.Namespace) -> None:
    """Ctrl-C before the trace was read: an interrupted report, every verdict unknown."""
    if args.report is not None:
        fmt = args.format if args.format in FORMATS else "auto"
        invariants = FORMATS[fmt].INVARIANTS if fmt in FORMATS else ()
        TraceResult(str(args.file), fmt, invariants, interrupted=True, first=args.first).report().write(args.report)


def cmd_record(args: argparse.Namespace) -> int:
    from kvspec.adapters import AdapterLoadError, load
    from kvspec.traces.record import (
        MalformedAnswer,
        RandomOps,
        RecordedStep,
        drive,
        load_ops,
        write_kvspec_trace,
        write_side_table,
    )

    try:
        jsonio.ensure_writable(args.out)
    except OSError as exc:
        return fail(f"{args.out}: cannot write the trace: {exc}")
    fields: dict[str, int] = {}
    ops = None
    if args.ops is not None:
        try:
            fields, ops = load_ops(args.ops)
        except OSError as exc:
            return fail(f"{args.ops}: cannot read the ops: {exc.strerror or exc}")
        except ValueError as exc:
            return fail(f"{args.ops}: {exc}")
    problem = step_timeout("--step-timeout", args.step_timeout) or positive("--snapshot-every", args.snapshot_every)
    problem = problem or (at_least_one("--steps", args.steps) if ops is None else None)
    problem = problem or at_least_one("--capacity", args.capacity) or at_least_one("--block-size", args.block_size)
    if problem is not None:
        return fail(problem)
    try:
        adapter = IsolatedAdapter(load(args.adapter), args.step_timeout)
    except (AdapterLoadError, Exception) as exc:
        return fail(f"adapter {args.adapter!r} could not start: {exc}")
    caps = adapter.capabilities
    if args.capacity is not None:
        fields["capacity"] = args.capacity
    if args.block_size is not None:
        fields["block_size"] = args.block_size
    try:
        config = caps.fixed_config or Config(**{"capacity": 8, "block_size": 4, **fields})
        if caps.fixed_config is None and caps.semantics.granularity != "entry":
            values.blocks("capacity", config.capacity)  # a pool in blocks: the kit's limit
    except ValueError as exc:  # SpecError is one
        adapter.close()
        return fail(f"bad pool: {exc}")
    source = ops if ops is not None else RandomOps(args.seed, config, caps.ops, caps.semantics.granularity).next
    recorded: list[RecordedStep] = []
    code = ExitCode.HELD
    try:
        for step in drive(adapter, config, source, args.steps):
            recorded.append(step)
    except KeyboardInterrupt:  # what was recorded up to here is still written
        print(f"kvspec: interrupted at step {len(recorded)}", file=sys.stderr)
        code = ExitCode.COULD_NOT_RUN
    except MalformedAnswer as exc:  # the contract's types: what the adapter answered well up to here is written
        print(f"kvspec: adapter {args.adapter!r} answered malformed {exc}", file=sys.stderr)
        code = ExitCode.COULD_NOT_RUN
    except Exception as exc:  # the adapter is user code (it ran in a child): what it did up to here is still written
        kind = exc.type_name if isinstance(exc, RemoteError) else type(exc).__name__
        print(f"kvspec: adapter {args.adapter!r} failed at step {len(recorded)}: {kind}: {exc}", file=sys.stderr)
        code = ExitCode.COULD_NOT_RUN
    if not recorded and code != ExitCode.HELD:  # not even a first observation to write a trace from
        adapter.close()
        return code
    try:
        if args.format == "side-table":
            write_side_table(args.out, adapter, config, recorded)
        else:
            every = None if args.snapshot_every == 1 else args.snapshot_every
            write_kvspec_trace(
                args.out, adapter, config, recorded, observations=not args.no_observations, snapshot_every=every
            )
    except ValueError as exc:
        return fail(f"{exc}")
    except OSError as exc:
        return fail(f"{args.out}: cannot write the trace: {exc}")
    finally:
        adapter.close()
    print(f"recorded {len(recorded)} steps of {adapter.name} ({args.format}) to {args.out}")
    return code
