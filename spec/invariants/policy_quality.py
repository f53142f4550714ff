"""How well an eviction order used the cache: a measurement over the run, not a verdict on a step."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..block_key import parent_prefix
from ..observation import Observation
from ..ops import Config, Semantics
from .transition import Transition, eviction_candidates

if TYPE_CHECKING:
    from .key_memory import KeyMemory


@dataclass
class PolicyQuality:
    """How well an eviction order used the cache: a report, not a safety verdict.

    A cached block whose parent block is no longer cached can never be hit again
    (a hit walks the chain from its first block), yet it holds a block until it is
    evicted: an orphan. Counted per step over unreferenced cached blocks.
    """

    steps: int = 0
    block_steps: int = 0  # capacity summed over steps
    orphan_block_steps: int = 0
    orphans_max: int = 0
    evictions: int = 0
    evictions_with_choice: int = 0  # evictions that had more than one candidate
    evictions_off_lru: int = 0  # evictions of another block than the LRU order's first candidate
    lost_block_steps: int = 0  # cached blocks whose key no index entry finds (lost hits), summed over steps
    lost_max: int = 0

    def add(self, t: Transition, memory: KeyMemory, evictions: int) -> None:
        """Count one block-granularity step, reading ``memory`` as it was before the step."""
        self.steps += 1
        self.block_steps += t.after.capacity
        self.evictions += evictions
        if evictions:  # both count evictions only: none, nothing to rank
            self.evictions_with_choice += sum(1 for n in eviction_choices(t) if n > 1)
            self.evictions_off_lru += _off_lru(t, memory)
        orphans = len(orphaned_blocks(t.after, t.config, t.semantics, memory))
        self.orphan_block_steps += orphans
        self.orphans_max = max(self.orphans_max, orphans)
        lost = len(lost_hit_blocks(t.after))
        self.lost_block_steps += lost
        self.lost_max = max(self.lost_max, lost)

    def merge(self, other: PolicyQuality) -> None:
        """Add another run's counts to these."""
        self.steps += other.steps
        self.block_steps += other.block_steps
        self.orphan_block_steps += other.orphan_block_steps
        self.orphans_max = max(self.orphans_max, other.orphans_max)
        self.evictions += other.evictions
        self.evictions_with_choice += other.evictions_with_choice
        self.evictions_off_lru += other.evictions_off_lru
        self.lost_block_steps += other.lost_block_steps
        self.lost_max = max(self.lost_max, other.lost_max)

    def to_json(self) -> dict[str, int | float]:
        return {
            "steps": self.steps,
            "evictions": self.evictions,
            "evictions_with_choice": self.evictions_with_choice,
            "evictions_off_lru": self.evictions_off_lru,
            "orphan_block_steps": self.orphan_block_steps,
            "orphans_max": self.orphans_max,
            "orphan_capacity_share": round(self.orphan_block_steps / self.block_steps, 6) if self.block_steps else 0.0,
            "lost_block_steps": self.lost_block_steps,
            "lost_max": self.lost_max,
            "lost_capacity_share": round(self.lost_block_steps / self.block_steps, 6) if self.block_steps else 0.0,
        }


def _off_lru(t: Transition, memory: KeyMemory) -> int:
    """Evictions of the step that did not take the candidate first in the LRU release order (where it is known).

    Called before ``memory`` forgets this step's evicted blocks.
    """
    candidates, off = eviction_candidates(t), 0
    for e in t.events:
        if e.kind != "evict" or e.oid not in candidates:
            continue
        known = {oid: memory.free_order[oid] for oid in candidates if oid in memory.free_order}
        if len(known) == len(candidates) and min(known, key=known.__getitem__) != e.oid:
            off += 1
        candidates.discard(e.oid)
    return off


def orphaned_blocks(obs: Observation, config: Config, semantics: Semantics, memory: KeyMemory) -> list[Hashable]:
    """Unreferenced cached blocks whose parent prefix is not cached: they hold capacity and can never be hit."""
    if semantics.granularity != "block":
        return []
    if not any(o.ref_count == 0 and o.key is not None for o in obs.objects.values()):
        return []  # an orphan is an unreferenced cached block: there is none
    bs = config.block_size
    learned = memory.content  # block granularity: what ``memory.content_of`` answers, read without a call per block
    contents = {oid: learned.get(o.key) for oid, o in obs.objects.items() if o.key is not None}
    cached = {c for c in contents.values() if c is not None}
    parents = {oid: parent_prefix(c, bs) for oid, c in contents.items() if c is not None}
    return [
        oid
        for oid, parent in parents.items()
        if parent is not None and parent not in cached and obs.objects[oid].ref_count == 0
    ]


def lost_hit_blocks(obs: Observation) -> list[Hashable]:
    """Cached blocks whose key no index entry finds: capacity a lookup can never hit (none without an index)."""
    if obs.index is None:
        return []
    return [oid for oid, o in obs.objects.items() if o.key is not None and o.key not in obs.index]


def eviction_choices(t: Transition) -> list[int]:
    """Block granularity: how many candidates each eviction of the step chose from, in event order."""
    if t.semantics.granularity != "block":
        return []
    candidates, counts = eviction_candidates(t), []
    for e in t.events:
        if e.kind == "evict":
            counts.append(len(candidates))
            candidates.discard(e.oid)
    return counts
