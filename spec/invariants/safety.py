"""Safety invariants: what every implementation keeps, exact or not.

State invariants look at ``after`` only; transition invariants compare
``before`` and ``after``.
"""

from __future__ import annotations

from collections.abc import Hashable
from operator import attrgetter

from ..block_key import Prefix
from ..delta import whole
from ..observation import Observation
from ..ops import blocks_for, size_of
from .transition import ONE_TABLE, Invariant, Problems, Transition, bad_input

_SIZE = attrgetter("size")

# -- state invariants -----------------------------------------------------------------


def capacity_conservation(t: Transition) -> Problems:
    """free + sum of object sizes == capacity, and free >= 0.

    On a delta step's local part, by induction: the state before held it (judged whole at the last K-th step
    or example start's first full check, and on every step since), and objects outside the part are unchanged,
    so the state after holds it iff the change of free plus the change of the touched objects' sizes is 0.
    A base never judged (an example's first observation) is judged whole at the K-th step and at the end.
    """
    obs = t.after
    if t.touched is not None:
        grown = sum(map(_SIZE, obs.objects.values())) - sum(map(_SIZE, t.before.objects.values()))
        if obs.capacity == t.config.capacity and obs.free >= 0 and obs.free - t.before.free + grown == 0:
            return []
        obs = Observation(obs.capacity, obs.free, whole(obs.objects), obs.requests, obs.index, obs.extra)
    used = sum(map(_SIZE, obs.objects.values()))  # a whole pool at every K-th step: at C speed
    problems = []
    if obs.capacity != t.config.capacity:
        problems.append(f"capacity is {obs.capacity}, configured {t.config.capacity}")
    if obs.free < 0:
        problems.append(f"free capacity is negative ({obs.free})")
    if obs.free + used != obs.capacity:
        idle = sum(o.size for o in obs.objects.values() if o.ref_count == 0 and o.key is not None)
        hint = ""
        if idle and obs.free + used - obs.capacity == idle:
            hint = (
                f": free counts the {idle} cached unreferenced block(s) that are objects too "
                "(free is the capacity no object holds; spec.observation.Observation)"
            )
        problems.append(f"free {obs.free} + held {used} != capacity {obs.capacity}{hint}")
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
        keys = memory.block_keys(r, bs) if sem.granularity == "block" and r.objects else []
        for i, oid in enumerate(r.objects):
            obj = obs.objects.get(oid)
            if obj is None or obj.key is None:
                continue
            content: Prefix
            if sem.granularity == "block":
                if i >= len(keys):
                    problems.append(f"partial block {oid!r} of request {r.req!r} carries cache key {obj.key!r}")
                    continue
                content = keys[i]
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


# -- transition invariants ---------------------------------------------------------------


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
    index = before.index if before.index is not None else {}
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
        # The implementation's cached copies of the request's full blocks, in order: the entries the index lists
        # under each key that carry it (a stale entry naming a block that holds other tokens is not a cached copy:
        # cache_index_consistency reports it).
        chain: list[list[Hashable]] = []
        for content in t.memory.block_keys(request, bs):
            key = t.memory.key_of.get(content)
            listed = index.get(key, ()) if key is not None else ()
            copies = [oid for oid in listed if (o := before.objects.get(oid)) is not None and o.key == key]
            if not copies:
                break
            chain.append(copies)
        if sem.hit_cap:
            chain = chain[: (n - 1) // bs]
        for i, copies in enumerate(chain[: len(request.objects)]):
            if request.objects[i] not in copies:
                problems.append(
                    f"block {i} of {t.op.req!r} is new object {request.objects[i]!r} although "
                    f"its prefix was cached as {tuple(copies)!r}"
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


def hit_keeps_key(t: Transition) -> Problems:
    """A prefix hit takes its cached block back with its key: each block an admission hit still carries the
    key it was found under (dropping it breaks the chain the request's next blocks are keyed from)."""
    if t.op.op not in ("admit", "resume") or t.outcome.status != "ok" or t.semantics.granularity != "block":
        return None
    request = t.after.requests.get(t.op.req or "")
    if request is None or t.outcome.hit_tokens is None:
        return None
    problems = []
    for oid in request.objects[: t.outcome.hit_tokens // t.config.block_size]:
        was, now = t.before.objects.get(oid), t.after.objects.get(oid)
        if was is None or was.key is None:
            continue
        if now is None or now.key != was.key:
            key = None if now is None else now.key
            problems.append(f"{t.op} hit block {oid!r} cached as {was.key!r}, which now carries {key!r}")
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
    if b.objects != a.objects:  # equal as mappings (compared at C speed): no object changed
        for oid in set(b.objects) | set(a.objects):
            if b.objects.get(oid) != a.objects.get(oid):
                problems.append(f"object {oid!r} changed: {b.objects.get(oid)} -> {a.objects.get(oid)}")
    if b.requests != a.requests:
        for rid in set(b.requests) | set(a.requests):
            if b.requests.get(rid) != a.requests.get(rid):
                problems.append(f"request {rid!r} changed")
    if (b.index or {}) != (a.index or {}):
        problems.append("cache index changed")
    return problems


def bad_input_rejected(t: Transition) -> Problems:
    """Bad input gets the spec's error; valid input never does."""
    expected = bad_input(t)
    if expected is not None and t.outcome.status != "invalid":
        return [f"{t.op} is bad input ({expected}) but the outcome was {t.outcome.status!r}"]
    if expected is None and t.outcome.status == "invalid":
        return [f"{t.op} is valid but was rejected as bad input: {t.outcome.message}"]
    return []


# incremental=True: judged on a delta step's local part too (Transition.touched; deltas are taken at block
# granularity only). Each iterates objects, requests or index entries and judges each from lookups; on a
# truthful delta an object, request or entry outside the part is unchanged since the step that last judged
# it, and an object's readers are all in the part (KeptObservation.local), so the part's problems are the
# whole state's. capacity_conservation sums the part's change of sizes, by induction (its docstring); its base
# is judged whole every K steps and at the end (WHOLE_TOO).
# Within the kind, the order decides which broken invariant a report names first: the most
# specific cause comes before the generic symptoms it also produces.
SAFETY: tuple[Invariant, ...] = (
    Invariant("bad_input_rejected", "safety", bad_input_rejected, incremental=True),
    Invariant("atomic_failure", "safety", atomic_failure, incremental=True),
    Invariant("no_active_eviction", "safety", no_active_eviction, incremental=True),
    Invariant("hit_keeps_key", "safety", hit_keeps_key, frozenset({"block"}), ONE_TABLE, incremental=True),
    Invariant("share_without_duplication", "safety", share_without_duplication, layouts=ONE_TABLE, incremental=True),
    Invariant("tail_rounding", "safety", tail_rounding, layouts=ONE_TABLE, incremental=True),
    Invariant("cache_index_consistency", "safety", cache_index_consistency, layouts=ONE_TABLE, incremental=True),
    Invariant("non_negative_ref_counts", "safety", non_negative_ref_counts, incremental=True),
    Invariant("ref_count_matches_references", "safety", ref_count_matches_references, incremental=True),
    Invariant("capacity_conservation", "safety", capacity_conservation, incremental=True),
)

WHOLE_TOO: frozenset[str] = frozenset({"capacity_conservation"})
"""Incremental invariants whose local form is an induction step: judged on the whole state as well every K-th
step (and, as state invariants, at the end), where the base an example's first observation gave is checked."""

STATE: frozenset[str] = frozenset(
    {"capacity_conservation", "non_negative_ref_counts", "ref_count_matches_references", "tail_rounding",
     "cache_index_consistency"}
)  # fmt: skip
"""The state invariants: they read the state after a step only, so they judge a whole state on its own (the
full check at the end of a run that took deltas, spec.delta)."""
