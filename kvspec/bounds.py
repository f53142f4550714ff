"""The bounds of a value given on a command line, said once: what a flag's number must be, in the words of its error.

Both the command line (kvspec.cli) and the run options (kvspec.stateful_tests.options, which the pytest plugin
reads too) judge their flags with these, so one bad value reads the same wherever it is given.
"""

from __future__ import annotations

import math


def positive(name: str, value: float | None) -> str | None:
    """Why ``value`` of option ``name`` is not a positive, finite number, or None (None means no value)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        return f"{name} must be a positive number, not {value:g}"
    return None


def at_least_one(name: str, value: int | None) -> str | None:
    """Why ``value`` of option ``name`` is not a whole number of at least 1, or None (None means no value)."""
    if value is not None and value < 1:
        return f"{name} must be at least 1, not {value}"
    return None


__all__ = ["at_least_one", "positive"]
