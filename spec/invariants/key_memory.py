"""What the checker learns across transitions: the content behind each opaque key, and the free order."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..block_key import BlockKey, Prefix, block_keys
from ..delta import whole
from ..ledger import Content
from ..observation import Observation, RequestView
from ..ops import Semantics
from ..policies import BLOCK_ORDERS
from .policy_quality import PolicyQuality
from .ranking import CandidateRanking

if TYPE_CHECKING:
    from .transition import Transition


@dataclass
class KeyMemory:
    """What each cache key was seen to stand for, learned from the request tables.

    Implementations' keys are opaque (a block hash); the spec keys by content. At
    block granularity the content of the key of the i-th block of a request is the
    spec's chained BlockKey of the request's first (i+1)*block_size tokens (equal to
    that token tuple, which a hand-made memory may hold instead); at record and entry
    granularity the key is the prompt itself.
    """

    content: dict[Hashable, Prefix] = field(default_factory=dict)
    key_of: dict[Prefix, Hashable] = field(default_factory=dict)
    # Block granularity, learned across transitions by ``track`` (the policy checks read them):
    # the LRU order in which cached blocks reached ref_count 0 (oid -> sequence number, tail block first),
    free_order: dict[Hashable, int] = field(default_factory=dict)
    free_seq: int = 0
    # and each block's peak ref_count since it last left the free pool (its share degree).
    share_peak: dict[Hashable, int] = field(default_factory=dict)
    quality: PolicyQuality = field(default_factory=PolicyQuality)
    # Block granularity: each live request's tokens as last seen, and the keys of their full blocks.
    chains: dict[str, tuple[Content, list[BlockKey]]] = field(default_factory=dict)
    # Block granularity: when each cached block was first seen carrying its key (oid -> (key, sequence number)):
    # which duplicate of a key is the oldest or the newest, from the observations, not the index's order.
    keyed: dict[Hashable, tuple[Hashable, int]] = field(default_factory=dict)
    keyed_seq: int = 0
    # Block granularity: the objects that carry each key, as of the state last learned (the next step's before):
    # what the pool holds, whatever the index says (no_lost_hit and its twins read it).
    holders: dict[Hashable, set[Hashable]] = field(default_factory=dict)
    # Block granularity: the live requests whose last admission hit nothing (the admission gate's cold ones).
    cold: set[str] = field(default_factory=set)
    # Block granularity, steps taken as deltas: the eviction candidates ranked by the declared order, kept from
    # step to step (built from the whole state when a delta step first needs it; None on the full-check path).
    ranking: CandidateRanking | None = None

    @classmethod
    def of_state(cls, obs: Observation) -> KeyMemory:
        """A memory of one state and no history (the explicit-state search judges each transition so): which
        blocks carry each key, and the content of every key that is its own content (the spec's keys)."""
        memory = cls()
        for oid, obj in obs.objects.items():
            if obj.key is None:
                continue
            if isinstance(obj.key, (BlockKey, tuple)):
                memory.content.setdefault(obj.key, obj.key)
                memory.key_of.setdefault(obj.key, obj.key)
            memory.holders.setdefault(obj.key, set()).add(oid)
            memory.keyed[oid] = (obj.key, 0)
        return memory

    def block_keys(self, request: RequestView, block_size: int) -> list[BlockKey]:
        """The spec's keys of the request's full blocks, in order.

        Keeps ``chains[request.req]`` the keys of ``request.tokens``: while a request's
        tokens only grow (decode, append) the keys seen at earlier steps are kept and
        only its new full blocks are chained on, so a step costs O(blocks it added).
        """
        tokens = request.tokens
        old, keys = self.chains.get(request.req, ((), []))
        if not (old is tokens or (len(old) <= len(tokens) and tokens[: len(old)] == old)):
            keys = []
        keys.extend(block_keys(tokens, block_size, start=len(keys), parent=keys[-1] if keys else None))
        self.chains[request.req] = (tokens, keys)
        return keys

    def content_of(self, key: Hashable, semantics: Semantics) -> Prefix | None:
        """The tokens ``key`` stands for: the key itself above block granularity; None while not seen yet."""
        if semantics.granularity != "block":
            return key if isinstance(key, tuple) else None
        return self.content.get(key)

    def track(self, t: Transition, whole: Transition | None = None) -> None:
        """Learn from a checked transition what the policy checks need next: LRU order, share degrees, quality.

        Keeps: ``free_order`` holds exactly the cached blocks with ref_count 0 whose
        release was seen, numbered in the order they were released (a request's
        tail block first); ``share_peak`` holds every object of ``t.after``. On a delta step's
        local part (``t.touched``) the same, learned from the touched objects and requests only
        (the others did not change); policy quality, a measurement over the whole state, is
        counted on whole-state steps only: ``t`` itself, or ``whole``, the same step over the whole state
        (a K-th step), so under deltas its figures are a sample of every K-th step.
        """
        if t.semantics.granularity != "block":
            return
        touched = t.touched
        gone_reqs = set(self.chains) - set(t.after.requests) if touched is None else touched[1] - set(t.after.requests)
        for req in gone_reqs:
            self.chains.pop(req, None)
            self.cold.discard(req)
        if t.op.op in ("admit", "resume") and t.outcome.status == "ok" and t.op.req is not None:
            (self.cold.add if not t.outcome.hit_tokens else self.cold.discard)(t.op.req)
        judged = t if touched is None else whole
        if judged is not None:
            self.quality.add(judged, self, len([e for e in t.events if e.kind == "evict"]))  # reads the order before
        before, after = t.before, t.after
        left = {e.oid for e in t.events}
        for oid, obj in after.objects.items():
            fresh = oid in left or oid not in before.objects
            self.share_peak[oid] = obj.ref_count if fresh else max(self.share_peak.get(oid, 0), obj.ref_count)
        scope = set(self.share_peak) if touched is None else touched[0] | left
        for oid in scope - set(after.objects):
            self.share_peak.pop(oid, None)
        for oid in left:
            self.free_order.pop(oid, None)
        was = before.requests.get(t.op.req or "")
        if t.op.op in ("release", "preempt") and t.outcome.status == "ok" and was is not None:
            for oid in reversed(was.objects):
                freed = after.objects.get(oid)
                if freed is not None and freed.ref_count == 0 and freed.key is not None and oid not in self.free_order:
                    self.free_seq += 1
                    self.free_order[oid] = self.free_seq
        for oid in list(self.free_order) if touched is None else [o for o in touched[0] if o in self.free_order]:
            queued = after.objects.get(oid)
            if queued is None or queued.key is None or queued.ref_count:
                del self.free_order[oid]
        self._track_keyed(t, left)
        self._track_ranking(t, left)

    def ranking_of(self, t: Transition) -> CandidateRanking:
        """The candidates of ``t.before`` ranked by its declared block order (built from the whole state once)."""
        order = t.semantics.eviction
        assert order in BLOCK_ORDERS
        if self.ranking is None or self.ranking.order != order:
            self.ranking = CandidateRanking(order, t.config.block_size, t.semantics.protect_min_hits)
            self.ranking.rebuild(whole(t.before.objects), self)
        return self.ranking

    def _track_ranking(self, t: Transition, left: set[Hashable]) -> None:
        """Keep ``ranking`` the ranked candidates of ``t.after``: on a delta step from the objects it touched
        (those of the touched requests too: their keys' contents may be learned now), else from the whole."""
        if self.ranking is None or self.ranking.order != t.semantics.eviction:
            return
        if t.touched is None:
            self.ranking.rebuild(t.after.objects, self)
            return
        oids = set(t.touched[0]) | left
        for rid in t.touched[1]:
            request = t.after.requests.get(rid)
            if request is not None:
                oids.update(request.objects)
        self.ranking.update(oids, t.after.objects, self)

    def held(self, key: Hashable) -> set[Hashable]:
        """The objects that carried ``key`` in the state last learned (a step's before, while it is judged)."""
        return self.holders.get(key, set())

    def _track_keyed(self, t: Transition, left: set[Hashable]) -> None:
        """Keep ``keyed``: exactly the objects of ``t.after`` that carry a key, numbered when they got it; and
        ``holders``, the same objects by key."""
        self.keyed_seq += 1
        for oid, obj in t.after.objects.items():
            seen = self.keyed.get(oid)
            if obj.key is None:
                if seen is not None:
                    self._unhold(oid, seen[0])
            elif seen is None or seen[0] != obj.key or oid in left:
                if seen is not None:
                    self._unhold(oid, seen[0])
                self.keyed[oid] = (obj.key, self.keyed_seq)
                self.holders.setdefault(obj.key, set()).add(oid)
        scope = set(self.keyed) if t.touched is None else t.touched[0] | left
        for oid in scope - set(t.after.objects):
            seen = self.keyed.get(oid)
            if seen is not None:
                self._unhold(oid, seen[0])

    def _unhold(self, oid: Hashable, key: Hashable) -> None:
        """``oid`` no longer carries ``key``: out of ``keyed`` and ``holders``."""
        del self.keyed[oid]
        holders = self.holders.get(key)
        if holders is not None:
            holders.discard(oid)
            if not holders:
                del self.holders[key]
