"""What every command of the CLI shares: failing with one line, and turning signals into a clean stop."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

from kvspec.report import ExitCode


def fail(message: str, prefix: str = "kvspec") -> ExitCode:
    """Say on stderr, in one line, why the command could not run; the exit code that says so."""
    print(f"{prefix}: {message}", file=sys.stderr)
    return ExitCode.COULD_NOT_RUN


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def interrupts() -> Iterator[None]:
    """Meanwhile SIGINT and SIGTERM raise KeyboardInterrupt in the main thread.

    Every runner catches KeyboardInterrupt, writes what it has (report, cases, JSON) and
    stops what it started (servers); the CLI then exits 2. SIGINT is set explicitly: a
    command launched in the background by a shell starts with SIGINT ignored.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set signal handlers
        return
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
