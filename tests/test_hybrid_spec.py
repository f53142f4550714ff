"""The hybrid spec without vLLM: what the per-group parameters mean, and the hybrid invariants on hand-built steps.

The examples of skipped tokens are the ones vLLM's own docstrings give for
SlidingWindowManager and ChunkedLocalAttentionManager.get_num_skipped_tokens.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

from kvspec.spec import Config, ObjectView, Observation, Op, Outcome, RequestView, Semantics
from kvspec.spec.invariants import INVARIANTS, KeyMemory, Transition, check_transition
from kvspec.spec.kv_groups import HYBRID, HybridView, KvGroup, Table, hit_granularity, longest_common_hit

FULL, WINDOW, CHUNK = KvGroup("full", 4), KvGroup("sliding_window", 4, window=8), KvGroup("chunked_local", 4, chunk=8)
HYBRID_SEMANTICS = Semantics(layout="per_group", exact=False)
PROMPT = tuple(range(17))


def test_skipped_tokens_follow_vllms_examples() -> None:
    assert KvGroup("sliding_window", 4, window=4).skipped_tokens(7) == 4
    assert [CHUNK.skipped_tokens(n) for n in (13, 8, 7)] == [8, 8, 0]
    assert FULL.skipped_tokens(100) == 0
    assert WINDOW.skipped_blocks(17) == 2 and CHUNK.skipped_blocks(17) == 4
    assert KvGroup("sliding_window", 4, window=8, releases_out_of_window=False).skipped_blocks(17) == 0


def test_a_hit_needs_only_the_blocks_the_next_token_reads() -> None:
    cached = {PROMPT[: 4 * (i + 1)]: i for i in (2, 3)}  # blocks 2 and 3 only
    assert WINDOW.servable(16, PROMPT, cached) and not FULL.servable(16, PROMPT, cached)
    assert not WINDOW.servable(12, PROMPT, cached)  # needs blocks 1 and 2
    assert CHUNK.servable(16, PROMPT, {}) and not CHUNK.servable(12, PROMPT, {})  # 16 starts a chunk
    assert not WINDOW.servable(6, PROMPT, cached)  # not whole blocks


def test_longest_common_hit_is_on_every_groups_blocks() -> None:
    every = {PROMPT[: 4 * (i + 1)]: i for i in range(4)}
    assert longest_common_hit((FULL, WINDOW), PROMPT, (every, every)) == 16
    assert longest_common_hit((FULL, WINDOW), PROMPT[:16], (every, every)) == 12  # one token left to compute
    gapped = {k: v for k, v in every.items() if v != 2}
    assert longest_common_hit((FULL, WINDOW), PROMPT, (every, gapped)) == 8
    big = KvGroup("full", 8)
    assert hit_granularity((big, WINDOW)) == 8


def test_eagle_matches_one_block_past_the_hit_and_drops_it() -> None:
    """With EAGLE each group's lookup must have matched the block after the hit (then dropped, recomputed for the
    draft head): a window needs its run plus that block, and the block must be a whole block of the prompt."""
    full, window = KvGroup("full", 4, eagle_drop=1), KvGroup("sliding_window", 4, window=8, eagle_drop=1)
    every = {PROMPT[: 4 * (i + 1)]: i for i in range(4)}
    assert longest_common_hit((full, window), PROMPT, (every, every)) == 12  # 16 would drop tokens 16-19
    assert longest_common_hit((full, window), PROMPT[:16], (every, every)) == 12  # the last whole block is dropped
    assert longest_common_hit((full, window), PROMPT[:15], (every, every)) == 8
    assert window.matched_blocks(12) == range(1, 4) and full.matched_blocks(8) == range(3)
    assert not window.servable(12, PROMPT, {k: v for k, v in every.items() if v != 1})  # needs blocks 1, 2, 3
    assert WINDOW.servable(12, PROMPT, {k: v for k, v in every.items() if v != 0})  # without EAGLE: 1 and 2
    assert window.servable(0, PROMPT, {})


def test_an_eagle_hit_short_by_a_second_drop_is_a_lost_hit() -> None:
    """Two groups with EAGLE over cached blocks 0-3 serve 12 of 17 tokens: an admit that hit 8 (a block dropped
    twice) is reported by hybrid_no_lost_hit; one that hit 16 (no block left past it to drop) by
    hybrid_hit_servable."""
    full, window = KvGroup("full", 4, eagle_drop=1), KvGroup("sliding_window", 4, window=8, eagle_drop=1)
    every = {PROMPT[: 4 * (i + 1)]: i + 1 for i in range(4)}
    hv = HybridView((full, window), {}, {}, (every, every), tuple(range(1, 11)), 0)
    empty = observation(hv)
    op = Op("admit", "a", PROMPT)
    after = observation(HybridView((full, window), {}, {}, (every, every), tuple(range(1, 11)), 0))
    assert "hybrid_no_lost_hit" in failures(empty, after, op, Outcome.ok(8))
    assert "hybrid_hit_servable" in failures(empty, after, op, Outcome.ok(16))
    assert not {"hybrid_no_lost_hit", "hybrid_hit_servable"} & set(failures(empty, after, op, Outcome.ok(12)))


def view(tables: Mapping[str, tuple[Table, ...]], computed: int, queue: tuple[Hashable, ...] = ()) -> HybridView:
    return HybridView((FULL, WINDOW), tables, dict.fromkeys(tables, computed), ({}, {}), queue, 0)


def observation(hv: HybridView, capacity: int = 10, ref: int = 1) -> Observation:
    blocks = [b for ts in hv.tables.values() for t in ts for b in t if b is not None]
    objects = {b: ObjectView(b, 1, 4, ref, None) for b in blocks}
    objects |= {b: ObjectView(b, 1, 4, 0, ("k", b)) for b in hv.free_queue}
    requests = {rid: RequestView(rid, PROMPT, len(PROMPT), tuple(blocks)) for rid in hv.tables}
    free = capacity - len(objects)
    return Observation(capacity, free, objects, requests, {}, {HYBRID: hv})


def failures(before: Observation, after: Observation, op: Op, outcome: Outcome) -> dict[str, list[str]]:
    t = Transition(before, op, outcome, (), after, Config(10, 4), HYBRID_SEMANTICS, KeyMemory())
    return {name: problems for name, problems in check_transition(t).items() if problems}


def test_tables_and_windows_are_judged_per_group() -> None:
    """A correct admission holds every hybrid check; a window that released a block it still reads does not."""
    empty = observation(HybridView((FULL, WINDOW), {}, {}, ({}, {}), tuple(range(1, 11)), 0))
    good = observation(view({"a": ((1, 2, 3, 4, 5), (None, None, 8, 9, 10))}, 17, (6, 7)))
    op = Op("admit", "a", PROMPT)
    assert failures(empty, good, op, Outcome.ok(0)) == {}
    early = observation(view({"a": ((1, 2, 3, 4, 5), (None, None, None, 9, 10))}, 17, (6, 7, 8)))
    assert set(failures(empty, early, op, Outcome.ok(0))) == {"hybrid_tables_match_tokens"}


def test_one_table_checks_do_not_apply_to_a_per_group_cache() -> None:
    one_table = [inv for inv in INVARIANTS if inv.layouts == frozenset({"one_table"})]
    assert {inv.name for inv in one_table} >= {"tail_rounding", "cache_index_consistency", "no_spurious_refusal"}
    assert not any(inv.applies(HYBRID_SEMANTICS) for inv in one_table)
    hybrid = [inv for inv in INVARIANTS if inv.name.startswith("hybrid_")]
    assert hybrid and not any(inv.applies(Semantics()) for inv in hybrid)
