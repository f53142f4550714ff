"""Lifecycle trace checking: replay a recorded event log through the spec.

``check_trace(path, fmt)`` reads a JSONL log in one of three formats (kvspec's
own trace, vLLM's KV cache events, a KV block side table), replays it, and
returns a TraceResult: per invariant held, violated or unknown with the lines
it was checked on, and the first violation with its line and the lines before
it. A log that cannot be read is an error with its line number, never a crash.

A format is one module of this package, listed in ``FORMATS``, with:
``DESCRIPTION`` (one line, for ``--help``), ``INVARIANTS`` (what it judges, in
report order), ``recognizes(first_line) -> bool`` (for ``--format auto``) and
``check(lines, judge)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from . import kvspec_format, side_table, vllm_events
from .lines import Line, TraceFormatError, read_lines
from .result import Judge, TraceInvariant, TraceResult, TraceViolation

FORMATS: dict[str, ModuleType] = {
    "kvspec": kvspec_format,
    "vllm-events": vllm_events,
    "side-table": side_table,
}
"""Every trace format by name; ``--format auto`` asks each in this order whether it recognizes line 1."""


def detect_format(path: Path | str) -> str:
    """The format of a trace from its first line; TraceFormatError when no format recognizes it."""
    first = read_lines(Path(path))[0]
    for name, module in FORMATS.items():
        if module.recognizes(first.data):
            return name
    raise TraceFormatError(first.number, "cannot tell the trace's format from its first line; pass --format")


def check_trace(path: Path | str, fmt: str, *, context: int = 3) -> TraceResult:
    """Check the trace at ``path`` in format ``fmt``; the result's exit_code is 0, 1 or 2.

    ``context``: how many lines before the first violation the result keeps.
    """
    module = FORMATS.get(fmt)
    if module is None:
        raise ValueError(f"unknown trace format {fmt!r}; known: {', '.join(FORMATS)}")
    result = TraceResult(str(path), fmt, module.INVARIANTS)
    t0 = time.perf_counter()
    judge: Judge | None = None
    try:
        lines = read_lines(Path(path))
        checker: Callable[[list[Line], Judge], None] = module.check
        judge = Judge(result, lines, context)
        checker(lines, judge)
    except TraceFormatError as exc:
        result.error, result.error_line = exc.message, exc.line
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ArithmeticError, RecursionError) as exc:
        # A value of a shape no format check foresaw: the trace cannot be judged, which is never a pass.
        result.error = f"cannot read this line: {type(exc).__name__}: {exc}"
        result.error_line = judge.current if judge is not None else None
    finally:
        result.duration_s = time.perf_counter() - t0
    return result


__all__ = [
    "FORMATS",
    "TraceFormatError",
    "TraceInvariant",
    "TraceResult",
    "TraceViolation",
    "check_trace",
    "detect_format",
]
