"""The hybrid spec without vLLM: what the per-group parameters mean, and the hybrid invariants on hand-built steps.

The examples of skipped tokens are the ones vLLM's own docstrings give for
SlidingWindowManager and ChunkedLocalAttentionManager.get_num_skipped_tokens.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

from kvspec.spec import Config, KeyMemory, ObjectView, Observation, Op, Outcome, RequestView, Semantics, Transition
from kvspec.spec.hybrid import HYBRID, HybridView, KvGroup, Table, hit_granularity, longest_common_hit
from kvspec.spec.invariants import INVARIANTS, check_transition

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
