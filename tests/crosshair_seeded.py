"""Seeded contract violations for tests/test_crosshair.py: CrossHair must find each one.

Each class overrides one method of a reference simulator with a realistic
mistake and adds no contract of its own: the contracts it breaks are the
reference's, inherited (the docstrings of reference/lifecycle.py and
reference/scheduler.py).
"""

from __future__ import annotations

from kvspec.reference.lifecycle import LifecycleSim
from kvspec.reference.scheduler import SchedulerSim


class FloorRounding(LifecycleSim):
    """Blocks per record rounded down: a partial tail block is never paid for."""

    def blocks_for_tokens(self, n: int) -> int:
        if n <= 0:
            raise ValueError("token count must be positive")
        return max(n // self.block_size_tokens, 1)


class SizeBonus(SchedulerSim):
    """The size term's sign flipped: bigger entries are kept longer."""

    def score(self, hits: int, size: int, last_used: int) -> float:
        recency = 0.5 * (1.0 / (1.0 + max(self.time - last_used, 0)))
        return float(hits) + recency + 0.25 * (size / max(self.capacity_bytes, 1))
