"""The ``kvspec`` console script (and ``python -m kvspec``): SIGINT and SIGTERM are held back from its first
instruction until the command knows where its report goes, and a signal after the command has returned (the
interpreter's shutdown can take seconds) ends the process with the command's own exit code, never by the signal.

Standard library only, before :func:`run` imports the CLI.
"""

from __future__ import annotations

import atexit
import signal
import sys

_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_BEFORE = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)  # the mask the process started with


def _hold_signals() -> None:
    # Registered first, so the last exit handler to run: Python resets its signal handlers while it finalizes,
    # and a signal then would kill the process after its report is written; held back, it is discarded at exit.
    signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)


atexit.register(_hold_signals)


def run() -> None:
    """Run ``kvspec`` with ``sys.argv`` and exit with its code."""
    from kvspec.cli import main

    sys.exit(main(started_mask=_BEFORE, for_good=True))
