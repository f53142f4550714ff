"""A stop asked for by a signal, delivered where it cannot be lost.

The CLI's SIGINT/SIGTERM handler (kvspec.cli.common) raises KeyboardInterrupt wherever the main
thread is. Python swallows an exception raised inside a garbage-collector or weakref callback
(it prints "Exception ignored in ..." and goes on; Hypothesis times its runs with such a callback),
so the raise alone can be lost. The handler therefore also calls :func:`request`; the harness calls
:func:`check` before every step, which raises KeyboardInterrupt again until the runner that caught
one calls :func:`clear`. The kit's invariant: a stop asked for is honoured by the next step at the latest.

Standard library only: the CLI imports this before anything slow.
"""

from __future__ import annotations

_requested = False


def request() -> None:
    """Ask for a stop: :func:`check` raises KeyboardInterrupt from now until :func:`clear`."""
    global _requested
    _requested = True


def requested() -> bool:
    """Whether a stop was asked for and not yet taken by a runner."""
    return _requested


def check() -> None:
    """Raise KeyboardInterrupt if a stop was asked for (the raise of the signal handler may have been lost)."""
    if _requested:
        raise KeyboardInterrupt


def clear() -> None:
    """The stop was taken (a runner caught the KeyboardInterrupt and is writing what it has)."""
    global _requested
    _requested = False
