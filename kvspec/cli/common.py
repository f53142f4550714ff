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
from typing import TYPE_CHECKING, Any

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
_exit_code = 2  # the command's code once it is known (finished); a signal after that exits with it


def flush_streams() -> None:
    """Flush stdout and stderr before an ``os._exit`` (a reader gone, or a stream closed, is no matter then)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


def _flush_and_exit(code: int) -> None:
    flush_streams()
    os._exit(code)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    """The first SIGINT or SIGTERM: a clean stop. A second one while the first is handled: exit 2 now."""
    global _signals_seen
    _signals_seen += 1
    if _signals_seen > 1:
        isolation = sys.modules.get("kvspec.adapters.isolation")
        if isolation is not None:
            isolation.kill_children()
        _flush_and_exit(2)
    stop.request()  # the raise below is lost if it lands in a gc or weakref callback: the next step raises again
    raise KeyboardInterrupt


def _exit_now(signum: int, frame: FrameType | None) -> None:
    """A signal once the command has returned: the process ends now, with the command's own code."""
    _flush_and_exit(_exit_code)


def _unraisable(unraisable: Any) -> None:
    """Python swallows an exception raised in a gc or weakref callback or a ``__del__``, and reports it here:
    the KeyboardInterrupt of a stop asked for is raised again at the next step (kvspec.stop), so it is not
    printed as a traceback; anything else goes to Python's own hook."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt) and stop.requested():
        return
    sys.__unraisablehook__(unraisable)


def _watch_signals() -> tuple[int, int] | None:
    """A thread woken by every signal at C level (``signal.set_wakeup_fd``), while the main thread may be inside
    a long C call that runs no Python handler until it returns: it interrupts Z3 (a solve of the formal commands
    can take minutes; its answer is then unknown, read as a stop: spec/formal/bmc.py). The wakeup fd before
    and the pipe's write end (closing it ends the thread)."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    try:
        before = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    except ValueError:  # not the main thread
        os.close(read)
        os.close(write)
        return None

    def watch() -> None:
        while os.read(read, 64):
            z3 = sys.modules.get("z3")
            if z3 is not None:
                with contextlib.suppress(Exception):
                    z3.main_ctx().interrupt()
        os.close(read)

    threading.Thread(target=watch, name="kvspec-signal-watch", daemon=True).start()
    return before, write


def finished(code: int) -> None:
    """The command returned ``code``: a signal from now on ends the process with it (see :func:`interrupts`)."""
    global _exit_code
    _exit_code = code


def block_signals() -> set[int] | None:
    """Hold SIGINT and SIGTERM back (delivered by :func:`restore_signals`); the mask to restore."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)


def restore_signals(previous: set[int] | None) -> None:
    """Restore the mask: a signal held back is delivered now, as a KeyboardInterrupt raised here."""
    if previous is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


@contextlib.contextmanager
def interrupts(*, for_good: bool = False) -> Iterator[None]:
    """Meanwhile SIGINT and SIGTERM raise KeyboardInterrupt in the main thread; a second one exits 2 at once.

    Every runner catches KeyboardInterrupt, writes what it has (report, cases, JSON) and
    stops what it started (servers, adapter processes); the CLI then exits 2. The handler also
    asks for a stop (kvspec.stop): a KeyboardInterrupt that Python swallows (raised inside a gc or
    weakref callback) is raised again at the harness's next step. SIGINT is set explicitly: a command
    launched in the background by a shell starts with SIGINT ignored. A second signal kills the
    adapter processes and ends the kit with exit 2 without waiting: the report, written atomically,
    is then the last whole one or none. ``for_good`` (the console script, whose process ends after the
    command): the handlers are not restored at the end; a signal then exits at once with the
    command's code (:func:`finished`), never by the signal itself.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set signal handlers
        return
    global _signals_seen, _exit_code
    _signals_seen, _exit_code = 0, 2
    stop.clear()
    previous = {sig: signal.signal(sig, _raise_interrupt) for sig in SIGNALS}
    hook, sys.unraisablehook = sys.unraisablehook, _unraisable
    watch = _watch_signals()
    try:
        yield
    finally:
        if watch is not None:
            signal.set_wakeup_fd(watch[0])
            os.close(watch[1])  # the watching thread reads its end and stops
        for sig, handler in previous.items():
            signal.signal(sig, _exit_now if for_good else handler)
        if not for_good:
            sys.unraisablehook = hook
