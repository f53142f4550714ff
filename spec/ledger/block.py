"""The ledger at block granularity: paged blocks identified by their token prefix.

``capacity`` physical slots. A slot with ref_count 0 sits in the free queue
(LRU: head evicted first), cached or not; a referenced slot never does. The
index maps each cached key (the block's chained ``BlockKey``, which stands for
its whole prefix) to the slot found under it; further slots cached under the same key
(duplicate_keys ``indexed``: in insertion order; ``newest``: newest first) follow in
``duplicates``, so that a copy takes the entry when the one before it leaves the cache.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping

from ..block_key import BlockKey, Prefix, block_keys
from ..observation import ObjectView, Observation, RequestView
from ..ops import Config, Op, Outcome, Semantics, blocks_for
from ..policies import BlockFeatures, OrderParams, child_counts, prefix_depth, victim
from .base import CacheObject, LedgerModel, Operation, Request


class BlockLedger(LedgerModel, granularity="block"):
    """Paged blocks: slots, the free queue, the prefix index, duplicate keys and the eviction orders."""

    def __init__(self, config: Config, semantics: Semantics) -> None:
        super().__init__(config, semantics)
        self.slots = [CacheObject() for _ in range(config.capacity)]
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(config.capacity))
        self.index: dict[BlockKey, int] = {}
        self.duplicates: dict[BlockKey, list[int]] = {}
        # Slots that neither a request nor a cached key holds, counted where one becomes or stops being one:
        # a free slot leaves only by _pop_free, and one joins only when its last reference drops without a
        # key kept (_drop_references) or a reset reclaims it; no other step sets a key or a reference on a
        # slot in the free queue. O(1) per step instead of a scan of the pool.
        self._free = config.capacity
        self._adopted_lost = False  # adopt() took an implementation's state in which some keys are lost

    @property
    def free(self) -> int:
        """Slots that neither a request nor a cached key holds."""
        return self._free

    def _validation_view(self, op: Op) -> Observation:
        """The op's request only: at block granularity ``validate`` reads nothing else of the ledger."""
        request = self.requests.get(op.req) if op.req is not None else None
        requests = {}
        if op.req is not None and request is not None:
            requests[op.req] = RequestView(op.req, request.tokens, request.prompt_len, (), request.state)
        return Observation(self.config.capacity, self._free, {}, requests, {})

    def _objects(self) -> dict[object, ObjectView]:
        objects: dict[object, ObjectView] = {}
        for sid, slot in enumerate(self.slots):
            if slot.ref_count or slot.key is not None:
                objects[sid] = ObjectView(sid, 1, slot.tokens, slot.ref_count, slot.key, slot.hits, slot.last_used)
        return objects

    def lost(self) -> tuple[BlockKey, ...]:
        """The keys of slots that hold a key the index does not find: none, by construction.

        A slot gets a key only with its index entry (or queued behind it as a duplicate) and loses the entry
        only with its key, so the spec never loses a hit; only a ledger re-synchronised to an implementation
        that lost some (``adopt``) holds such slots, and only then is the pool scanned.
        """
        if not self._adopted_lost:
            return ()
        found = {*self.index.values(), *(sid for more in self.duplicates.values() for sid in more)}
        return tuple(s.key for sid, s in enumerate(self.slots) if isinstance(s.key, BlockKey) and sid not in found)

    def _index(self) -> dict[Hashable, tuple[object, ...]]:
        return {key: (sid, *self.duplicates.get(key, ())) for key, sid in self.index.items()}

    def _operations(self) -> Mapping[str, Operation]:
        return {
            "admit": self._admit,
            "append": self._append,
            "release": self._release,
            "preempt": self._preempt,
            "resume": self._resume,
            "reset_cache": self._reset_cache,
        }

    # -- the index and the free queue -------------------------------------------------
    def _block_keys(self, request: Request) -> list[BlockKey]:
        """The keys of the request's full blocks, in order: ``request.block_keys``, chained on as its tokens grew.

        Each block's key is built once, from its parent's, so keying a request of n tokens costs O(n).
        """
        keys, bs = request.block_keys, self.config.block_size
        parent = keys[-1] if keys else None
        keys.extend(block_keys(request.tokens, bs, start=len(keys), parent=parent))
        return keys

    def _unindex(self, key: BlockKey, sid: int) -> None:
        """Drop slot ``sid`` from the index under ``key``; the next duplicate, if any, takes its place."""
        more = self.duplicates.get(key, [])
        if self.index.get(key) == sid:
            if more:
                self.index[key] = more.pop(0)
            else:
                del self.index[key]
        elif sid in more:
            more.remove(sid)
        if not more:
            self.duplicates.pop(key, None)

    def _pop_free(self, n: int) -> list[int]:
        """Take ``n`` slots from the free queue, evicting cached ones; each comes back with ref_count 1.

        An evicted slot leaves the index first, so the index never names a reused
        slot. lru pops the head, cached or not. Every other order takes the first
        uncached slot while there is one, and only then evicts the cached slot
        its order ranks first among all cached ones in the queue.
        """
        taken = []
        for _ in range(n):
            sid = self._next_free()
            del self.free_queue[sid]
            slot = self.slots[sid]
            if isinstance(slot.key, BlockKey):
                self._unindex(slot.key, sid)
                self._evicted.append(slot.key)
                self._evicted_slots.append(sid)
            elif slot.key is None:
                self._free -= 1
            self.slots[sid] = CacheObject(ref_count=1, last_used=self.clock, share_degree=1)
            taken.append(sid)
        return taken

    def _next_free(self) -> int:
        """The slot the next allocation takes from the free queue."""
        if self.semantics.eviction == "lru":
            return next(iter(self.free_queue))
        for sid in self.free_queue:
            if self.slots[sid].key is None:
                return sid
        return self._policy_victim()

    def block_features(self) -> dict[int, BlockFeatures]:
        """The features of every cached slot in the free queue: the eviction candidates, by slot."""
        bs = self.config.block_size
        children = child_counts(self.index, bs)
        features = {}
        for pos, sid in enumerate(self.free_queue):
            slot = self.slots[sid]
            if slot.key is None:
                continue
            features[sid] = BlockFeatures(
                hits=slot.hits,
                share_degree=slot.share_degree,
                branch_factor=children[slot.key],
                prefix_depth=prefix_depth(slot.key, bs),
                last_used=slot.last_used,
                free_pos=pos,
            )
        return features

    def _policy_victim(self) -> int:
        """The cached slot in the free queue that the declared order evicts first."""
        order = self.semantics.eviction
        assert order in ("score", "shared_aware", "family_protect")
        params = OrderParams(self.clock, self.config.capacity, self.semantics.protect_min_hits)
        return victim(order, self.block_features(), params)

    # -- a request's blocks -------------------------------------------------------------
    def _cache_full_blocks(self, request: Request, start: int) -> None:
        """Give every full block from ``start`` on its key, unless the key is cached already (duplicate_keys).

        Keeps one index entry per key: a duplicate stays uncached (unkeyed), queues
        behind the first (indexed), or takes the entry with the older
        copies queued behind it, newest first (newest). Blocks at or past the
        request's cache_limit (the admission gate) stay uncached.
        """
        keys = self._block_keys(request)
        full = len(keys) if self.semantics.prefix_caching else 0
        if request.cache_limit is not None:
            full = min(full, request.cache_limit)
        for i in range(start, full):
            key = keys[i]
            sid = request.objects[i]
            assert isinstance(sid, int)
            if key not in self.index:
                self.index[key] = sid
                self.slots[sid].key = key
            elif self.semantics.duplicate_keys == "indexed":
                self.duplicates.setdefault(key, []).append(sid)
                self.slots[sid].key = key
            elif self.semantics.duplicate_keys == "newest":
                self.duplicates.setdefault(key, []).insert(0, self.index[key])
                self.index[key] = sid
                self.slots[sid].key = key

    def _fill_tokens(self, request: Request) -> None:
        """Each block of the request holds its share of the tokens: B, the tail block the rest."""
        bs, n = self.config.block_size, len(request.tokens)
        for i, sid in enumerate(request.objects):
            assert isinstance(sid, int)
            self.slots[sid].tokens = min(bs, n - i * bs)

    def _admission(self, rid: str, request: Request) -> Outcome:
        """Hit the longest cached chain of full blocks (hit-capped), pop the rest from the free queue.

        All or nothing: refused, before anything changes, unless the free queue
        holds the new blocks and the cached-free hit blocks that leave it.
        """
        bs, n = self.config.block_size, len(request.tokens)
        keys = self._block_keys(request)
        hit_blocks = 0
        while hit_blocks < len(keys) and keys[hit_blocks] in self.index:
            hit_blocks += 1
        if self.semantics.hit_cap:
            hit_blocks = min(hit_blocks, (n - 1) // bs)
        hits = [self._lookup(keys[i]) for i in range(hit_blocks)]
        need = blocks_for(n, bs) - hit_blocks
        leaving_free = sum(1 for sid in hits if sid in self.free_queue)
        if need + leaving_free > len(self.free_queue):
            return Outcome.refused("not enough free or evictable blocks")
        for sid in hits:
            self.free_queue.pop(sid, None)
            slot = self.slots[sid]
            slot.ref_count += 1
            slot.hits += 1
            slot.last_used = self.clock
            slot.share_degree = max(slot.share_degree, slot.ref_count)
        anchor = self.semantics.admission_anchor_blocks
        request.cache_limit = anchor if anchor is not None and hit_blocks == 0 else None
        request.objects = [*hits, *self._pop_free(need)]
        request.state = "running"
        self.requests[rid] = request
        self._fill_tokens(request)
        self._cache_full_blocks(request, hit_blocks)
        return Outcome.ok(hit_blocks * bs)

    def _lookup(self, key: BlockKey) -> int:
        """The slot a hit on ``key`` takes: the index's entry; with hit_prefers_held, the first copy a request holds."""
        sid = self.index[key]
        if self.semantics.hit_prefers_held and not self.slots[sid].ref_count:
            return next((d for d in self.duplicates.get(key, ()) if self.slots[d].ref_count), sid)
        return sid

    def _drop_references(self, request: Request, keep: bool, *, key_computed: bool = True) -> None:
        """Drop the request's references, tail block first; a block at ref_count 0 joins the free queue's tail.

        Keeps the free queue exactly the slots with ref_count 0. Without ``keep``
        a freed cached block is reclaimed (unindexed and emptied). With ``keep``
        every full block the request computed stays findable: an uncached
        duplicate (unkeyed) whose key no other block holds now takes it. With
        free_uncached="head", the freed blocks that hold no key go to the head
        instead, in the same order (the request's tail block first).
        """
        to_head: list[int] = []
        keys, limit = request.block_keys, request.cache_limit
        for i in reversed(range(len(request.objects))):
            sid = request.objects[i]
            assert isinstance(sid, int)
            slot = self.slots[sid]
            slot.ref_count -= 1
            if slot.ref_count:
                continue
            cacheable = self.semantics.prefix_caching and i < len(keys) and (limit is None or i < limit)
            if keep and key_computed and slot.key is None and cacheable and keys[i] not in self.index:
                slot.key = keys[i]  # the last copy of what the request computed: cached, not dropped
                self.index[keys[i]] = sid
            if isinstance(slot.key, BlockKey) and not keep:
                self._unindex(slot.key, sid)
                self._reclaimed.append(slot.key)
                self._reclaimed_slots.append(sid)
                slot.key = None
            if slot.key is None:
                self.slots[sid] = CacheObject()
                self._free += 1
                if self.semantics.free_uncached == "head":
                    to_head.append(sid)
                    continue
            self.free_queue[sid] = None
        for sid in reversed(to_head):
            self.free_queue[sid] = None
            self.free_queue.move_to_end(sid, last=False)
        request.objects = []

    # -- re-synchronisation ----------------------------------------------------------------
    def adopt(
        self, obs: Observation, content: Callable[[Hashable], Prefix | None], released: Mapping[Hashable, int]
    ) -> None:
        """Take the implementation's state as this ledger's, after a violation the run steps past.

        Adopted: the objects (ref counts, tokens, hits, keys by the content the checker learned for them),
        the requests and their tables, and the index as the implementation shows it (an entry the pool
        does not back is dropped; a key no entry finds stays lost). The spec's own: the slot numbers, the
        clock, and the free queue's order, kept where a slot's content was in it and otherwise the order in
        which the checker saw blocks released (``released``), uncached blocks first.
        """
        cap = self.config.capacity
        slot_of: dict[Hashable, int] = {}
        for oid in obs.objects:  # keep an implementation's slot numbers where they fit the pool
            if isinstance(oid, int) and 0 <= oid < cap and oid not in slot_of.values():
                slot_of[oid] = oid
        spare = iter(sid for sid in range(cap) if sid not in slot_of.values())
        for oid in obs.objects:
            if oid not in slot_of:
                slot_of[oid] = next(spare)
        old_queue = [self.slots[sid].key for sid in self.free_queue]
        self.slots = [CacheObject() for _ in range(cap)]
        for oid, o in obs.objects.items():
            key = content(o.key) if o.key is not None else None
            self.slots[slot_of[oid]] = CacheObject(
                key if isinstance(key, BlockKey) else None, o.tokens, 1, o.ref_count, o.hits or 0, o.last_used or 0
            )
        self.requests = {
            rid: Request(r.tokens, r.prompt_len, [slot_of[o] for o in r.objects if o in slot_of], r.state)
            for rid, r in obs.requests.items()
        }
        for request in self.requests.values():
            self._block_keys(request)
        self._adopt_index(obs, slot_of, content)
        self._adopt_queue(old_queue, {slot_of[o]: n for o, n in released.items() if o in slot_of})
        self._free = sum(1 for slot in self.slots if not slot.ref_count and slot.key is None)

    def _adopt_index(
        self, obs: Observation, slot_of: Mapping[Hashable, int], content: Callable[[Hashable], Prefix | None]
    ) -> None:
        """The index as ``obs`` shows it, by content; every keyed slot when the implementation shows none."""
        self.index, self.duplicates = {}, {}
        shown = obs.index
        if shown is None:
            shown = {}
            for oid, o in obs.objects.items():
                if o.key is not None:
                    shown[o.key] = (*shown.get(o.key, ()), oid)
        for key, oids in shown.items():
            spec_key = content(key)
            backed = [slot_of[o] for o in oids if o in slot_of and self.slots[slot_of[o]].key == spec_key]
            if isinstance(spec_key, BlockKey) and backed and spec_key not in self.index:
                self.index[spec_key] = backed[0]
                if backed[1:]:
                    self.duplicates[spec_key] = backed[1:]
        found = {*self.index.values(), *(sid for more in self.duplicates.values() for sid in more)}
        self._adopted_lost = any(s.key is not None and sid not in found for sid, s in enumerate(self.slots))

    def _adopt_queue(self, old_queue: list[Prefix | None], released: Mapping[int, int]) -> None:
        """The free queue: the unreferenced slots, in the old queue's order of contents where it had them."""
        by_key: dict[Prefix | None, list[int]] = {}
        for sid, slot in enumerate(self.slots):
            if not slot.ref_count:
                by_key.setdefault(slot.key, []).append(sid)
        placed = [by_key[key].pop(0) for key in old_queue if by_key.get(key)]
        rest = sorted(
            (sid for sids in by_key.values() for sid in sids),
            key=lambda sid: (self.slots[sid].key is not None, released.get(sid, 0), sid),
        )
        self.free_queue = OrderedDict.fromkeys([*placed, *rest])

    # -- the operations -------------------------------------------------------------------
    def _admit(self, op: Op) -> Outcome:
        """A new request: the admission of its prompt."""
        assert op.req is not None
        return self._admission(op.req, Request(op.tokens, len(op.tokens)))

    def _resume(self, op: Op) -> Outcome:
        """Re-admit a preempted request's tokens; refused, it stays preempted as it was."""
        assert op.req is not None
        waiting = self.requests[op.req]
        fresh = Request(waiting.tokens, waiting.prompt_len, block_keys=list(waiting.block_keys))
        outcome = self._admission(op.req, fresh)
        if outcome.status != "ok":
            self.requests[op.req] = waiting
        return outcome

    def _append(self, op: Op) -> Outcome:
        """Pop the blocks past the tail block and key the blocks that became full; refused, nothing changes."""
        assert op.req is not None
        request = self.requests[op.req]
        bs = self.config.block_size
        old_full = len(request.tokens) // bs
        total = len(request.tokens) + len(op.tokens)
        need = blocks_for(total, bs) - len(request.objects)
        if need > len(self.free_queue):
            return Outcome.refused("not enough free or evictable blocks")
        request.objects.extend(self._pop_free(need))
        request.tokens = request.tokens + op.tokens
        self._fill_tokens(request)
        self._cache_full_blocks(request, old_full)
        for sid in request.objects[-1:]:
            assert isinstance(sid, int)
            self.slots[sid].last_used = self.clock
        return Outcome.ok()

    def _release(self, op: Op) -> Outcome:
        """Forget the request and drop its references; with ``keep`` its cached blocks stay cached."""
        assert op.req is not None
        self._drop_references(self.requests.pop(op.req), op.keep)
        return Outcome.ok()

    def _preempt(self, op: Op) -> Outcome:
        """Free like a kept release; the request stays, preempted, with its tokens."""
        assert op.req is not None
        request = self.requests[op.req]
        self._drop_references(request, keep=True, key_computed=self.semantics.preempt_keeps == "computed")
        request.state = "preempted"
        return Outcome.ok()

    def _reset_cache(self, op: Op) -> Outcome:
        """Reclaim every cached block no request references (refused while any is, with reset_requires_idle)."""
        if self.semantics.reset_requires_idle and any(s.ref_count for s in self.slots):
            return Outcome.refused("blocks are in use")
        for sid, slot in enumerate(self.slots):
            if isinstance(slot.key, BlockKey) and not slot.ref_count:
                self._reclaimed.append(slot.key)
                self._reclaimed_slots.append(sid)
                self._unindex(slot.key, sid)
                self.slots[sid] = CacheObject()
                self._free += 1
        return Outcome.ok()
