"""The bounds of a value given on a command line, said once: what a flag's number must be, in the words of its error.

Both the command line (kvspec.cli) and the run options (kvspec.stateful_tests.options, which the pytest plugin
reads too) judge their flags with these, so one bad value reads the same wherever it is given.
"""

from __future__ import annotations

import math
import os


def positive(name: str, value: float | None) -> str | None:
    """Why ``value`` of option ``name`` is not a positive, finite number, or None (None means no value)."""
    if value is not None and not (math.isfinite(value) and value > 0):
        return f"{name} must be a positive number, not {value:g}"
    return None


MIN_STEP_TIMEOUT = 0.1
"""The shortest ``--step-timeout`` in seconds: one call's round trip to the adapter's child takes milliseconds on a
loaded machine, so a shorter limit would call a healthy step hung, and below ~50 ms it was not even enforced."""


def step_timeout(name: str, value: float | None) -> str | None:
    """Why ``value`` of a step timeout option is not a number of seconds of at least :data:`MIN_STEP_TIMEOUT`."""
    problem = positive(name, value)
    if problem is None and value is not None and value < MIN_STEP_TIMEOUT:
        return f"{name} must be at least {MIN_STEP_TIMEOUT:g} s (an adapter call's round trip), not {value:g}"
    return problem


def at_least_one(name: str, value: int | None) -> str | None:
    """Why ``value`` of option ``name`` is not a whole number of at least 1, or None (None means no value)."""
    if value is not None and value < 1:
        return f"{name} must be at least 1, not {value}"
    return None


def at_most(name: str, value: int | None, bound: int, why: str) -> str | None:
    """Why ``value`` of option ``name`` is not between 1 and ``bound`` (``why``: the bound's reason), or None."""
    low = at_least_one(name, value)
    if low is None and value is not None and value > bound:
        return f"{name} must be at most {bound} ({why}), not {value}"
    return low


def first_problem(*problems: str | None) -> str | None:
    """The first of ``problems`` that is one (the others are None): the message of a command's first bad value."""
    return next((p for p in problems if p is not None), None)


WORKERS_PER_CPU = 4
"""``--workers`` is at most this many processes per usable CPU: more only share the same cores (docs/workers.md)."""


def max_workers() -> int:
    """The most ``--workers`` this machine takes: :data:`WORKERS_PER_CPU` per CPU this process may run on."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return WORKERS_PER_CPU * cpus


__all__ = [
    "MIN_STEP_TIMEOUT",
    "WORKERS_PER_CPU",
    "at_least_one",
    "at_most",
    "first_problem",
    "max_workers",
    "positive",
    "step_timeout",
]
