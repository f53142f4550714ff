"""The named invariants of the KV lifecycle.

Each is a function over one transition (before, op, outcome, events, after). It
returns None when it does not apply to that step, otherwise the list of problems
it found (empty: held). State invariants look at ``after`` only; transition
invariants compare ``before`` and ``after``; refinement checks compare the
implementation with the spec's own step, for implementations that declare
exact semantics.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Literal

from .ledger import Content, Step, validate
from .observation import ObjectView, Observation
from .ops import Config, Event, Op, Outcome, Semantics, SpecError, blocks_for, size_of
from .policies import (
    BLOCK_ORDERS,
    FEATURES_USED,
    BlockFeatures,
    BlockOrder,
    OrderParams,
    child_counts,
    order_key,
    retention_score,
)

Problems = list[str] | None
Kind = Literal["safety", "refinement", "policy"]
"""safety: every implementation; refinement: implementations that declare exact semantics; policy: every
implementation, judged against the eviction order and admission rules it declares (exact or not)."""


@dataclass
class KeyMemory:
    """What each cache key was seen to stand for, learned from the request tables.

    Implementations' keys are opaque (a block hash); the spec keys by content. At
    block granularity the content of the key of the i-th block of a request is the
    request's first (i+1)*block_size tokens; at record and entry granularity the
    key is the prompt itself.
    """

    content: dict[Hashable, Content] = field(default_factory=dict)
    key_of: dict[Content, Hashable] = field(default_factory=dict)
    # Block granularity, learned across transitions by ``track`` (the policy checks read them):
    # the LRU order in which cached blocks reached ref_count 0 (oid -> sequence number, tail block first),
    free_order: dict[Hashable, int] = field(default_factory=dict)
    free_seq: int = 0
    # and each block's peak ref_count since it last left the free pool (its share degree).
    share_peak: dict[Hashable, int] = field(default_factory=dict)
    quality: PolicyQuality = field(default_factory=lambda: PolicyQuality())

    def content_of(self, key: Hashable, semantics: Semantics) -> Content | None:
        if semantics.granularity != "block":
            return key if isinstance(key, tuple) else None
        return self.content.get(key)

    def track(self, t: Transition) -> None:
        """Learn from a checked transition what the policy checks need next: LRU order, share degrees, quality.

        Keeps: ``free_order`` holds exactly the cached blocks with ref_count 0 whose
        release was seen, numbered in the order they were released (a request's
        tail block first); ``share_peak`` holds every object of ``t.after``.
        """
        if t.semantics.granularity != "block":
            return
        self.quality.add(t, self, len([e for e in t.events if e.kind == "evict"]))  # reads the order before the step
        before, after = t.before, t.after
        left = {e.oid for e in t.events}
        for oid, obj in after.objects.items():
            fresh = oid in left or oid not in before.objects
            self.share_peak[oid] = obj.ref_count if fresh else max(self.share_peak.get(oid, 0), obj.ref_count)
        for oid in set(self.share_peak) - set(after.objects):
            del self.share_peak[oid]
        for oid in left:
            self.free_order.pop(oid, None)
        was = before.requests.get(t.op.req or "")
        if t.op.op in ("release", "preempt") and t.outcome.status == "ok" and was is not None:
            for oid in reversed(was.objects):
                freed = after.objects.get(oid)
                if freed is not None and freed.ref_count == 0 and freed.key is not None and oid not in self.free_order:
                    self.free_seq += 1
                    self.free_order[oid] = self.free_seq
        for oid in list(self.free_order):
            queued = after.objects.get(oid)
            if queued is None or queued.key is None or queued.ref_count:
                del self.free_order[oid]


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

    def add(self, t: Transition, memory: KeyMemory, evictions: int) -> None:
        self.steps += 1
        self.block_steps += t.after.capacity
        self.evictions += evictions
        self.evictions_with_choice += sum(1 for n in eviction_choices(t) if n > 1)
        self.evictions_off_lru += _off_lru(t, memory)
        orphans = len(orphaned_blocks(t.after, t.config, t.semantics, memory))
        self.orphan_block_steps += orphans
        self.orphans_max = max(self.orphans_max, orphans)

    def merge(self, other: PolicyQuality) -> None:
        self.steps += other.steps
        self.block_steps += other.block_steps
        self.orphan_block_steps += other.orphan_block_steps
        self.orphans_max = max(self.orphans_max, other.orphans_max)
        self.evictions += other.evictions
        self.evictions_with_choice += other.evictions_with_choice
        self.evictions_off_lru += other.evictions_off_lru

    def to_json(self) -> dict[str, int | float]:
        return {
            "steps": self.steps,
            "evictions": self.evictions,
            "evictions_with_choice": self.evictions_with_choice,
            "evictions_off_lru": self.evictions_off_lru,
            "orphan_block_steps": self.orphan_block_steps,
            "orphans_max": self.orphans_max,
            "orphan_capacity_share": round(self.orphan_block_steps / self.block_steps, 6) if self.block_steps else 0.0,
        }


def _off_lru(t: Transition, memory: KeyMemory) -> int:
    """Evictions of the step that did not take the candidate first in the LRU release order (where it is known).

    Called before ``memory`` forgets this step's evicted blocks.
    """
    candidates, off = _candidates(t), 0
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
    bs = config.block_size
    contents = {oid: memory.content_of(o.key, semantics) for oid, o in obs.objects.items() if o.key is not None}
    cached = {c for c in contents.values() if c is not None}
    return [
        oid
        for oid, c in contents.items()
        if c is not None and len(c) > bs and c[:-bs] not in cached and obs.objects[oid].ref_count == 0
    ]


@dataclass(frozen=True)
class Transition:
    before: Observation
    op: Op
    outcome: Outcome
    events: tuple[Event, ...]
    after: Observation
    config: Config
    semantics: Semantics
    memory: KeyMemory
    predicted: Step | None = None  # the spec's step, where the adapter declares exact semantics


@dataclass(frozen=True)
class Invariant:
    name: str
    kind: Kind
    check: Callable[[Transition], Problems]

    @property
    def doc(self) -> str:
        return (self.check.__doc__ or "").strip().splitlines()[0]


def _bad_input(t: Transition) -> str | None:
    try:
        validate(t.op, t.before, t.config, t.semantics)
    except SpecError as exc:
        return str(exc)
    return None


# -- safety: state invariants -----------------------------------------------------


def capacity_conservation(t: Transition) -> Problems:
    """free + sum of object sizes == capacity, and free >= 0."""
    obs = t.after
    used = sum(o.size for o in obs.objects.values())
    problems = []
    if obs.capacity != t.config.capacity:
        problems.append(f"capacity is {obs.capacity}, configured {t.config.capacity}")
    if obs.free < 0:
        problems.append(f"free capacity is negative ({obs.free})")
    if obs.free + used != obs.capacity:
        problems.append(f"free {obs.free} + held {used} != capacity {obs.capacity}")
    return problems


def non_negative_ref_counts(t: Transition) -> Problems:
    """No object's ref count is below zero."""
    return [f"object {o.oid!r} has ref_count {o.ref_count}" for o in t.after.objects.values() if o.ref_count < 0]


def ref_count_matches_references(t: Transition) -> Problems:
    """Each object's ref count equals the number of live request references to it."""
    obs = t.after
    refs = obs.referencing()
    problems = [
        f"object {o.oid!r} has ref_count {o.ref_count} but {refs.get(o.oid, 0)} live references"
        for o in obs.objects.values()
        if o.ref_count != refs.get(o.oid, 0)
    ]
    problems += [
        f"a request references object {oid!r}, which holds no capacity" for oid in refs if oid not in obs.objects
    ]
    return problems


def tail_rounding(t: Transition) -> Problems:
    """An object of n tokens takes ceil(n / block_size) blocks; a request holds exactly that many."""
    obs, cfg, sem = t.after, t.config, t.semantics
    problems = []
    for o in obs.objects.values():
        if sem.granularity == "block":
            if o.size != 1 or not 1 <= o.tokens <= cfg.block_size:
                problems.append(f"block {o.oid!r} has size {o.size} holding {o.tokens} tokens")
        elif o.size != size_of(o.tokens, cfg, sem.granularity):
            problems.append(
                f"object {o.oid!r} holds {o.tokens} tokens in size {o.size}, "
                f"expected {size_of(o.tokens, cfg, sem.granularity)}"
            )
    if sem.granularity == "block":
        for r in obs.requests.values():
            want = blocks_for(len(r.tokens), cfg.block_size) if r.state == "running" else 0
            if len(r.objects) != want:
                problems.append(
                    f"request {r.req!r} has {len(r.tokens)} tokens in {len(r.objects)} blocks, expected {want}"
                )
    return problems


def cache_index_consistency(t: Transition) -> Problems:
    """Every index entry names an object cached under that key, holding that key's tokens."""
    obs, sem, bs = t.after, t.semantics, t.config.block_size
    problems = []
    for key, oids in (obs.index or {}).items():
        for oid in oids:
            obj = obs.objects.get(oid)
            if obj is None:
                problems.append(f"index entry {key!r} points to object {oid!r}, which is free")
            elif obj.key != key:
                problems.append(f"index entry {key!r} points to object {oid!r}, cached as {obj.key!r}")
    memory = t.memory
    for r in obs.requests.values():
        for i, oid in enumerate(r.objects):
            obj = obs.objects.get(oid)
            if obj is None or obj.key is None:
                continue
            if sem.granularity == "block":
                content = r.tokens[: (i + 1) * bs]
                if len(content) < (i + 1) * bs:
                    problems.append(f"partial block {oid!r} of request {r.req!r} carries cache key {obj.key!r}")
                    continue
            else:
                content = r.tokens[: r.prompt_len]
            seen = memory.content.get(obj.key)
            if seen is None:
                memory.content[obj.key] = content
                memory.key_of.setdefault(content, obj.key)
            elif seen != content:
                problems.append(
                    f"object {oid!r} at position {i} of request {r.req!r} carries key {obj.key!r}, "
                    f"cached for other tokens"
                )
    if sem.granularity != "block":
        for o in obs.objects.values():
            if o.key is not None and o.key != o.oid and not isinstance(o.key, tuple):
                problems.append(f"object {o.oid!r}: record and entry keys must be the prompt tokens")
    return problems


# -- safety: transition invariants --------------------------------------------------


def share_without_duplication(t: Transition) -> Problems:
    """A cached prefix is shared by reference, never copied; partial tail blocks are never shared."""
    before, after, sem = t.before, t.after, t.semantics
    problems = []
    if sem.granularity == "block":
        refs = after.referencing()
        for oid, n in refs.items():
            obj = after.objects.get(oid)
            if n > 1 and obj is not None and obj.key is None:
                problems.append(f"uncached block {oid!r} is referenced {n} times")
    if t.op.op not in ("admit", "resume") or t.outcome.status != "ok":
        return problems
    index = before.index or {}
    if sem.granularity == "entry":
        holders = [o.oid for o in after.objects.values() if o.key == t.op.tokens]
        if len(holders) != 1:
            problems.append(f"prompt of {t.op.req!r} is held by {len(holders)} entries {holders!r}")
        return problems
    request = after.requests.get(t.op.req or "")
    if request is None:
        return [*problems, f"admitted request {t.op.req!r} is not live"]
    if sem.granularity == "block":
        bs, n = t.config.block_size, len(request.tokens)
        chain = 0
        while chain < n // bs:
            key = t.memory.key_of.get(request.tokens[: (chain + 1) * bs])
            if key is None or key not in index:
                break
            chain += 1
        if sem.hit_cap:
            chain = min(chain, (n - 1) // bs)
        for i in range(min(chain, len(request.objects))):
            key = t.memory.key_of[request.tokens[: (i + 1) * bs]]
            if request.objects[i] not in index[key]:
                problems.append(
                    f"block {i} of {t.op.req!r} is new object {request.objects[i]!r} although "
                    f"its prefix was cached as {index[key]!r}"
                )
    else:
        key = request.tokens[: request.prompt_len]
        holders = [o.oid for o in after.objects.values() if o.key == key]
        if len(holders) > 1:
            problems.append(f"prompt of {t.op.req!r} is held by {len(holders)} objects {holders!r}")
        if key in index and request.objects and request.objects[0] not in index[key]:
            problems.append(f"{t.op.req!r} got a new object although its prompt was cached")
    return problems


def no_active_eviction(t: Transition) -> Problems:
    """Only unreferenced objects are evicted or reclaimed; a running request's blocks stay put."""
    before, after, target = t.before, t.after, t.op.req
    others = {rid: r for rid, r in before.requests.items() if rid != target}
    readers: dict[Hashable, list[str]] = {}
    for rid, r in others.items():
        for oid in r.objects:
            readers.setdefault(oid, []).append(rid)
    problems = [
        f"{e.kind} of object {e.oid!r} while request(s) {readers[e.oid]} still read it"
        for e in t.events
        if e.oid in readers
    ]
    for rid, r in others.items():
        now = after.requests.get(rid)
        if now is None:
            problems.append(f"request {rid!r} vanished during {t.op}")
            continue
        if now.objects != r.objects:
            problems.append(f"block table of request {rid!r} changed from {r.objects!r} to {now.objects!r}")
            continue
        for oid in r.objects:
            was, obj = before.objects.get(oid), after.objects.get(oid)
            if was is not None and (obj is None or obj.key != was.key):
                problems.append(f"object {oid!r} read by {rid!r} lost its cached content during {t.op}")
    mine = after.requests.get(target or "")
    if mine is not None and t.semantics.granularity == "block":
        was_live = before.requests.get(target or "")
        held_before = set(was_live.objects) if was_live is not None else set()
        for oid in set(mine.objects) - held_before:
            was = before.objects.get(oid)
            if oid in readers and (was is None or was.key is None):
                problems.append(f"uncached block {oid!r} of request(s) {readers[oid]} handed to {target!r}")
    return problems


def atomic_failure(t: Transition) -> Problems:
    """A refused or rejected operation changes nothing observable and evicts nothing."""
    if t.outcome.status == "ok":
        return None
    b, a = t.before, t.after
    problems = []
    if t.events:
        problems.append(f"refused {t.op} emitted {len(t.events)} event(s)")
    if b.free != a.free:
        problems.append(f"free capacity went from {b.free} to {a.free}")
    for oid in set(b.objects) | set(a.objects):
        if b.objects.get(oid) != a.objects.get(oid):
            problems.append(f"object {oid!r} changed: {b.objects.get(oid)} -> {a.objects.get(oid)}")
    for rid in set(b.requests) | set(a.requests):
        if b.requests.get(rid) != a.requests.get(rid):
            problems.append(f"request {rid!r} changed")
    if (b.index or {}) != (a.index or {}):
        problems.append("cache index changed")
    return problems


def bad_input_rejected(t: Transition) -> Problems:
    """Bad input gets the spec's error; valid input never does."""
    expected = _bad_input(t)
    if expected is not None and t.outcome.status != "invalid":
        return [f"{t.op} is bad input ({expected}) but the outcome was {t.outcome.status!r}"]
    if expected is None and t.outcome.status == "invalid":
        return [f"{t.op} is valid but was rejected as bad input: {t.outcome.message}"]
    return []


# -- refinement: the implementation does what the spec predicts ---------------------


def predicted_admission(t: Transition) -> Problems:
    """An operation succeeds exactly when the spec says it fits (no spurious refusal)."""
    p = t.predicted
    if p is None or p.outcome.status == "invalid":
        return None
    if p.outcome.status != t.outcome.status:
        why = "capacity was really there" if p.outcome.status == "ok" else "it does not fit"
        return [f"{t.op} was {t.outcome.status!r}, spec says {p.outcome.status!r} ({why})"]
    return []


def predicted_prefix_hits(t: Transition) -> Problems:
    """An admission serves exactly as many prompt tokens from cache as the spec predicts."""
    p = t.predicted
    if p is None or t.op.op not in ("admit", "resume") or t.outcome.hit_tokens is None:
        return None
    if p.outcome.status != "ok" or t.outcome.status != "ok":
        return None
    if p.outcome.hit_tokens != t.outcome.hit_tokens:
        return [f"{t.op} hit {t.outcome.hit_tokens} cached tokens, spec predicts {p.outcome.hit_tokens}"]
    return []


def predicted_free_capacity(t: Transition) -> Problems:
    """Free capacity after each step is what the spec predicts."""
    p = t.predicted
    if p is None:
        return None
    if p.free != t.after.free:
        return [f"free capacity after {t.op} is {t.after.free}, spec predicts {p.free}"]
    return []


def predicted_eviction(t: Transition) -> Problems:
    """The objects evicted and reclaimed are exactly those the declared policy picks."""
    p = t.predicted
    if p is None:
        return None
    problems = []
    for kind, want in (("evict", p.evicted), ("reclaim", p.reclaimed)):
        got = []
        for e in t.events:
            if e.kind != kind:
                continue
            obj = t.before.objects.get(e.oid)
            key = e.key if e.key is not None else (obj.key if obj is not None else None)
            content = t.memory.content_of(key, t.semantics) if key is not None else None
            got.append(content)
        if Counter(got) != Counter(want):
            problems.append(f"{t.op}: {kind}ed {len(got)} object(s) {_short(got)}, spec's policy picks {_short(want)}")
    return problems


# -- policy: the declared eviction order and admission rules, for every implementation -------------


def candidates_unreferenced(t: Transition) -> Problems:
    """Only unreferenced objects are eviction candidates: each evicted object had ref_count 0 before the step.

    no_active_eviction looks at the blocks other requests read; this also covers
    the operating request's own blocks (an append that evicts its own prefix).
    """
    evicted = [e.oid for e in t.events if e.kind == "evict"]
    if not evicted:
        return None
    refs = t.before.referencing()
    problems = []
    for oid in evicted:
        obj = t.before.objects.get(oid)
        count = max(obj.ref_count if obj is not None else 0, refs.get(oid, 0))
        if count:
            problems.append(f"{t.op} evicted object {oid!r}, which had ref_count {count}")
    return problems


def no_spurious_refusal(t: Transition) -> Problems:
    """A refused admit, resume or append really lacked room: free + evictable capacity was short of its need.

    Evictable: unreferenced cached objects the operation does not hit itself. Holds
    for every eviction order, whatever a policy protects. Judged on every valid
    admit, resume and append (one that succeeds holds it trivially).
    """
    if t.op.op not in ("admit", "resume", "append") or _bad_input(t) is not None:
        return None
    if t.outcome.status != "refused":
        return []
    need, evictable = _room(t)
    if t.before.free + evictable >= need:
        return [f"{t.op} was refused with {t.before.free} free + {evictable} evictable >= {need} needed"]
    return []


def _room(t: Transition) -> tuple[int, int]:
    """(capacity the operation needs, evictable capacity it may take) in state ``t.before``, as the spec counts."""
    before, op, cfg, sem = t.before, t.op, t.config, t.semantics
    request = before.requests.get(op.req or "")
    idle = {oid: o for oid, o in before.objects.items() if o.ref_count == 0 and o.key is not None}
    if sem.granularity == "block":
        if op.op == "append":
            assert request is not None
            return blocks_for(len(request.tokens) + len(op.tokens), cfg.block_size) - len(request.objects), len(idle)
        tokens = op.tokens if op.op == "admit" else request.tokens if request is not None else ()
        hits = _hit_chain(t, tokens)
        return blocks_for(len(tokens), cfg.block_size) - len(hits), len(set(idle) - set(hits))
    evictable = sum(o.size for o in idle.values())
    if op.op == "append" and request is not None and request.objects:
        rec = before.objects.get(request.objects[0])
        held = rec.tokens if rec is not None else len(request.tokens)
        have = rec.size if rec is not None else 0
        return size_of(held + len(op.tokens), cfg, sem.granularity) - have, evictable
    tokens = op.tokens if op.op == "admit" else request.tokens[: request.prompt_len] if request is not None else ()
    if tokens in (before.index or {}):
        return 0, evictable  # a hit takes no new capacity
    return size_of(len(tokens), cfg, sem.granularity), evictable


def _hit_chain(t: Transition, tokens: Content) -> list[Hashable]:
    """The cached blocks an admission of ``tokens`` reuses: the longest chain of cached full blocks, hit-capped."""
    index, bs = t.before.index or {}, t.config.block_size
    hits: list[Hashable] = []
    while len(hits) < len(tokens) // bs:
        key = t.memory.key_of.get(tokens[: (len(hits) + 1) * bs])
        if key is None or not index.get(key):
            break
        hits.append(index[key][0])
    if t.semantics.hit_cap:
        hits = hits[: max(len(tokens) - 1, 0) // bs]
    return hits


def _candidates(t: Transition) -> set[Hashable]:
    """Block granularity: cached blocks with ref_count 0 before the step, less those the step's admission hit."""
    left = {e.oid for e in t.events}
    mine = t.after.requests.get(t.op.req or "")
    hit = set(mine.objects) - left if mine is not None and t.op.op in ("admit", "resume") else set()
    return {oid for oid, o in t.before.objects.items() if o.ref_count == 0 and o.key is not None and oid not in hit}


def eviction_choices(t: Transition) -> list[int]:
    """Block granularity: how many candidates each eviction of the step chose from, in event order."""
    if t.semantics.granularity != "block":
        return []
    candidates, counts = _candidates(t), []
    for e in t.events:
        if e.kind == "evict":
            counts.append(len(candidates))
            candidates.discard(e.oid)
    return counts


def _blocks_taken(t: Transition) -> int:
    """Blocks the operating request took from the free pool (new blocks, not hits)."""
    mine, was = t.after.requests.get(t.op.req or ""), t.before.requests.get(t.op.req or "")
    if mine is None:
        return 0
    if t.op.op == "append":
        return len(mine.objects) - (len(was.objects) if was is not None else 0)
    left = {e.oid for e in t.events}
    hits = [
        oid
        for oid in mine.objects
        if oid in t.before.objects and oid not in left and t.before.objects[oid].key is not None
    ]
    return len(mine.objects) - len(hits)


def _observed_features(t: Transition, order: BlockOrder) -> dict[Hashable, BlockFeatures] | None:
    """The features ``order`` reads of every candidate, from the observation and KeyMemory; None if unobservable.

    branch_factor is left 0 here: it changes as blocks are evicted, see policy_conformance.
    """
    before, memory, bs = t.before, t.memory, t.config.block_size
    need = FEATURES_USED[order]
    out = {}
    for oid in _candidates(t):
        o = before.objects[oid]
        pos, share = memory.free_order.get(oid), memory.share_peak.get(oid)
        content = memory.content_of(o.key, t.semantics)
        if (
            pos is None
            or ("hits" in need and o.hits is None)
            or ("last_used" in need and o.last_used is None)
            or ("share_degree" in need and share is None)
            or ("prefix_depth" in need and content is None)
        ):
            return None
        out[oid] = BlockFeatures(
            hits=o.hits or 0,
            share_degree=share or 0,
            branch_factor=0,
            prefix_depth=len(content) // bs if content is not None else 0,
            last_used=o.last_used or 0,
            free_pos=pos,
        )
    return out


def policy_conformance(t: Transition) -> Problems:
    """Each evicted object is the first of the declared eviction order among the candidates left at that moment.

    The order is computed from what the checker observes (ObjectView hits and
    last_used, the LRU release order and share degrees it tracked itself, the
    cached keys' contents); unknown when a feature the order reads is not
    observable. Every block order but lru also takes uncached free blocks before
    it evicts any cached one.
    """
    sem = t.semantics
    evicted = [e.oid for e in t.events if e.kind == "evict"]
    if not evicted:
        return None
    if sem.granularity != "block":
        return _ledger_conformance(t, evicted)
    if sem.eviction not in BLOCK_ORDERS:
        return None
    order: BlockOrder = sem.eviction
    problems = []
    if order != "lru":
        taken, uncached = _blocks_taken(t), t.before.free
        if len(evicted) > max(0, taken - uncached):
            problems.append(
                f"{t.op} evicted {len(evicted)} cached block(s) for {taken} new block(s) "
                f"while {uncached} uncached free block(s) were available"
            )
    features = _observed_features(t, order)
    if features is None:
        return problems or None
    contents = {oid: t.memory.content_of(o.key, sem) for oid, o in t.before.objects.items() if o.key is not None}
    cached = {oid: c for oid, c in contents.items() if c is not None}
    if "branch_factor" in FEATURES_USED[order] and len(cached) < len(contents):
        return problems or None  # a cached key of unknown content: its parent's branch factor is unknown
    params = OrderParams(
        clock=max((f.last_used for f in features.values()), default=0),
        capacity=t.config.capacity,
        protect_min_hits=sem.protect_min_hits,
    )
    bs = t.config.block_size
    for oid in evicted:
        if oid not in features:
            problems.append(f"{t.op} evicted object {oid!r}, which was not a candidate")
            continue
        children = child_counts(cached.values(), bs)
        ranked = {
            c: BlockFeatures(f.hits, f.share_degree, children[cached[c]], f.prefix_depth, f.last_used, f.free_pos)
            if c in cached
            else f
            for c, f in features.items()
        }
        keys = {c: order_key(order, f, params) for c, f in ranked.items()}
        first = min(keys, key=keys.__getitem__)
        if first != oid:
            problems.append(
                f"{t.op} evicted block {oid!r} (rank key {_fmt(keys[oid])}) but {order} ranks "
                f"block {first!r} (rank key {_fmt(keys[first])}) first"
            )
        del features[oid]
        cached.pop(oid, None)
    return problems


def _ledger_key(t: Transition, o: ObjectView) -> tuple[float, ...] | None:
    """Record and entry granularity: the spec's eviction key of one object, from its observed hits, use and size.

    lifecycle: (hits, last_used, -size). score (entries): (retention score as of the
    entry's last access, last_used); the score is taken at age 0 when an entry is
    refreshed, so it follows from hits and size alone.
    """
    if o.hits is None or o.last_used is None:
        return None
    if t.semantics.eviction == "lifecycle":
        return (o.hits, o.last_used, -o.size)
    if t.semantics.eviction == "score" and t.semantics.granularity == "entry":
        return (retention_score(o.hits, o.size, 0, t.config.capacity), o.last_used)
    return None


def _ledger_conformance(t: Transition, evicted: list[Hashable]) -> Problems:
    keys: dict[Hashable, tuple[float, ...]] = {}
    for oid, o in t.before.objects.items():
        if o.ref_count:
            continue
        key = _ledger_key(t, o)
        if key is None:
            return None
        keys[oid] = key
    problems = []
    for oid in evicted:
        if oid not in keys:
            problems.append(f"{t.op} evicted object {oid!r}, which was not a candidate")
            continue
        first = min(keys, key=keys.__getitem__)
        if first != oid:
            problems.append(
                f"{t.op} evicted {oid!r} (rank key {_fmt(keys[oid])}) but {t.semantics.eviction} ranks "
                f"{first!r} (rank key {_fmt(keys[first])}) first"
            )
        del keys[oid]
    return problems


def _fmt(key: tuple[float, ...]) -> str:
    return "(" + ", ".join(f"{x:.4g}" for x in key) + ")"


def _short(contents: object) -> str:
    text = repr(contents)
    return text if len(text) < 160 else text[:157] + "..."


# Order matters only for which broken invariant a report names first: the most
# specific cause comes before the generic symptoms it also produces.
INVARIANTS: tuple[Invariant, ...] = (
    Invariant("bad_input_rejected", "safety", bad_input_rejected),
    Invariant("atomic_failure", "safety", atomic_failure),
    Invariant("no_active_eviction", "safety", no_active_eviction),
    Invariant("share_without_duplication", "safety", share_without_duplication),
    Invariant("tail_rounding", "safety", tail_rounding),
    Invariant("cache_index_consistency", "safety", cache_index_consistency),
    Invariant("non_negative_ref_counts", "safety", non_negative_ref_counts),
    Invariant("ref_count_matches_references", "safety", ref_count_matches_references),
    Invariant("capacity_conservation", "safety", capacity_conservation),
    Invariant("predicted_admission", "refinement", predicted_admission),
    Invariant("predicted_eviction", "refinement", predicted_eviction),
    Invariant("predicted_prefix_hits", "refinement", predicted_prefix_hits),
    Invariant("predicted_free_capacity", "refinement", predicted_free_capacity),
    # Policy checks come last, so that adding them changed no existing counterexample's first name.
    Invariant("candidates_unreferenced", "policy", candidates_unreferenced),
    Invariant("no_spurious_refusal", "policy", no_spurious_refusal),
    Invariant("policy_conformance", "policy", policy_conformance),
)

ADAPTER_CONTRACT = "adapter_contract"
"""Not an invariant of the ledger: the adapter raised or hung where the spec defines an outcome."""

INVARIANT_NAMES: tuple[str, ...] = (*(i.name for i in INVARIANTS), ADAPTER_CONTRACT)


def check_transition(t: Transition) -> dict[str, Problems]:
    """Run every invariant on one transition: name -> None (not applicable) or problems.

    Afterwards ``t.memory`` learns what the next transition's policy checks need.
    """
    results = {inv.name: inv.check(t) for inv in INVARIANTS}
    t.memory.track(t)
    return results
