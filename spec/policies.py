"""Eviction orders of the spec: which unreferenced cached object goes first.

A policy only orders the candidates; which objects are candidates is fixed by the
spec (at block granularity: cached blocks with ref_count 0, not hit by the
operation that needs room), so no policy can make an unsafe choice pass.

Block-granularity orders (``Semantics.eviction``), each a key over
``BlockFeatures``, lowest evicted first; docs/policies.md states the formulas:

- ``lru``: the free queue (the order in which blocks reached ref_count 0, the
  tail block of a request first). The queue head is popped, cached or not.
- ``score``: the scheduler simulator's retention score of a one-block entry,
  then the free queue.
- ``shared_aware``: ``retain_score`` (hits, share degree, branch factor, prefix
  depth), then the free queue.
- ``family_protect``: the free queue, with blocks of a protected prefix family
  (hits >= protect_min_hits) deferred while unprotected candidates remain.

For every order but ``lru``, uncached free blocks are taken before any cached
block is evicted: taking them evicts nothing.

The features are derived from what the ledger holds: a block's key stands for its
whole token prefix and names its parent's key, so its prefix depth and its cached
children follow from the key and the set of cached keys.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar

from .block_key import BlockKey, Prefix, parent_prefix

Oid = TypeVar("Oid", bound=Hashable)

BlockOrder = Literal["lru", "score", "shared_aware", "family_protect"]
BLOCK_ORDERS: tuple[BlockOrder, ...] = ("lru", "score", "shared_aware", "family_protect")

Feature = Literal["hits", "share_degree", "branch_factor", "prefix_depth", "last_used", "free_pos"]
FEATURES_USED: dict[BlockOrder, frozenset[Feature]] = {
    "lru": frozenset({"free_pos"}),
    "score": frozenset({"hits", "last_used", "free_pos"}),
    "shared_aware": frozenset({"hits", "share_degree", "branch_factor", "prefix_depth", "free_pos"}),
    "family_protect": frozenset({"hits", "free_pos"}),
}
"""What each order reads: a checker that cannot observe one of these cannot judge the order."""


def retention_score(hits: int, size: int, age: int, capacity: int) -> float:
    """Retention score of an entry: reuse bonus + recency bonus - size penalty.

    More hits never lower it, a more recent access never lowers it, a larger
    size never raises it.
    """
    recency = 1.0 / (1.0 + max(age, 0))
    return float(hits) + 0.5 * recency - 0.25 * (size / max(capacity, 1))


@dataclass(frozen=True)
class BlockFeatures:
    """What an order may read of one candidate block.

    hits: prefix hits on the block since it was last taken from the free queue.
    share_degree: the peak number of requests that referenced it at once, over
      the same span.
    branch_factor: distinct cached keys one block longer than its key that
      extend it (its cached children).
    prefix_depth: its position in its chain; 1 is the first block of a prompt.
    last_used: the clock of the last admission or append that touched it.
    free_pos: its place in the free queue; smaller joined earlier.
    """

    hits: int
    share_degree: int
    branch_factor: int
    prefix_depth: int
    last_used: int
    free_pos: int


def prefix_depth(key: Prefix, block_size: int) -> int:
    """The position of the block whose key is ``key`` in its chain (1-based): the chain length stored on the key."""
    return key.depth if isinstance(key, BlockKey) else len(key) // block_size


def child_counts(cached_keys: Iterable[Prefix], block_size: int) -> Counter[Prefix]:
    """Branch factor of every cached key: how many distinct cached keys extend it by one block (its children)."""
    counts: Counter[Prefix] = Counter()
    for key in set(cached_keys):
        parent = parent_prefix(key, block_size)
        if parent is not None:
            counts[parent] += 1
    return counts


def retain_score(f: BlockFeatures) -> float:
    """shared_aware's retain score: reuse, sharing and branching count one each; shallower breaks ties.

    hits + (share_degree - 1) + branch_factor + 1 / prefix_depth. The integer part
    never falls when a signal grows; the depth term lies in (0, 1], so it only
    orders blocks of equal integer part, the first block of a prompt last.
    """
    return float(f.hits + max(f.share_degree - 1, 0) + f.branch_factor) + 1.0 / max(f.prefix_depth, 1)


def is_protected(f: BlockFeatures, protect_min_hits: int) -> bool:
    """family_protect: a block of a protected prefix family, one reused at least ``protect_min_hits`` times."""
    return f.hits >= protect_min_hits


@dataclass(frozen=True)
class OrderParams:
    """The spec parameters an order reads besides the features.

    clock: any value >= every candidate's last_used gives the same ``score`` order
    (the recency term is strictly monotone in last_used, and it never outweighs one hit).
    """

    clock: int
    capacity: int = 1
    protect_min_hits: int = 1


def order_key(order: BlockOrder, f: BlockFeatures, params: OrderParams) -> tuple[float, ...]:
    """The sort key of a candidate under ``order``: the candidate with the smallest key is evicted first.

    The free queue position closes every key, so no two candidates tie.
    """
    if order == "lru":
        return (f.free_pos,)
    if order == "score":
        return (retention_score(f.hits, 1, params.clock - f.last_used, params.capacity), f.free_pos)
    if order == "shared_aware":
        return (retain_score(f), f.free_pos)
    if order == "family_protect":
        return (float(is_protected(f, params.protect_min_hits)), f.free_pos)
    raise ValueError(f"unknown block eviction order {order!r}")


def rank_key(order: BlockOrder, f: BlockFeatures, protect_min_hits: int = 1) -> tuple[float, ...]:
    """A key that orders candidates as ``order_key`` does, for any clock: one a ranking can keep across steps.

    Only ``score`` reads the clock: its retention score of a one-block entry is hits + 0.5 / (1 + age) + a
    constant, the recency term lies in (0, 0.5] and grows with last_used, so one more hit always outweighs it
    and, at equal hits, the later last_used ranks later: (hits, last_used, free_pos) is the same order.
    """
    if order == "score":
        return (float(f.hits), float(f.last_used), f.free_pos)
    return order_key(order, f, OrderParams(clock=0, protect_min_hits=protect_min_hits))


def victim(order: BlockOrder, candidates: Mapping[Oid, BlockFeatures], params: OrderParams) -> Oid:
    """The candidate ``order`` evicts first."""
    return min(candidates, key=lambda oid: order_key(order, candidates[oid], params))
