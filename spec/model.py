"""The executable spec: a ledger of cache objects and the request-level step function.

One ledger, three granularities (DESIGN.md): paged blocks identified by their
token prefix, shared prefix records, and byte-sized entries with a retention
score. Keys in the spec are the token content itself (a block's whole prefix, a
record's or entry's prompt): exact, collision-free, and independent of any
implementation's hash function.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field

from .observation import ObjectView, Observation, RequestView
from .ops import Config, Op, Outcome, Semantics, SpecError, blocks_for, size_of
from .policies import BlockFeatures, OrderParams, child_counts, prefix_depth, retention_score, victim

__all__ = ["Content", "LedgerModel", "Step", "retention_score", "validate"]

Content = tuple[int, ...]


def validate(op: Op, obs: Observation, config: Config, semantics: Semantics) -> None:
    """Raise SpecError when ``op`` is bad input in state ``obs``; return when it is valid.

    Valid operations may still be refused for lack of capacity; bad input never is
    "refused": it is an error, and it changes nothing.
    """
    request = obs.requests.get(op.req) if op.req is not None else None
    if op.op == "reset_cache":
        return
    if op.req is None or not op.req:
        raise SpecError(f"{op.op} needs a request id")
    if op.op == "admit":
        if request is not None:
            raise SpecError(f"request {op.req!r} already exists")
        if not op.tokens:
            raise SpecError("empty prompt")
        if any(t < 0 for t in op.tokens):
            raise SpecError("token ids must be non-negative")
        if size_of(len(op.tokens), config, semantics.granularity) > config.capacity:
            raise SpecError("prompt is larger than the whole cache capacity")
        return
    if request is None:
        raise SpecError(f"unknown or already released request {op.req!r}")
    if op.op == "release":
        return
    if op.op == "append":
        if request.state != "running":
            raise SpecError(f"append to request {op.req!r} that is not running")
        if not op.tokens:
            raise SpecError("append needs a positive number of tokens")
        if any(t < 0 for t in op.tokens):
            raise SpecError("token ids must be non-negative")
        held = len(request.tokens)
        record = obs.objects.get(request.objects[0]) if request.objects else None
        if semantics.granularity == "record" and record is not None:
            held = record.tokens
        if size_of(held + len(op.tokens), config, semantics.granularity) > config.capacity:
            raise SpecError("request would be larger than the whole cache capacity")
        return
    if op.op == "preempt":
        if request.state != "running":
            raise SpecError(f"preempt of request {op.req!r} that is not running")
        if op.mode != "recompute":
            raise SpecError(f"unsupported preempt mode {op.mode!r}")
        return
    if op.op == "resume":
        if request.state != "preempted":
            raise SpecError(f"resume of request {op.req!r} that is not preempted")
        return
    raise SpecError(f"unknown op {op.op!r}")


@dataclass
class _Object:
    key: Content | None = None
    tokens: int = 0
    size: int = 1
    ref_count: int = 0
    hits: int = 0
    last_used: int = 0
    priority: float = 0.0
    share_degree: int = 0  # block granularity: peak ref_count since the block left the free queue


@dataclass
class _Request:
    tokens: Content
    prompt_len: int
    objects: list[object] = field(default_factory=list)
    state: str = "running"
    cache_limit: int | None = None  # the admission gate: full blocks from this position on stay uncached


@dataclass(frozen=True)
class Step:
    """The spec's verdict on one operation: outcome, left-cache contents, free capacity after."""

    outcome: Outcome
    evicted: tuple[Content, ...]
    reclaimed: tuple[Content, ...]
    free: int
    # Block granularity: the slot each evicted / reclaimed key left (with duplicate keys, not always index[key]).
    evicted_slots: tuple[int, ...] = ()
    reclaimed_slots: tuple[int, ...] = ()


class LedgerModel:
    """The reference semantics of the KV lifecycle, one object per cache object.

    ``step`` keeps every safety invariant of spec.invariants by construction;
    tests/ check that it does, and the stateful suite holds implementations to it.
    """

    def __init__(self, config: Config, semantics: Semantics) -> None:
        self.config = config
        self.semantics = semantics
        self.clock = 0
        self.requests: dict[str, _Request] = {}
        # Block granularity: physical slots, LRU free queue (head evicted first), index.
        self.slots: list[_Object] = []
        self.free_queue: OrderedDict[int, None] = OrderedDict()
        # Record and entry granularity: objects keyed by their prompt.
        self.records: dict[Content, _Object] = {}
        self.index: dict[Hashable, object] = {}
        # Block granularity, duplicate_keys="indexed": further blocks cached under a key, after index[key].
        self.duplicates: dict[Hashable, list[int]] = {}
        if semantics.granularity == "block":
            self.slots = [_Object() for _ in range(config.capacity)]
            self.free_queue = OrderedDict.fromkeys(range(config.capacity))
        self._evicted: list[Content] = []
        self._reclaimed: list[Content] = []
        self._evicted_slots: list[int] = []
        self._reclaimed_slots: list[int] = []

    # -- observation ------------------------------------------------------
    def observe(self) -> Observation:
        """The spec's own ledger, in the shape adapters report."""
        objects: dict[object, ObjectView] = {}
        if self.semantics.granularity == "block":
            for sid, slot in enumerate(self.slots):
                if slot.ref_count or slot.key is not None:
                    objects[sid] = ObjectView(sid, 1, slot.tokens, slot.ref_count, slot.key, slot.hits, slot.last_used)
            free = sum(1 for s in self.slots if not s.ref_count and s.key is None)
        else:
            for key, rec in self.records.items():
                objects[key] = ObjectView(key, rec.size, rec.tokens, rec.ref_count, key, rec.hits, rec.last_used)
            free = self.config.capacity - sum(r.size for r in self.records.values())
        requests = {
            rid: RequestView(rid, r.tokens, r.prompt_len, tuple(r.objects), r.state)  # type: ignore[arg-type]
            for rid, r in self.requests.items()
        }
        index: dict[Hashable, tuple[object, ...]] = {
            key: (oid, *self.duplicates.get(key, ())) for key, oid in self.index.items()
        }
        return Observation(self.config.capacity, free, objects, requests, index)

    @property
    def free(self) -> int:
        if self.semantics.granularity == "block":
            return sum(1 for s in self.slots if not s.ref_count and s.key is None)
        return self.config.capacity - sum(r.size for r in self.records.values())

    # -- the step function --------------------------------------------------
    def step(self, op: Op) -> Step:
        """Apply ``op``; a refused or invalid op leaves the ledger exactly as it was."""
        self._evicted, self._reclaimed = [], []
        self._evicted_slots, self._reclaimed_slots = [], []
        try:
            validate(op, self.observe(), self.config, self.semantics)
        except SpecError as exc:
            return Step(Outcome.invalid(str(exc)), (), (), self.free)
        gran = self.semantics.granularity
        handler = getattr(self, f"_{gran}_{op.op}", None)
        if handler is None:
            return Step(Outcome.invalid(f"{op.op} is not defined at {gran} granularity"), (), (), self.free)
        self.clock += 1
        outcome = handler(op)
        return Step(
            outcome,
            tuple(self._evicted),
            tuple(self._reclaimed),
            self.free,
            tuple(self._evicted_slots),
            tuple(self._reclaimed_slots),
        )

    # -- block granularity --------------------------------------------------
    def _prefix(self, tokens: Content, i: int) -> Content:
        return tokens[: (i + 1) * self.config.block_size]

    def _unindex(self, key: Hashable, sid: int) -> None:
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
        """Take ``n`` slots from the free queue, evicting cached ones.

        lru pops the head, cached or not. Every other order takes the first
        uncached slot while there is one, and only then evicts the cached slot
        its order ranks first among all cached ones in the queue.
        """
        taken = []
        for _ in range(n):
            sid = self._next_free()
            del self.free_queue[sid]
            slot = self.slots[sid]
            if slot.key is not None:
                self._unindex(slot.key, sid)
                self._evicted.append(slot.key)
                self._evicted_slots.append(sid)
            self.slots[sid] = _Object(ref_count=1, last_used=self.clock, share_degree=1)
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
        children = child_counts((k for k in self.index if isinstance(k, tuple)), bs)
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

    def _cache_full_blocks(self, request: _Request, start: int) -> None:
        """Give every full block from ``start`` on its key, unless the key is cached already (duplicate_keys).

        Blocks at or past the request's cache_limit (the admission gate) stay uncached.
        """
        bs = self.config.block_size
        full = len(request.tokens) // bs
        if request.cache_limit is not None:
            full = min(full, request.cache_limit)
        for i in range(start, full):
            key = self._prefix(request.tokens, i)
            sid = request.objects[i]
            assert isinstance(sid, int)
            if key not in self.index:
                self.index[key] = sid
                self.slots[sid].key = key
            elif self.semantics.duplicate_keys == "indexed":
                self.duplicates.setdefault(key, []).append(sid)
                self.slots[sid].key = key

    def _fill_tokens(self, request: _Request) -> None:
        bs, n = self.config.block_size, len(request.tokens)
        for i, sid in enumerate(request.objects):
            assert isinstance(sid, int)
            self.slots[sid].tokens = min(bs, n - i * bs)

    def _block_admission(self, rid: str, request: _Request) -> Outcome:
        tokens, bs = request.tokens, self.config.block_size
        n = len(tokens)
        hit_blocks = 0
        while hit_blocks < n // bs and self._prefix(tokens, hit_blocks) in self.index:
            hit_blocks += 1
        if self.semantics.hit_cap:
            hit_blocks = min(hit_blocks, (n - 1) // bs)
        hits = [self.index[self._prefix(tokens, i)] for i in range(hit_blocks)]
        need = blocks_for(n, bs) - hit_blocks
        leaving_free = sum(1 for sid in hits if sid in self.free_queue)
        if need + leaving_free > len(self.free_queue):
            return Outcome.refused("not enough free or evictable blocks")
        for sid in hits:
            assert isinstance(sid, int)
            self.free_queue.pop(sid, None)
            slot = self.slots[sid]
            slot.ref_count += 1
            slot.hits += 1
            slot.last_used = self.clock
            slot.share_degree = max(slot.share_degree, slot.ref_count)
        anchor = self.semantics.admission_anchor_blocks
        request.cache_limit = anchor if anchor is not None and hit_blocks == 0 else None
        request.objects = list(hits) + list(self._pop_free(need))
        request.state = "running"
        self.requests[rid] = request
        self._fill_tokens(request)
        self._cache_full_blocks(request, hit_blocks)
        return Outcome.ok(hit_blocks * bs)

    def _block_admit(self, op: Op) -> Outcome:
        assert op.req is not None
        return self._block_admission(op.req, _Request(op.tokens, len(op.tokens)))

    def _block_resume(self, op: Op) -> Outcome:
        assert op.req is not None
        waiting = self.requests[op.req]
        fresh = _Request(waiting.tokens, waiting.prompt_len)
        outcome = self._block_admission(op.req, fresh)
        if outcome.status != "ok":
            self.requests[op.req] = waiting
        return outcome

    def _block_append(self, op: Op) -> Outcome:
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

    def _block_free(self, request: _Request, keep: bool) -> None:
        """Drop the request's references, tail block first, onto the free queue's tail.

        With free_uncached="head", the freed blocks that hold no key go to the
        head instead, in the same order (the request's tail block first).
        """
        to_head: list[int] = []
        for sid in reversed(request.objects):
            assert isinstance(sid, int)
            slot = self.slots[sid]
            slot.ref_count -= 1
            if slot.ref_count:
                continue
            if slot.key is not None and not keep:
                self._unindex(slot.key, sid)
                self._reclaimed.append(slot.key)
                self._reclaimed_slots.append(sid)
                slot.key = None
            if slot.key is None:
                self.slots[sid] = _Object()
                if self.semantics.free_uncached == "head":
                    to_head.append(sid)
                    continue
            self.free_queue[sid] = None
        for sid in reversed(to_head):
            self.free_queue[sid] = None
            self.free_queue.move_to_end(sid, last=False)
        request.objects = []

    def _block_release(self, op: Op) -> Outcome:
        assert op.req is not None
        self._block_free(self.requests.pop(op.req), op.keep)
        return Outcome.ok()

    def _block_preempt(self, op: Op) -> Outcome:
        assert op.req is not None
        request = self.requests[op.req]
        self._block_free(request, keep=True)
        request.state = "preempted"
        return Outcome.ok()

    def _block_reset_cache(self, op: Op) -> Outcome:
        if self.semantics.reset_requires_idle and any(s.ref_count for s in self.slots):
            return Outcome.refused("blocks are in use")
        for sid, slot in enumerate(self.slots):
            if slot.key is not None and not slot.ref_count:
                self._reclaimed.append(slot.key)
                self._reclaimed_slots.append(sid)
                self._unindex(slot.key, sid)
                self.slots[sid] = _Object()
        return Outcome.ok()

    # -- record and entry granularity ---------------------------------------
    def _eviction_order(self) -> list[Content]:
        candidates = [k for k, r in self.records.items() if r.ref_count == 0]
        if self.semantics.eviction == "score":
            return sorted(candidates, key=lambda k: (self.records[k].priority, self.records[k].last_used))
        return sorted(
            candidates,
            key=lambda k: (self.records[k].hits, self.records[k].last_used, -self.records[k].size),
        )

    def _make_room(self, size: int) -> bool:
        """Evict unreferenced objects in policy order until ``size`` fits; all or nothing."""
        order = self._eviction_order()
        if size > self.free + sum(self.records[k].size for k in order):
            return False
        for key in order:
            if self.free >= size:
                break
            del self.records[key]
            self.index.pop(key, None)
            self._evicted.append(key)
        return True

    def _record_admit(self, op: Op) -> Outcome:
        assert op.req is not None
        key = op.tokens
        rec = self.records.get(key)
        if rec is not None:
            rec.ref_count += 1
            rec.hits += 1
            rec.last_used = self.clock
            self.requests[op.req] = _Request(op.tokens, len(op.tokens), [key])
            return Outcome.ok(len(op.tokens))
        size = size_of(len(key), self.config, "record")
        if not self._make_room(size):
            return Outcome.refused("not enough free or evictable blocks")
        self.records[key] = _Object(key, len(key), size, 1, 1, self.clock)
        self.index[key] = key
        self.requests[op.req] = _Request(op.tokens, len(op.tokens), [key])
        return Outcome.ok(0)

    def _record_append(self, op: Op) -> Outcome:
        assert op.req is not None
        request = self.requests[op.req]
        rec = self.records[request.objects[0]]  # type: ignore[index]
        target = rec.tokens + len(op.tokens)
        added = size_of(target, self.config, "record") - rec.size
        if added > 0 and not self._make_room(added):
            return Outcome.refused("not enough free or evictable blocks")
        rec.tokens, rec.size, rec.last_used = target, rec.size + added, self.clock
        request.tokens = request.tokens + op.tokens
        return Outcome.ok()

    def _record_release(self, op: Op) -> Outcome:
        assert op.req is not None
        request = self.requests.pop(op.req)
        key = request.objects[0]
        rec = self.records[key]  # type: ignore[index]
        rec.ref_count -= 1
        if rec.ref_count == 0 and not op.keep:
            assert isinstance(key, tuple)
            del self.records[key]
            self.index.pop(key, None)
            self._reclaimed.append(key)
        else:
            rec.last_used = self.clock
        return Outcome.ok()

    def _entry_admit(self, op: Op) -> Outcome:
        key, cap = op.tokens, self.config.capacity
        ent = self.records.get(key)
        if ent is not None:
            ent.hits += 1
            ent.last_used = self.clock
            ent.priority = retention_score(ent.hits, ent.size, 0, cap)
            return Outcome.ok(len(key))
        size = size_of(len(key), self.config, "entry")
        if not self._make_room(size):
            return Outcome.refused("entry does not fit")
        self.records[key] = _Object(key, len(key), size, 0, 1, self.clock, retention_score(1, size, 0, cap))
        self.index[key] = key
        return Outcome.ok(0)
