"""Hybrid invariants: what any cache with several KV cache groups sharing one pool keeps (spec.kv_groups).

They read the HybridView the adapter shows and apply only to an implementation
that declares ``Semantics.layout`` ``per_group`` and shows its groups in the view. The
null placeholder is ``None`` in a table: no check counts it as a block.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable

from ..kv_groups import HybridView, hybrid_view, longest_common_hit
from .transition import Invariant, Problems, Transition, bad_input

PER_GROUP = frozenset({"per_group"})


def _views(t: Transition) -> tuple[HybridView, HybridView] | None:
    before, after = hybrid_view(t.before), hybrid_view(t.after)
    return None if before is None or after is None else (before, after)


def _prompt(t: Transition) -> tuple[int, ...]:
    """The tokens an admit or resume looks up: the prompt, or the preempted request's tokens."""
    if t.op.op == "admit":
        return t.op.tokens
    request = t.before.requests.get(t.op.req or "")
    return request.tokens if request is not None else ()


def _held(view: HybridView) -> Counter[Hashable]:
    """References to each real block from every running request's tables."""
    return Counter(b for tables in view.tables.values() for table in tables for b in table if b is not None)


# -- state invariants ------------------------------------------------------------------------


def hybrid_capacity_across_groups(t: Transition) -> Problems:
    """Every usable block is held by exactly one group or sits in the shared free queue; the null block by none.

    A block belongs to one group at a time (two groups never share one), and the
    null placeholder is never an object, never free and never in the index.
    """
    view = hybrid_view(t.after)
    if view is None:
        return None
    problems = []
    owner: dict[Hashable, int] = {}
    for rid, tables in view.tables.items():
        for g, table in enumerate(tables):
            for b in table:
                if b is None:
                    continue
                if owner.setdefault(b, g) != g:
                    problems.append(f"block {b!r} is in group {owner[b]}'s and group {g}'s tables (request {rid!r})")
    queued = set(view.free_queue)
    if len(owner) + len(queued) != t.after.capacity:
        problems.append(
            f"{len(owner)} block(s) held by the groups + {len(queued)} in the free queue != capacity {t.after.capacity}"
        )
    if view.null in t.after.objects or view.null in queued:
        problems.append(f"the null block {view.null!r} is counted as an object or as free")
    if any(view.null in oids for oids in (t.after.index or {}).values()):
        problems.append(f"the null block {view.null!r} is in the cache index")
    return problems


def hybrid_tables_match_tokens(t: Transition) -> Problems:
    """Each group's table has one position per block of the tokens computed: the null placeholder exactly where
    every token of the block is out of the group's window, a real block everywhere else."""
    view = hybrid_view(t.after)
    if view is None:
        return None
    problems = []
    running = {rid for rid, r in t.after.requests.items() if r.state == "running"}
    if set(view.tables) != running:
        problems.append(f"group tables are shown for {sorted(view.tables)}, running requests are {sorted(running)}")
    for rid in sorted(running & set(view.tables)):
        request, tables, computed = t.after.requests[rid], view.tables[rid], view.computed.get(rid, -1)
        if computed != len(request.tokens):
            problems.append(f"request {rid!r} holds {len(request.tokens)} tokens but {computed} are computed")
        for g, (group, table) in enumerate(zip(view.groups, tables, strict=True)):
            want, skipped = group.blocks_for(computed), group.skipped_blocks(computed)
            if len(table) != want:
                problems.append(
                    f"group {g} of {rid!r} has {len(table)} positions for {computed} tokens, expected {want}"
                )
            nulls = [i for i, b in enumerate(table) if b is None]
            if nulls != list(range(min(skipped, len(table)))):
                expected = f"0..{skipped - 1}" if skipped else "none"
                problems.append(
                    f"group {g} of {rid!r} ({computed} tokens) has the null block at {nulls}, expected {expected}"
                )
        real = tuple(b for table in tables for b in table if b is not None)
        if tuple(request.objects) != real:
            problems.append(f"request {rid!r} lists blocks {list(request.objects)}, its group tables {list(real)}")
    return problems


# -- transition invariants ---------------------------------------------------------------


def hybrid_window_freed_once(t: Transition) -> Problems:
    """A block released out of the window is freed exactly once: its ref count drops by its released positions,
    it joins the free queue once when none is left, and it is no longer counted as the request's.

    No block a running table still holds is in the free queue (evictable), and the free queue lists a block
    once. Judged on the steps where some table holds the null placeholder or released a block.
    """
    views = _views(t)
    if views is None:
        return None
    before, after = views
    released: Counter[Hashable] = Counter()
    for rid, tables in before.tables.items():
        now = after.tables.get(rid)
        if now is None:
            continue
        for old, table in zip(tables, now, strict=True):
            released.update(b for b, n in zip(old, table, strict=False) if b is not None and n is None)
    if not released and not any(b is None for ts in after.tables.values() for tb in ts for b in tb):
        return None
    problems = []
    held = _held(after)
    queue = Counter(after.free_queue)
    problems += [f"block {b!r} is in the free queue {n} times" for b, n in queue.items() if n > 1]
    problems += [f"block {b!r} is in the free queue while a running table holds it" for b in queue if b in held]
    for b in sorted(released, key=repr):
        was = t.before.objects.get(b)
        obj = t.after.objects.get(b)
        ref_before = was.ref_count if was is not None else 0
        ref_after = obj.ref_count if obj is not None else 0
        if ref_after != ref_before - released[b]:
            problems.append(
                f"block {b!r} released out of the window at {released[b]} position(s): ref_count went "
                f"{ref_before} -> {ref_after}"
            )
        if held[b] == 0 and queue[b] != 1:
            problems.append(
                f"block {b!r} released out of the window, held by none, is in the free queue {queue[b]} times"
            )
    return problems


def hybrid_hit_servable(t: Transition) -> Problems:
    """A hit is never longer than any group can serve: a whole number of every group's blocks, each group
    holding cached the blocks it still reads (and, with EAGLE, the blocks past the hit its lookup matched and
    dropped, within the prompt's whole blocks), and one prompt token left to compute."""
    if t.op.op not in ("admit", "resume") or t.outcome.status != "ok" or t.outcome.hit_tokens is None:
        return None
    views = _views(t)
    if views is None:
        return None
    before, _ = views
    hit, prompt = t.outcome.hit_tokens, _prompt(t)
    problems = []
    if hit and hit > len(prompt) - 1:
        problems.append(f"{t.op} hit {hit} of {len(prompt)} tokens: none is left to compute")
    for g, (group, cached) in enumerate(zip(before.groups, before.cached, strict=True)):
        if hit % group.block_size:
            problems.append(f"{t.op} hit {hit} tokens, not whole {group.block_size}-token blocks of group {g}")
        elif not group.servable(hit, prompt, cached):
            matched, bs = group.matched_blocks(hit), group.block_size
            missing = [i for i in matched if prompt[: (i + 1) * bs] not in cached]
            if matched.stop * bs > len(prompt):
                problems.append(
                    f"{t.op} hit {hit} tokens but group {g} ({group.kind}) drops {group.eagle_drop} block(s) past "
                    f"it for EAGLE, which end at token {matched.stop * bs} of a {len(prompt)}-token prompt"
                )
            else:
                problems.append(f"{t.op} hit {hit} tokens but group {g} ({group.kind}) has blocks {missing} uncached")
    return problems


def hybrid_no_lost_hit(t: Transition) -> Problems:
    """A hit is never shorter than the longest length every group could serve (no lost hits); with EAGLE, each
    group drops its ``eagle_drop`` blocks past that length once, not once per pass of the search."""
    if t.op.op not in ("admit", "resume") or t.outcome.status != "ok" or t.outcome.hit_tokens is None:
        return None
    views = _views(t)
    if views is None:
        return None
    before, _ = views
    longest = longest_common_hit(before.groups, _prompt(t), before.cached)
    if t.outcome.hit_tokens < longest:
        return [f"{t.op} hit {t.outcome.hit_tokens} tokens, but every group could serve {longest}"]
    return []


def _need(t: Transition, view: HybridView) -> int:
    """Blocks the operation takes from the free queue: new positions, and the idle cached blocks a hit reuses."""
    req = t.op.req or ""
    if t.op.op == "append":
        computed = view.computed.get(req, 0) + len(t.op.tokens)
        return sum(
            max(0, g.blocks_for(computed) - len(table)) for g, table in zip(view.groups, view.tables[req], strict=True)
        )
    prompt = _prompt(t)
    hit = longest_common_hit(view.groups, prompt, view.cached)
    need = 0
    for group, cached in zip(view.groups, view.cached, strict=True):
        need += group.blocks_for(len(prompt)) - hit // group.block_size
        for i in group.read_blocks(hit):
            obj = t.before.objects.get(cached[prompt[: (i + 1) * group.block_size]])
            need += obj is not None and obj.ref_count == 0
    return need


def hybrid_no_needless_refusal(t: Transition) -> Problems:
    """A refused admit, resume or append really lacked room: the free queue (free and idle cached blocks) was
    short of the blocks every group needs, out-of-window positions of a hit excepted."""
    if t.op.op not in ("admit", "resume", "append") or bad_input(t) is not None:
        return None
    views = _views(t)
    if views is None:
        return None
    if t.outcome.status != "refused":
        return []
    before, _ = views
    need, free = _need(t, before), len(before.free_queue)
    if need <= free:
        return [f"{t.op} was refused with {free} block(s) in the free queue >= {need} needed across the groups"]
    return []


# Within the kind, the most specific cause before the generic symptoms it also produces; they run before
# the block-level safety checks, as the group-level cause of what those see.
HYBRID_SAFETY: tuple[Invariant, ...] = (
    Invariant("hybrid_window_freed_once", "safety", hybrid_window_freed_once, frozenset({"block"}), PER_GROUP),
    Invariant("hybrid_hit_servable", "safety", hybrid_hit_servable, frozenset({"block"}), PER_GROUP),
    Invariant("hybrid_no_lost_hit", "safety", hybrid_no_lost_hit, frozenset({"block"}), PER_GROUP),
    Invariant("hybrid_tables_match_tokens", "safety", hybrid_tables_match_tokens, frozenset({"block"}), PER_GROUP),
    Invariant(
        "hybrid_capacity_across_groups", "safety", hybrid_capacity_across_groups, frozenset({"block"}), PER_GROUP
    ),
    Invariant("hybrid_no_needless_refusal", "safety", hybrid_no_needless_refusal, frozenset({"block"}), PER_GROUP),
)
