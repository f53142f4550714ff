"""Policy checks: the declared eviction order and admission rules, for every implementation (exact or not)."""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Hashable
from dataclasses import replace

from ..block_key import Prefix, parent_prefix
from ..observation import ObjectView
from ..ops import blocks_for, size_of
from ..policies import (
    BLOCK_ORDERS,
    FEATURES_USED,
    BlockFeatures,
    BlockOrder,
    OrderParams,
    child_counts,
    order_key,
    rank_key,
    retention_score,
)
from .lost_hits import best_hit_chain
from .ranking import RankKey, block_features
from .transition import ONE_TABLE, Invariant, Problems, Transition, bad_input, eviction_candidates


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
    admit, resume and append (one that succeeds holds it trivially), against the
    best choice the pool offered, not the declared one: the prompt blocks the pool
    holds cached (whatever the index finds), each shared from a running request's
    copy before an idle duplicate is taken (``lost_hits.best_hit_chain``).
    """
    if t.op.op not in ("admit", "resume", "append") or bad_input(t) is not None:
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
        hits = best_hit_chain(t, tokens)
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
    out = {}
    for oid in eviction_candidates(t):
        o = before.objects[oid]
        f = block_features(
            o, memory.free_order.get(oid), memory.share_peak.get(oid), memory.content_of(o.key, t.semantics), order, bs
        )
        if f is None:
            return None
        out[oid] = f
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
    if t.touched is not None:
        return _ranked_conformance(t, order, evicted, problems)
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
        problems += _not_ranked_first(t, oid, keys, order, "block ")
        del features[oid]
        cached.pop(oid, None)
    return problems


def _ranked_conformance(t: Transition, order: BlockOrder, evicted: list[Hashable], problems: list[str]) -> Problems:
    """policy_conformance on a delta step: the evictions against the candidates ranked from step to step.

    Equivalent to the whole-state form: the ranking (KeyMemory.ranking, spec.invariants.ranking) holds
    every candidate of ``t.before`` with the features and a key in the same order as the whole-state form
    computes from the same observation and memory; the step's hits are left out as eviction_candidates
    leaves them out, each evicted block leaves the candidates, and where it was the last cached block of its
    content its parent's branch factor falls by one, as child_counts over the cached blocks left gives.
    O(evictions x log pool); the whole pool is read only to word a problem.
    """
    ranking = t.memory.ranking_of(t)
    if not ranking.judgeable():
        return problems or None
    mine = t.after.requests.get(t.op.req or "")
    left = {e.oid for e in t.events}
    gone: set[Hashable] = set(mine.objects) - left if mine is not None and t.op.op in ("admit", "resume") else set()
    dropped: set[Hashable] = set()
    moved: dict[Hashable, RankKey] = {}
    moved_heap: list[tuple[RankKey, Hashable]] = []
    moved_features: dict[Hashable, BlockFeatures] = {}
    removed: Counter[Prefix] = Counter()
    lost_children: Counter[Prefix] = Counter()
    for oid in evicted:
        if oid in gone or oid not in ranking.keys:
            problems.append(f"{t.op} evicted object {oid!r}, which was not a candidate")
            continue
        first = ranking.first(gone, dropped, moved, moved_heap)
        if first is not None and first != oid:
            feats = {c: moved_features.get(c, ranking.features[c]) for c in (oid, first)}
            clock = max(f.last_used for f in ranking.features.values())
            params = OrderParams(clock=clock, capacity=t.config.capacity, protect_min_hits=t.semantics.protect_min_hits)
            keys = {c: order_key(order, f, params) for c, f in feats.items()}
            problems += _not_ranked_first(t, oid, keys, order, "block ")
        gone.add(oid)
        dropped.add(oid)
        moved.pop(oid, None)
        content = ranking.content.get(oid)
        if not ranking.reads_children or content is None:
            continue
        removed[content] += 1
        parent = parent_prefix(content, t.config.block_size)
        if ranking.holders[content] > removed[content] or parent is None:
            continue
        lost_children[parent] += 1
        for other in ranking.by_content.get(parent, ()):
            f = ranking.features.get(other)
            if f is not None and other not in gone:
                moved_features[other] = replace(f, branch_factor=ranking.children[parent] - lost_children[parent])
                moved[other] = rank_key(order, moved_features[other], t.semantics.protect_min_hits)
                heapq.heappush(moved_heap, (moved[other], other))
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
        problems += _not_ranked_first(t, oid, keys, t.semantics.eviction, "")
        del keys[oid]
    return problems


def _not_ranked_first(
    t: Transition, oid: Hashable, keys: dict[Hashable, tuple[float, ...]], order: str, what: str
) -> list[str]:
    """The problem, if any, of evicting ``oid`` when ``order`` ranks another candidate first by ``keys``."""
    first = min(keys, key=keys.__getitem__)
    if first == oid:
        return []
    return [
        f"{t.op} evicted {what}{oid!r} (rank key {_fmt(keys[oid])}) but {order} ranks "
        f"{what}{first!r} (rank key {_fmt(keys[first])}) first"
    ]


def _fmt(key: tuple[float, ...]) -> str:
    return "(" + ", ".join(f"{x:.4g}" for x in key) + ")"


POLICY: tuple[Invariant, ...] = (
    Invariant("candidates_unreferenced", "policy", candidates_unreferenced, incremental=True),
    Invariant("no_spurious_refusal", "policy", no_spurious_refusal, layouts=ONE_TABLE),
    Invariant("policy_conformance", "policy", policy_conformance, layouts=ONE_TABLE, incremental=True),
)
"""incremental: candidates_unreferenced reads the evicted blocks and their readers (the step's events and
every reader of them are in the local part, spec.delta.KeptObservation.local); policy_conformance ranks the
evictions against the candidates kept ranked across steps (``_ranked_conformance``). no_spurious_refusal
counts every idle block of the pool on a refusal: a whole-state check, every K steps."""
