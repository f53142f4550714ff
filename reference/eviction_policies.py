"""Eviction policies of the paged prefix cache: each orders the blocks that may be evicted.

A policy sees only candidates the pool hands it (cached blocks with ref_cnt 0)
and returns them in eviction order, first evicted first. It cannot widen the
set: whatever it ranks, the pool never evicts a block in use.

This module is an implementation under test: it imports nothing of the kit. The
formulas are written down in docs/policies.md; the kit's spec states them
independently (spec/policies.py) and the stateful suite holds the two together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class BlockStats:
    """One candidate block as the pool's side table sees it at the moment of eviction.

    hit_count: prefix hits since the block was last taken from the free queue.
    share_degree: the most requests that held it at once over the same span.
    branch_factor: cached blocks whose parent is this block.
    prefix_depth: its position in its hash chain, 1 for a prompt's first block.
    last_used: the pool clock of the last allocate/append that touched it.
    free_seq: when it joined the free queue; smaller joined earlier.
    clock: the pool clock when these stats were taken.
    """

    block_id: int
    block_hash: bytes | None
    hit_count: int
    share_degree: int
    branch_factor: int
    prefix_depth: int
    last_used: int
    free_seq: int
    clock: int = 0


class EvictionPolicy(Protocol):
    """Orders eviction candidates; ``retain_score`` is what the policy would log for a block."""

    name: str

    def order(self, candidates: Sequence[BlockStats]) -> list[BlockStats]:
        """The candidates, first evicted first."""
        ...

    def retain_score(self, stats: BlockStats) -> float | None:
        """How much the policy wants to keep the block (None: the policy keeps no score)."""
        ...


class LRUPolicy:
    """vLLM's free queue order: the block that joined the free queue first goes first."""

    name = "lru"

    def order(self, candidates: Sequence[BlockStats]) -> list[BlockStats]:
        return sorted(candidates, key=lambda s: s.free_seq)

    def retain_score(self, stats: BlockStats) -> float | None:
        return None


class ScorePolicy:
    """The scheduler simulator's retention score of a one-block entry, lowest first, then free queue order."""

    name = "score"

    def __init__(self, capacity: int = 1) -> None:
        self.capacity = capacity

    def retain_score(self, stats: BlockStats) -> float | None:
        # Term for term as SchedulerSim.score, so ranks agree bit for bit.
        age = stats.clock - stats.last_used
        return float(stats.hit_count) + 0.5 * (1.0 / (1.0 + max(age, 0))) - 0.25 * (1 / max(self.capacity, 1))

    def order(self, candidates: Sequence[BlockStats]) -> list[BlockStats]:
        return sorted(candidates, key=lambda s: (self.retain_score(s), s.free_seq))


class SharedAwarePolicy:
    """Lowest retain score first: reuse, sharing and branching each add one; a shallower block is kept longer."""

    name = "shared_aware"

    def retain_score(self, stats: BlockStats) -> float | None:
        reuse = stats.hit_count + max(stats.share_degree - 1, 0) + stats.branch_factor
        return float(reuse) + 1.0 / max(stats.prefix_depth, 1)

    def order(self, candidates: Sequence[BlockStats]) -> list[BlockStats]:
        return sorted(candidates, key=lambda s: (self.retain_score(s), s.free_seq))


class FamilyProtectPolicy:
    """Free queue order, but blocks of a protected family (hit at least ``protect_min_hits`` times) go last."""

    name = "family_protect"

    def __init__(self, protect_min_hits: int = 1) -> None:
        if protect_min_hits < 0:
            raise ValueError("protect_min_hits must not be negative")
        self.protect_min_hits = protect_min_hits

    def protected(self, stats: BlockStats) -> bool:
        return stats.hit_count >= self.protect_min_hits

    def retain_score(self, stats: BlockStats) -> float | None:
        return 1.0 if self.protected(stats) else 0.0

    def order(self, candidates: Sequence[BlockStats]) -> list[BlockStats]:
        # Stable: the free queue order within the unprotected and within the protected.
        in_queue = sorted(candidates, key=lambda s: s.free_seq)
        return [s for s in in_queue if not self.protected(s)] + [s for s in in_queue if self.protected(s)]


POLICIES: dict[str, Callable[..., EvictionPolicy]] = {
    "lru": LRUPolicy,
    "score": ScorePolicy,
    "shared_aware": SharedAwarePolicy,
    "family_protect": FamilyProtectPolicy,
}
