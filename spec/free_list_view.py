"""What an allocator's free list shows beside the block ledger.

Block allocators keep the blocks nobody references in a free list (vLLM's
doubly linked ``FreeKVCacheBlockQueue``, nano-vllm's ``free_block_ids`` deque):
allocation takes from its head, a freed block goes back to its tail, a prefix
hit on a cached free block takes it out of the middle. The ledger sees only its
length (``Observation.free`` and the cached ref-count-0 objects); a list whose
links disagree with its length, or a block that left the list but still says it
is in it, is invisible there until a later operation reads the stale links and
corrupts the list. An adapter that can read its list shows a ``FreeListView``
under ``Observation.extra[FREE_LIST]``; ``spec.invariants.free_list`` reads it.

A block is in the free list exactly when nothing references it: membership is
decided by the list's own structure (walked from its head), and every block
agrees with it about itself (``linked``: the blocks whose own fields say they
are listed).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from .observation import Observation

FREE_LIST = "free_list"
"""The key of ``Observation.extra`` under which an adapter shows its FreeListView."""


@dataclass(frozen=True)
class FreeListView:
    """The free list at one instant, as the allocator's own structure says.

    ``order``: the blocks walked from the head (at most one more than the pool
    holds); ``complete``: the walk reached the list's end within that bound;
    ``backward``: the same list walked from its tail and reversed (None where
    the list has no back links); ``linked``: the blocks whose own fields say
    they are listed (vLLM: a previous or next link; None where blocks carry
    no such field); ``counter``: the list's own length counter (None if it
    keeps none); ``unreferenced``: the blocks with ref count 0, placeholders
    (vLLM's null block) left out.
    """

    order: tuple[Hashable, ...]
    complete: bool
    backward: tuple[Hashable, ...] | None
    linked: frozenset[Hashable] | None
    counter: int | None
    unreferenced: frozenset[Hashable]


def free_list_view(obs: Observation) -> FreeListView | None:
    """The FreeListView an observation carries, or None (the adapter shows no free list)."""
    view = obs.extra.get(FREE_LIST)
    return view if isinstance(view, FreeListView) else None


__all__ = ["FREE_LIST", "FreeListView", "free_list_view"]
