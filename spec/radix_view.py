"""What a radix-tree prefix cache shows beside the block ledger: its tree, lock counts and token accounting.

A radix cache (SGLang's RadixCache) keeps cached token paths in a tree: each node
holds a key (the tokens on the edge into it, whole pages of ``page_size`` tokens)
and a value (the KV slot of each of those tokens), a ``lock_ref`` per node instead
of a ref count per block, and its capacity in tokens: the allocator's free slots,
the tree's evictable size (unlocked nodes) and its protected size (locked nodes).

The kit holds such a cache at block granularity: one page of KV slots is one
block object, keyed by the whole token path from the root to the end of that page
(a split moves no page and changes no path, so keys survive splits). That ledger
cannot say what the tree itself promises, so a radix adapter also puts a
``RadixView`` under ``Observation.extra[RADIX]``; the radix invariants
(``spec.invariants.radix``) read it and do not apply to an adapter without one.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Literal, get_args

from .observation import Observation

RADIX = "radix"
"""The key of ``Observation.extra`` under which a radix adapter shows its RadixView."""

RadixOrder = Literal["radix_lru", "radix_lfu", "radix_fifo", "radix_priority"]
"""The eviction orders a radix cache declares (``Semantics.eviction``): leaves with ``lock_ref`` 0 are
evicted lowest rank key first, a parent joining the candidates when its last child goes (SGLang's
lru, lfu, fifo and priority strategies)."""

RADIX_ORDERS: tuple[RadixOrder, ...] = get_args(RadixOrder)


@dataclass(frozen=True)
class RadixNode:
    """One tree node as the implementation holds it.

    ``key``: the tokens on the edge from ``parent`` into this node; ``value``: the
    KV slot of each of them (equal lengths, whole pages). ``children``: the nodes
    the node's own child map lists. ``last_access``, ``created``, ``hits`` and
    ``priority`` are what the eviction orders rank by (None: not observed).
    """

    nid: Hashable
    parent: Hashable | None
    key: tuple[int, ...]
    value: tuple[int, ...]
    lock_ref: int
    children: tuple[Hashable, ...] = ()
    last_access: float | None = None
    created: float | None = None
    hits: int | None = None
    priority: float | None = None


@dataclass(frozen=True)
class RadixView:
    """The whole tree and its accounting at one instant.

    ``pool_tokens``: the KV slots of the pool; ``free_tokens``: the allocator's free
    slots; ``evictable_size`` / ``protected_size``: the tree's own counters (tokens
    in unlocked / locked nodes); ``rows``: the KV slots each running request's row
    holds, in token order; ``locks``: the node each running request holds a lock
    on (None: none).
    """

    page_size: int
    pool_tokens: int
    free_tokens: int
    evictable_size: int
    protected_size: int
    root: Hashable
    nodes: Mapping[Hashable, RadixNode]
    rows: Mapping[str, tuple[int, ...]]
    locks: Mapping[str, Hashable | None]

    def path(self, nid: Hashable, bound: int | None = None) -> tuple[int, ...] | None:
        """The tokens from the root to the end of ``nid``; None when the parent links do not reach the root."""
        parts: list[tuple[int, ...]] = []
        steps = len(self.nodes) + 1 if bound is None else bound
        node = self.nodes.get(nid)
        while node is not None and node.nid != self.root:
            parts.append(node.key)
            steps -= 1
            if steps < 0 or node.parent is None:
                return None
            node = self.nodes.get(node.parent)
        if node is None:
            return None
        return tuple(t for part in reversed(parts) for t in part)

    def tree_slots(self) -> dict[int, Hashable]:
        """Every KV slot a non-root node holds, to its node (the last one listed where two hold a slot)."""
        return {slot: n.nid for n in self.nodes.values() if n.nid != self.root for slot in n.value}

    def is_leaf(self, nid: Hashable) -> bool:
        return not self.nodes[nid].children


def radix_view(obs: Observation) -> RadixView | None:
    """The RadixView an observation carries, or None (not a radix adapter)."""
    view = obs.extra.get(RADIX)
    return view if isinstance(view, RadixView) else None


def _lru(n: RadixNode) -> tuple[float, ...] | None:
    return None if n.last_access is None else (n.last_access,)


def _lfu(n: RadixNode) -> tuple[float, ...] | None:
    return None if n.hits is None or n.last_access is None else (n.hits, n.last_access)


def _fifo(n: RadixNode) -> tuple[float, ...] | None:
    return None if n.created is None else (n.created,)


def _priority(n: RadixNode) -> tuple[float, ...] | None:
    return None if n.priority is None or n.last_access is None else (n.priority, n.last_access)


RANK_KEYS: dict[str, Callable[[RadixNode], tuple[float, ...] | None]] = {
    "radix_lru": _lru,
    "radix_lfu": _lfu,
    "radix_fifo": _fifo,
    "radix_priority": _priority,
}
"""Each radix order's rank key of a node (lowest evicted first); None when a feature it reads is unobserved.
Every key only grows when the node is used (a hit, an access, a higher priority), never shrinks."""


__all__ = ["RADIX", "RADIX_ORDERS", "RANK_KEYS", "RadixNode", "RadixOrder", "RadixView", "radix_view"]
