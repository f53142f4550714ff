"""The eviction candidates of a block pool, kept ranked by the declared order from step to step.

policy_conformance on a whole state ranks every candidate at every eviction: O(candidates) per eviction.
On a delta step (spec.delta) the pool outside the step's touched objects is unchanged, so the ranking
of the step before still holds for it: ``CandidateRanking`` keeps every candidate's rank key in a heap
(lazy deletion) and re-keys only the objects a step touched, and, for an order that reads the branch
factor, the cached blocks whose children the step changed. A step's evictions then cost
O(evictions x log pool).
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..block_key import Prefix, parent_prefix
from ..observation import ObjectView
from ..policies import FEATURES_USED, BlockFeatures, BlockOrder, prefix_depth, rank_key

if TYPE_CHECKING:
    from .key_memory import KeyMemory

RankKey = tuple[float, ...]


def block_features(
    o: ObjectView,
    free_pos: int | None,
    share_peak: int | None,
    content: Prefix | None,
    order: BlockOrder,
    block_size: int,
    branch_factor: int = 0,
) -> BlockFeatures | None:
    """The features ``order`` ranks a candidate by, as observed; None when one it reads is not observable."""
    need = FEATURES_USED[order]
    if (
        free_pos is None
        or ("hits" in need and o.hits is None)
        or ("last_used" in need and o.last_used is None)
        or ("share_degree" in need and share_peak is None)
        or ("prefix_depth" in need and content is None)
    ):
        return None
    return BlockFeatures(
        hits=o.hits or 0,
        share_degree=share_peak or 0,
        branch_factor=branch_factor,
        prefix_depth=prefix_depth(content, block_size) if content is not None else 0,
        last_used=o.last_used or 0,
        free_pos=free_pos,
    )


@dataclass
class CandidateRanking:
    """The candidates of a block pool (cached blocks with ref_count 0) ranked by ``order``, kept across steps.

    Invariant, after :meth:`update` of a step's touched oids (or :meth:`rebuild` on a whole state):
    ``features``/``keys`` hold exactly the candidates whose features the checker observes, each with the
    features and ``rank_key`` policy_conformance would compute on the whole state from the same
    observation and KeyMemory; ``unjudgeable`` the candidates with a feature unobserved; ``content`` every
    keyed object whose content KeyMemory knows, ``unknown_content`` the keyed others; ``children[c]`` the
    number of distinct cached contents one block longer than ``c`` that extend it (policies.child_counts of
    the cached contents). Every live heap entry ``(key, oid)`` has ``keys[oid] == key``; stale ones are
    skipped and dropped when met.
    """

    order: BlockOrder
    block_size: int
    protect_min_hits: int
    features: dict[Hashable, BlockFeatures] = field(default_factory=dict)
    keys: dict[Hashable, RankKey] = field(default_factory=dict)
    heap: list[tuple[RankKey, Hashable]] = field(default_factory=list)
    unjudgeable: set[Hashable] = field(default_factory=set)
    content: dict[Hashable, Prefix] = field(default_factory=dict)
    unknown_content: set[Hashable] = field(default_factory=set)
    holders: Counter[Prefix] = field(default_factory=Counter)  # content -> cached objects that carry it
    by_content: dict[Prefix, set[Hashable]] = field(default_factory=dict)
    children: Counter[Prefix] = field(default_factory=Counter)

    @property
    def reads_children(self) -> bool:
        return "branch_factor" in FEATURES_USED[self.order]

    def rebuild(self, objects: Mapping[Hashable, ObjectView], memory: KeyMemory) -> None:
        """Rank the whole state ``objects`` afresh (O(pool)): the base the steps' updates keep."""
        self.features, self.keys, self.heap, self.unjudgeable = {}, {}, [], set()
        self.content, self.unknown_content, self.holders, self.by_content = {}, set(), Counter(), {}
        self.children = Counter()
        self.update(objects, objects, memory)
        self._compact()

    def update(self, oids: Iterable[Hashable], objects: Mapping[Hashable, ObjectView], memory: KeyMemory) -> None:
        """Re-rank ``oids`` (a step's touched objects) as ``objects`` (the state after it) and ``memory`` show them.

        Objects outside ``oids`` keep their rank: their view and what KeyMemory holds of them did not change,
        except the branch factor of a cached block whose children changed, which is re-ranked here too.
        """
        parents: set[Prefix] = set()
        for oid in oids:
            parents |= self._set_content(oid, objects.get(oid), memory)
            self._rank(oid, objects.get(oid), memory)
        if self.reads_children:
            for parent in parents:
                for oid in self.by_content.get(parent, ()):
                    self._rank(oid, objects.get(oid), memory)
        if len(self.heap) > 2 * len(self.keys) + 64:
            self._compact()

    def _set_content(self, oid: Hashable, obj: ObjectView | None, memory: KeyMemory) -> set[Prefix]:
        """Record ``oid``'s cached content; the parents whose count of cached children this changed."""
        changed: set[Prefix] = set()
        old = self.content.pop(oid, None)
        self.unknown_content.discard(oid)
        if old is not None:
            self.by_content[old].discard(oid)
            self.holders[old] -= 1
            if not self.holders[old]:
                del self.holders[old], self.by_content[old]
                changed |= self._child(old, -1)
        if obj is None or obj.key is None:
            return changed
        new = memory.content.get(obj.key)
        if new is None:
            self.unknown_content.add(oid)
            return changed
        self.content[oid] = new
        self.by_content.setdefault(new, set()).add(oid)
        self.holders[new] += 1
        if self.holders[new] == 1:
            changed |= self._child(new, +1)
        return changed

    def _child(self, content: Prefix, step: int) -> set[Prefix]:
        parent = parent_prefix(content, self.block_size)
        if parent is None:
            return set()
        self.children[parent] += step
        if not self.children[parent]:
            del self.children[parent]
        return {parent}

    def _rank(self, oid: Hashable, obj: ObjectView | None, memory: KeyMemory) -> None:
        self.features.pop(oid, None)
        self.keys.pop(oid, None)
        self.unjudgeable.discard(oid)
        if obj is None or obj.ref_count != 0 or obj.key is None:
            return
        f = self._features(oid, obj, memory)
        if f is None:
            self.unjudgeable.add(oid)
            return
        key = rank_key(self.order, f, self.protect_min_hits)
        self.features[oid], self.keys[oid] = f, key
        heapq.heappush(self.heap, (key, oid))

    def _features(self, oid: Hashable, o: ObjectView, memory: KeyMemory) -> BlockFeatures | None:
        """What policy_conformance's _observed_features reads of one candidate, branch factor included."""
        content = self.content.get(oid)
        children = self.children.get(content, 0) if content is not None and self.reads_children else 0
        pos, share = memory.free_order.get(oid), memory.share_peak.get(oid)
        return block_features(o, pos, share, content, self.order, self.block_size, children)

    def _compact(self) -> None:
        self.heap = [(key, oid) for oid, key in self.keys.items()]
        heapq.heapify(self.heap)

    def judgeable(self) -> bool:
        """Whether every candidate's features are observed (and, for an order that reads the branch factor,
        every cached key's content known): otherwise the order cannot be judged, as on the whole state."""
        return not self.unjudgeable and not (self.reads_children and self.unknown_content)

    def first(
        self,
        skip: set[Hashable],
        dropped: set[Hashable],
        moved: Mapping[Hashable, RankKey],
        moved_heap: list[tuple[RankKey, Hashable]],
    ) -> Hashable | None:
        """The candidate ranked first, leaving out ``skip``; ``moved`` overrides some candidates' keys.

        ``dropped`` (within ``skip``): candidates this step evicted; their heap entries are let go for good,
        as :meth:`update` re-ranks every object a step touched. ``moved_heap`` holds ``moved``'s entries
        (stale ones skipped). O((stale + skipped + 1) x log pool): other entries popped to reach the first
        are pushed back.
        """
        aside: list[tuple[RankKey, Hashable]] = []
        best: tuple[RankKey, Hashable] | None = None
        while self.heap:
            key, oid = self.heap[0]
            if self.keys.get(oid) != key or oid in dropped:
                heapq.heappop(self.heap)
            elif oid in skip or oid in moved:
                aside.append(heapq.heappop(self.heap))
            else:
                best = (key, oid)
                break
        for entry in aside:
            heapq.heappush(self.heap, entry)
        while moved_heap:
            key, oid = moved_heap[0]
            if moved.get(oid) != key or oid in skip:
                heapq.heappop(moved_heap)
                continue
            if best is None or key < best[0]:
                best = (key, oid)
            break
        return None if best is None else best[1]
