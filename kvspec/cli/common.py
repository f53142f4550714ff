"""What every command of the CLI shares: failing with one line, output paths checked before a run, and
signals turned into a clean stop.

This module imports only the standard library at import time: :func:`kvspec.cli.main` installs its
signal handling from here before anything slow is imported.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from kvspec import stop

if TYPE_CHECKING:
    from kvspec.report import ExitCode

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def unreadable(path: Path | str, exc: OSError | ValueError) -> str:
    """The one line for a file that could not be read (OSError) or whose content is refused (ValueError)."""
    return f"{path}: {exc.strerror or exc}" if isinstance(exc, OSError) else f"{path}: {exc}"


def fail(message: str, prefix: str = "kvspec") -> ExitCode:
    """Say on stderr, in one line, why the command could not run; the exit code that says so."""
    from kvspec.report import ExitCode

    print(f"{prefix}: {message}", file=sys.stderr)
    return ExitCode.COULD_NOT_RUN


def unwritable(*paths: Path | None) -> str | None:
    """Why one of ``paths`` (the files a run will write) cannot be written, or None: checked before a run starts."""
    from kvspec import jsonio

    for path in paths:
        if path is None:
            continue
        try:
            jsonio.ensure_writable(path)
        except OSError as exc:
            return f"{path}: cannot write here: {exc.strerror or exc}"
    return None


_signals_seen = 0


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    """The first SIGINT or SIGTERM: a clean stop. A second one while the first is handled: exit 2 now."""
    global _signals_seen
    _signals_seen += 1
    if _signals_seen > 1:
        isolation = sys.modules.get("kvspec.adapters.isolation")
        if isolation is not None:
            isolation.kill_children()
        os._exit(2)
    stop.request()  # the raise below is lost if it lands in a gc or weakref callback: the next step raises again
    raise KeyboardInterrupt


def block_signals() -> set[int | signal.Signals] | None:
    """Hold SIGINT and SIGTERM back (delivered by :func:`restore_signals`); the mask to restore."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)


def restore_signals(previous: set[int | signal.Signals] | None) -> None:
    """Restore the mask: a signal held back is delivered now, as a KeyboardInterrupt raised here."""
    if previous is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def interrupts() -> Iterator[None]:
    """Meanwhile SIGINT and SIGTERM raise KeyboardInterrupt in the main thread; a second one exits 2 at once.

    Every runner catches KeyboardInterrupt, writes what it has (report, cases, JSON) and
    stops what it started (servers, adapter processes); the CLI then exits 2. SIGINT is set
    explicitly: a command launched in the background by a shell starts with SIGINT ignored.
    A second signal kills the adapter processes and ends the kit with exit 2 without waiting:
    the report, written atomically, is then the last whole one or none.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set signal handlers
        return
    global _signals_seen
    _signals_seen = 0
    stop.clear()
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
