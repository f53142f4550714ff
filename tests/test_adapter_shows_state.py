"""Adapters show state as it is: an index entry a lookup "cannot hit" is shown, and the checks judge it.

The adapter contract (kvspec/adapter/contract.py, docs/writing-an-adapter.md): an adapter never filters the
implementation's index or tables to what a lookup can hit. A seeded bug shows why: a small allocator of
nano-vllm's first API generation (tests/stale_index_allocator.py) keeps a reused block's old index entry. Shown
as it is, cache_index_consistency names the entry the step it goes stale; filtered away (the nano-vllm adapter's
old projection), nothing is reported until a later prompt of the old prefix is served the reused block, which
then shows only as that hit breaking hit_keeps_key.
"""

from __future__ import annotations

from pathlib import Path

from stale_index_allocator import HidesStaleEntries, ShowsStaleEntries

from kvspec.spec import Config, Op
from kvspec.spec.invariants import INVARIANT_NAMES
from kvspec.stateful_tests import PROFILES, Options, replay_ops, run_check

POOL = Config(capacity=2, block_size=2)
STALE = [
    Op("admit", "a", (0, 0)),  # block 0 cached under the key of [0, 0]
    Op("release", "a"),  # cached and free
    Op("admit", "b", (0, 1, 0, 0)),  # block 0 reused for [0, 1, 0, 0]'s second block: its old entry stays
    Op("release", "b"),
    Op("admit", "c", (0, 0)),  # the stale entry is hit: KV computed for another prefix
]


def test_a_stale_entry_shown_is_reported_by_cache_index_consistency_at_once() -> None:
    found = replay_ops(ShowsStaleEntries(), POOL, STALE, refine=False)
    assert found is not None and found.step == 2, found
    assert found.invariant == "cache_index_consistency", found
    assert any("cached as" in p for p in found.failures["cache_index_consistency"]), found.failures


def test_the_same_allocator_behind_a_filtered_index_shows_only_the_wrong_hit_later() -> None:
    """The projection the contract forbids: the entry is hidden, so the step that made it stale passes."""
    assert replay_ops(HidesStaleEntries(), POOL, STALE[:4], refine=False) is None
    found = replay_ops(HidesStaleEntries(), POOL, STALE, refine=False)
    assert found is not None and found.step == 4 and "cache_index_consistency" not in found.failures, found


def test_the_check_names_the_stale_entry_only_where_it_is_shown(tmp_path: Path) -> None:
    """`kvspec check`'s search, judging cache_index_consistency: on the index as it is, it names an entry that
    names a block not cached under its key, in a short case; behind the filter the same search passes (the flaw
    shows there only as the wrong hit, which other invariants judge)."""
    ignore = frozenset(INVARIANT_NAMES) - {"cache_index_consistency", "adapter_contract"}
    options = Options(profile=PROFILES["ci"], cases_dir=tmp_path, max_examples=40, refine=False, ignore=ignore)
    shown = run_check(ShowsStaleEntries, "shows-stale-entries", options)
    assert shown.failure is not None and shown.failure.invariant == "cache_index_consistency", shown.failure
    assert any(p.startswith("index entry ") for p in shown.failure.failures["cache_index_consistency"])
    assert len(shown.failure_ops) <= 4, shown.failure_ops
    hidden = run_check(HidesStaleEntries, "hides-stale-entries", options)
    assert hidden.status == "passed", hidden.failure
    assert hidden.tally.coverage["prefix_hit"] > 0  # the search did hit the cache
