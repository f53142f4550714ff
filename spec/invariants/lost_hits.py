"""Lost hits, judged against what the pool holds: the blocks that carry a key, whatever the index says.

An implementation's index is one more thing under test: a prefix whose KV is still in the pool, held by a
block that carries its key, is a hit the next lookup must find (the engine otherwise recomputes it), and a
copy that a running request holds is shared before an idle duplicate is taken out of the free queue. These
checks read the objects and the keys the checker learned for them (``KeyMemory.holders``, the blocks that
carried each key in the step's before state, and ``KeyMemory.content``, the tokens behind a key), never the
index or the declared duplicate policy: a declared ``duplicate_keys`` chooses which copy a hit takes, it never
makes losing every copy correct. The one declared, bounded loss they judge is the admission gate
(``Semantics.admission_anchor_blocks``: a cold request's blocks past its anchor stay uncached, by rule).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from ..block_key import Prefix, block_keys
from ..observation import Observation, RequestView
from .transition import ONE_TABLE, Invariant, Problems, Transition


def cached_holders(t: Transition, content: Prefix) -> list[Hashable]:
    """The blocks of ``t.before`` that carry the key of ``content`` (full blocks holding exactly those tokens)."""
    memory = t.memory
    key = memory.key_of.get(content)
    if key is None:
        return []
    objects = t.before.objects
    return [oid for oid in memory.held(key) if (o := objects.get(oid)) is not None and o.key == key]


def best_hit_chain(t: Transition, tokens: Sequence[int]) -> list[Hashable]:
    """The blocks the best admission of ``tokens`` reuses in ``t.before``: the longest chain of prompt blocks
    the pool holds cached, hit-capped, each taken from a running request's copy where one holds it (sharing it
    takes nothing out of the free queue), else from an idle copy."""
    bs, objects = t.config.block_size, t.before.objects
    chain: list[Hashable] = []
    for content in block_keys(tuple(tokens), bs):
        holders = cached_holders(t, content)
        if not holders:
            break
        chain.append(max(holders, key=lambda oid: (objects[oid].ref_count > 0, repr(oid))))
    if t.semantics.hit_cap:
        chain = chain[: max(len(tokens) - 1, 0) // bs]
    return chain


def _admitted(t: Transition) -> RequestView | None:
    """The request an ok admit or resume admitted (its tokens are the prompt), else None."""
    if t.op.op not in ("admit", "resume") or t.outcome.status != "ok" or t.outcome.hit_tokens is None:
        return None
    return t.after.requests.get(t.op.req or "")


def no_lost_hit(t: Transition) -> Problems:
    """An admission serves from cache at least the longest prefix of its prompt whose full blocks the pool
    holds cached at that moment (each by a block carrying that prefix's key), under the declared hit cap:
    whatever the index says, a prefix whose KV is in the pool is never recomputed."""
    request = _admitted(t)
    if request is None:
        return None
    chain = best_hit_chain(t, request.tokens)
    bs = t.config.block_size
    assert t.outcome.hit_tokens is not None
    if t.outcome.hit_tokens < len(chain) * bs:
        return [
            f"{t.op} hit {t.outcome.hit_tokens} cached tokens, but the pool held the first {len(chain) * bs} "
            f"cached in block(s) {chain!r} (lost hits)"
        ]
    return []


def release_keeps_cache(t: Transition) -> Problems:
    """A release that keeps the cache, and a preemption, leave every full block of the tokens the request
    computed cached and findable by the next lookup: a block carries that prefix's key and, where the index is
    shown, an entry finds one that does (a cold request's blocks past the declared admission gate excepted; under
    preempt_keeps="cached", a preemption's blocks that the cache did not hold when it came)."""
    op = t.op
    if op.op not in ("release", "preempt") or t.outcome.status != "ok" or (op.op == "release" and not op.keep):
        return None
    if not t.semantics.prefix_caching:
        return None  # no prefix cache: nothing is kept for a later request, by declaration
    was = t.before.requests.get(op.req or "")
    if was is None or was.state != "running":
        return None
    bs, memory = t.config.block_size, t.memory
    contents = memory.block_keys(was, bs)
    anchor = t.semantics.admission_anchor_blocks
    if anchor is not None and was.req in memory.cold:
        contents = contents[:anchor]
    evicted = {e.oid for e in t.events if e.kind == "evict"}  # under pressure in this very step: not lost
    only_cached = op.op == "preempt" and t.semantics.preempt_keeps == "cached"
    problems = []
    for i, content in enumerate(contents):
        oid = was.objects[i] if i < len(was.objects) else None
        if only_cached and _key_before(t, oid) is None:
            continue  # declared: a preemption keeps what the cache held, not what was filled since
        key = _own_key(t, oid)
        if key is None:
            key = memory.key_of.get(content)
        candidates = memory.held(key) | {oid} if key is not None else set()
        if key is None:
            problems.append(f"{op} left block {i} of {was.req!r} uncached: its tokens are computed, and lost")
        elif not _findable(t.after, key, candidates) and not candidates & evicted:
            problems.append(f"{op} left no block holding block {i} of {was.req!r} that a lookup finds (key {key!r})")
    return problems


def _key_before(t: Transition, oid: Hashable) -> Hashable | None:
    """The key block ``oid`` carried before the step (None: uncached, or no such block)."""
    obj = t.before.objects.get(oid)
    return None if obj is None else obj.key


def _own_key(t: Transition, oid: Hashable) -> Hashable | None:
    """The key the request's own block carries after the step (cached on release) or carried before it."""
    for state in (t.after, t.before):
        obj = state.objects.get(oid)
        if obj is not None and obj.key is not None:
            return obj.key
    return None


def _findable(after: Observation, key: Hashable, candidates: set[Hashable]) -> bool:
    """Some block of ``after`` carries ``key``, and the index (where shown) finds one that does."""
    holding = {oid for oid in candidates if (o := after.objects.get(oid)) is not None and o.key == key}
    if not holding:
        return False
    if after.index is None:
        return True
    return any(oid in holding or ((o := after.objects.get(oid)) is not None and o.key == key)
               for oid in after.index.get(key, ()))  # fmt: skip


def no_needless_allocation(t: Transition) -> Problems:
    """An admission takes nothing out of the free queue that it could have shared: each prompt block it serves
    from cache whose prefix a running request's block held is that shared block, not an idle duplicate."""
    request = _admitted(t)
    if request is None:
        return None
    bs, before = t.config.block_size, t.before
    assert t.outcome.hit_tokens is not None
    problems = []
    contents = t.memory.block_keys(request, bs)[: t.outcome.hit_tokens // bs]
    for i, (content, oid) in enumerate(zip(contents, request.objects, strict=False)):
        mine = before.objects.get(oid)
        if mine is not None and mine.ref_count:
            continue
        shared = [h for h in cached_holders(t, content) if before.objects[h].ref_count]
        if shared:
            problems.append(
                f"{t.op} took block {oid!r} for block {i} out of the free queue although running request(s) "
                f"held {shared!r} with the same tokens"
            )
    return problems


# incremental=True: each reads the step's own request and looks objects up in the whole state (KeyMemory.holders
# names the blocks that carry a key; on a delta step it is kept from the touched objects, as KeyMemory.keyed).
LOST_HIT_SAFETY: tuple[Invariant, ...] = (
    Invariant("no_lost_hit", "safety", no_lost_hit, frozenset({"block"}), ONE_TABLE, incremental=True),
    Invariant("release_keeps_cache", "safety", release_keeps_cache, frozenset({"block"}), ONE_TABLE, incremental=True),
)
LOST_HIT_POLICY: tuple[Invariant, ...] = (
    Invariant("no_needless_allocation", "policy", no_needless_allocation, frozenset({"block"}), ONE_TABLE,
              incremental=True),
)  # fmt: skip
