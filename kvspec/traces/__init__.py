"""Lifecycle trace checking: replay a recorded event log through the spec.

``check_trace(path, fmt)`` reads a JSONL log in one of four formats (kvspec's
own trace, vLLM's KV cache events, the KVFabric overlay's lifecycle log, a KV
block side table), replays it, and
returns a TraceResult: per invariant held, violated or unknown with the lines
it was checked on, the first violation with its line and the lines before it,
and each violated invariant's count of violating lines to the end of the log
(``first=True``: the check stops at the first violating line). A log that
cannot be read is an error with its line number, never a crash;
so is a log in which nothing is a record of the format (a trace of another
format read with the wrong ``--format``), which must never read as a pass.

A format is one module of this package, listed in ``FORMATS``, with:
``DESCRIPTION`` (one line, for ``--help``), ``INVARIANTS`` (what it judges, in
report order), ``recognizes(line) -> bool`` (whether a line is one of its
records; ``--format auto`` asks it of line 1) and ``check(lines, judge)``
(``judge.options``: what the command line says about the pool; ``judge.watch``, when set,
gets a :class:`Seen` per replayed line up to the first violating one, for a picture:
kvspec/traces/seen.py; ``judge.judge`` returns True for a line that broke something, after
which the format stops when ``judge.first`` and otherwise adopts what the line records and
goes on). A format may also
have ``check_path(path, judge)``, which reads the file as a stream (memory bounded by the state it
keeps, not the file's length); it is used whenever no picture is asked for.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from . import kvfabric, kvspec_format, side_table, vllm_events
from .lines import Line, TraceFormatError, iter_lines, read_lines
from .result import Judge, TraceInvariant, TraceOptions, TraceResult, TraceViolation
from .seen import Seen, Watch

FORMATS: dict[str, ModuleType] = {
    "kvspec": kvspec_format,
    "vllm-events": vllm_events,
    "kvfabric": kvfabric,
    "side-table": side_table,
}
"""Every trace format by name; ``--format auto`` asks each in this order whether it recognizes line 1
(kvfabric before side-table: both are ``event`` lines, kvfabric's carry ``time_ns``)."""

AUTO = "auto"
"""The format name that means: the format whose records line 1 is."""


def _detect(lines: list[Line]) -> str:
    first = lines[0]
    for name, module in FORMATS.items():
        if module.recognizes(first.data):
            return name
    raise TraceFormatError(first.number, "cannot tell the trace's format from its first line; pass --format")


def detect_format(path: Path | str) -> str:
    """The format of a trace from its first line; TraceFormatError when no format recognizes it."""
    return _detect(read_lines(Path(path)))


def _replay(module: ModuleType, lines: list[Line], judge: Judge) -> None:
    """Run the format's check; a file with nothing of the format in it is an error, never an empty pass."""
    result = judge.result
    nothing = f"nothing in this file is a {result.fmt} record"
    if not any(module.recognizes(line.data) for line in lines):
        raise TraceFormatError(None, nothing)
    checker: Callable[[list[Line], Judge], None] = module.check
    checker(lines, judge)
    if result.violation is None and not result.steps and not result.checked:
        judge.current = None
        raise TraceFormatError(None, f"{nothing} that could be checked: no step was replayed")


def check_trace(
    path: Path | str,
    fmt: str,
    *,
    context: int = 3,
    options: TraceOptions | None = None,
    watch: Watch | None = None,
    first: bool = False,
) -> TraceResult:
    """Check the trace at ``path`` in format ``fmt`` (a FORMATS name, or AUTO); exit_code is 0, 1 or 2.

    ``context``: how many lines before the first violation the result keeps; ``options``: the
    pool size and policy given on the command line, for logs that do not say them; ``watch``:
    called with what each line leaves (:class:`Seen`) up to and including the first violating
    line, for a picture; ``first``: stop at the first violating line (``--first``) instead of
    counting every violation to the end of the trace.
    """
    if fmt != AUTO and fmt not in FORMATS:
        raise ValueError(f"unknown trace format {fmt!r}; known: {', '.join(FORMATS)}")
    result = TraceResult(str(path), fmt, FORMATS[fmt].INVARIANTS if fmt in FORMATS else ())
    t0 = time.perf_counter()
    judge: Judge | None = None
    try:
        if fmt == AUTO:
            head = next(iter_lines(Path(path)), None)
            if head is None:
                raise TraceFormatError(None, "the file holds no trace lines")
            result.fmt = _detect([head])
            result.invariants = FORMATS[result.fmt].INVARIANTS
        module = FORMATS[result.fmt]
        if watch is None and hasattr(module, "check_path"):  # a streaming reader: the log is never held whole
            judge = Judge(result, [], context, options, watch, first=first)
            module.check_path(Path(path), judge)
        else:
            lines = read_lines(Path(path))
            judge = Judge(result, lines, context, options, watch, first=first)
            _replay(module, lines, judge)
    except TraceFormatError as exc:
        result.error, result.error_line = exc.message, exc.line
    except KeyboardInterrupt:  # the verdicts so far stand; the report says they cover only what was read
        result.interrupted = True
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ArithmeticError, RecursionError) as exc:
        # A value of a shape no format check foresaw: the trace cannot be judged, which is never a pass.
        result.error = f"cannot read this line: {type(exc).__name__}: {exc}"
        result.error_line = judge.current if judge is not None else None
    finally:
        result.duration_s = time.perf_counter() - t0
    return result


__all__ = [
    "AUTO",
    "FORMATS",
    "Seen",
    "TraceFormatError",
    "TraceInvariant",
    "TraceOptions",
    "TraceResult",
    "TraceViolation",
    "Watch",
    "check_trace",
    "detect_format",
]
