"""The kit's external contract: exit codes (and, below, the report every check produces).

Exit codes of every ``kvspec`` command: 0 every invariant held (or, for a measurement,
it ran); 1 a violation was found; 2 the command could not run. A gate must never read
2 as a pass.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """How a ``kvspec`` command ended. ``DONE`` is ``HELD`` for commands that measure rather than judge."""

    HELD = 0
    DONE = 0
    VIOLATED = 1
    COULD_NOT_RUN = 2

    @classmethod
    def of(cls, status: str) -> ExitCode:
        """The exit code of a run's status: passed -> 0, violated -> 1, anything else (error, interrupted) -> 2."""
        return {"passed": cls.HELD, "violated": cls.VIOLATED}.get(status, cls.COULD_NOT_RUN)
