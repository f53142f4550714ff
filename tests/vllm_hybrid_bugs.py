"""Realistic bugs seeded into vLLM's own hybrid allocator, each reported by one named hybrid invariant.

Like tests/vllm_bugs.py: each bug replaces one method (or property) of a vLLM
class by a version with a mistake an engine developer could make, written
against the installed method (``make`` receives the original), and names the
hybrid configuration (adapters/vllm_hybrid.py) that reaches it.
tests/test_vllm_hybrid.py asserts that `kvspec check` reports each with its
invariant. These are the seeded bugs of the hybrid invariants
(spec/invariants/hybrid.py): tests/test_seeded_bugs.py counts them with the
reference catalogue. Importing this module does not import vLLM.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vllm_bugs import Method, VllmBug

from kvspec.gate import Baseline, Entry

COORDINATOR = "vllm.v1.core.kv_cache_coordinator"
SINGLE_TYPE = "vllm.v1.core.single_type_kv_cache_manager"


def _window_one_block_too_many(original: Method) -> Method:
    def get_num_skipped_tokens(self: Any, num_computed_tokens: int) -> int:
        skipped = int(original(self, num_computed_tokens))
        return skipped + self.block_size if skipped > 0 else 0  # the window's edge counted one block late

    return get_num_skipped_tokens


class _CountsAsTwo(list):  # type: ignore[type-arg]
    """The attention groups as a list whose length reads 2: the coordinator takes any hybrid for a simple one."""

    def __len__(self) -> int:
        return 2


def _stops_after_one_pass(original: Method) -> Method:
    def find_longest_cache_hit(self: Any, block_hashes: Any, max_cache_hit_length: int) -> Any:
        groups = self.attention_groups
        self.attention_groups = _CountsAsTwo(groups)  # "one full + one other: one iteration suffices"
        try:
            return original(self, block_hashes, max_cache_hit_length)
        finally:
            self.attention_groups = groups

    return find_longest_cache_hit


def _aligns_to_hash_blocks(original: Any) -> Any:
    # Hits are aligned to the hash block size, not to the scheduler block size (every group's block size).
    return property(lambda self: self.hash_block_size)


def _frees_last_skipped_twice(original: Method) -> Method:
    def _remove_blocks_in_range(self: Any, request_id: str, first_block: int, last_block: int) -> None:
        blocks = self.req_to_blocks.get(request_id) or []
        span = [b for b in blocks[first_block : min(last_block, len(blocks))] if not b.is_null]
        original(self, request_id, first_block, last_block)
        if span:
            self.block_pool.free_blocks([span[-1]])  # the block at the window's edge is freed again

    return _remove_blocks_in_range


def _second_group_reuses_first_block(original: Method) -> Method:
    def allocate_new_blocks(self: Any, request_id: str, *args: Any, **kwargs: Any) -> Any:
        new = original(self, request_id, *args, **kwargs)
        if len(new) > 1 and new[0] and new[1]:
            table = self.single_type_managers[1].req_to_blocks[request_id]
            own = table[-1]
            table[-1] = new[0][-1]  # group 1's new tail is the block group 0 just got
            self.block_pool.free_blocks([own])
        return new

    return allocate_new_blocks


def _drops_short_window_hits(original: Any) -> Any:
    find = original.__func__  # a classmethod

    def find_longest_cache_hit(cls: Any, *args: Any, **kwargs: Any) -> Any:
        blocks, length = find(cls, *args, **kwargs)
        spec, bs = kwargs["kv_cache_spec"], kwargs["kv_cache_spec"].block_size
        if 0 < length < cls._contiguous_blocks_for_hit(spec.sliding_window, bs, kwargs["drop_eagle_block"]) * bs:
            return tuple([] for _ in blocks), 0  # a run shorter than the window is taken for a miss
        return blocks, length

    return classmethod(find_longest_cache_hit)


def _reserves_a_block_for_null(original: Method) -> Method:
    def get_num_blocks_to_allocate(self: Any, *args: Any, **kwargs: Any) -> int:
        return int(original(self, *args, **kwargs)) + 1  # one more, "for the null placeholder"

    return get_num_blocks_to_allocate


def _eagle_run_one_block_short(original: Any) -> Any:
    run = original.__func__  # a classmethod

    def _contiguous_blocks_for_hit(cls: Any, window_size: int, block_size: int, use_eagle: bool) -> int:
        return int(run(cls, window_size, block_size, False))  # the run is not widened for the block EAGLE drops

    return classmethod(_contiguous_blocks_for_hit)


def _eagle_drops_twice(original: Any) -> Any:
    find = original.__func__  # a classmethod

    def find_longest_cache_hit(cls: Any, *args: Any, **kwargs: Any) -> Any:
        blocks, length = find(cls, *args, **kwargs)
        if kwargs.get("drop_eagle_block") and blocks[0]:
            for group_blocks in blocks:  # the caller drops the last matched block again
                group_blocks.pop()
            length = len(blocks[0]) * kwargs["kv_cache_spec"].block_size
        return blocks, length

    return classmethod(find_longest_cache_hit)


def _eagle_lookup_capped(original: Method) -> Method:
    def find_longest_cache_hit(self: Any, block_hashes: Any, max_cache_hit_length: int) -> Any:
        # The EAGLE lookup may not read past the hit cap (prompt - 1) before it drops: the hashes of a
        # block-aligned prompt's last block are out of its reach (vLLM's code up to 0.3x, see docs/vllm.md).
        return original(self, list(block_hashes)[: max_cache_hit_length // self.hash_block_size], max_cache_hit_length)

    return find_longest_cache_hit


HYBRID_BUGS: tuple[VllmBug, ...] = (
    VllmBug(
        "window-frees-one-too-many",
        "hybrid_tables_match_tokens",
        SINGLE_TYPE,
        "SlidingWindowManager",
        "get_num_skipped_tokens",
        _window_one_block_too_many,
        "the sliding window's skipped tokens end one block late: a block still inside the window is released",
        adapter="vllm-hybrid-sliding",
    ),
    VllmBug(
        "coordinator-stops-early",
        "hybrid_hit_servable",
        COORDINATOR,
        "HybridKVCacheCoordinator",
        "find_longest_cache_hit",
        _stops_after_one_pass,
        "the coordinator's fixed-point search stops after one pass over the groups, as if every hybrid were one "
        "full-attention group and one other: a later group's cut is not rechecked by the earlier ones",
        adapter="vllm-hybrid-mixed",
    ),
    VllmBug(
        "hit-not-aligned",
        "hybrid_hit_servable",
        COORDINATOR,
        "HybridKVCacheCoordinator",
        "_cache_hit_alignment_tokens",
        _aligns_to_hash_blocks,
        "hits are aligned to the hash block size instead of every group's block size: the sliding window's "
        "hit cuts a full-attention block in two",
        adapter="vllm-hybrid-sizes",
    ),
    VllmBug(
        "skipped-block-freed-twice",
        "hybrid_window_freed_once",
        SINGLE_TYPE,
        "SingleTypeKVCacheManager",
        "_remove_blocks_in_range",
        _frees_last_skipped_twice,
        "remove_skipped_blocks frees the blocks that left the window, then the last of them a second time",
        adapter="vllm-hybrid-sliding",
    ),
    VllmBug(
        "groups-share-a-block",
        "hybrid_capacity_across_groups",
        COORDINATOR,
        "KVCacheCoordinator",
        "allocate_new_blocks",
        _second_group_reuses_first_block,
        "the second KV cache group's new tail block is the one the first group just got: two groups hold one "
        "block of the shared pool",
        adapter="vllm-hybrid-sliding",
    ),
    VllmBug(
        "window-drops-short-hit",
        "hybrid_no_lost_hit",
        SINGLE_TYPE,
        "SlidingWindowManager",
        "find_longest_cache_hit",
        _drops_short_window_hits,
        "the sliding-window lookup takes a cached run shorter than the window for a miss, although it starts at "
        "the prompt's first block and so is all the window reads",
        adapter="vllm-hybrid-sliding",
    ),
    VllmBug(
        "reserves-null-block",
        "hybrid_no_needless_refusal",
        COORDINATOR,
        "KVCacheCoordinator",
        "get_num_blocks_to_allocate",
        _reserves_a_block_for_null,
        "the coordinator asks for one block more than the groups need (a block for the null placeholder): a "
        "request that exactly fits is refused",
        adapter="vllm-hybrid-sliding",
    ),
    VllmBug(
        "eagle-window-run-too-short",
        "hybrid_hit_servable",
        SINGLE_TYPE,
        "SlidingWindowManager",
        "_contiguous_blocks_for_hit",
        _eagle_run_one_block_short,
        "with EAGLE the sliding-window lookup still pops its last matched block but no longer asks for one more "
        "contiguous block: the hit it grants needs a block before the window's run that may be evicted",
        adapter="vllm-hybrid-sliding-eagle",
    ),
    VllmBug(
        "eagle-drops-twice",
        "hybrid_no_lost_hit",
        SINGLE_TYPE,
        "FullAttentionManager",
        "find_longest_cache_hit",
        _eagle_drops_twice,
        "with EAGLE the full-attention lookup drops its last matched block twice (the manager and again its "
        "caller): every hit is one block shorter than every group could serve",
        adapter="vllm-hybrid-sliding-eagle",
    ),
)

EAGLE_LOOKUP_CAPPED = VllmBug(
    "eagle-lookup-capped",
    "hybrid_no_lost_hit",
    COORDINATOR,
    "HybridKVCacheCoordinator",
    "find_longest_cache_hit",
    _eagle_lookup_capped,
    "the EAGLE lookup reads no further than the hit cap (prompt - 1) before dropping a block: on a "
    "block-aligned prompt the last whole block is never matched, so the hit is one block short",
    adapter="vllm-hybrid-sliding-eagle",
)
"""The historical code of the known hybrid bug, seeded into the installed release (not searched for: under the
ci profile the lost hit first shows as a refusal the longest hit would have avoided,
hybrid_no_needless_refusal, after ~90 s; the regression replays the release matrix's case instead)."""

HYBRID_KNOWN_BUGS_FILE = Path(__file__).parent / "data" / "vllm-hybrid-known-bugs.json"
"""Counterexamples the release matrix found in released vLLM's hybrid allocator, a kvspec baseline like
tests/data/vllm-known-bugs.json: adapter, invariant, release range, shrunk case."""

HYBRID_KNOWN_BUGS: tuple[Entry, ...] = (
    tuple(Baseline.load(HYBRID_KNOWN_BUGS_FILE).entries) if HYBRID_KNOWN_BUGS_FILE.exists() else ()
)

HYBRID_SEEDED_AS: dict[str, VllmBug] = {
    "e283b771b3170a5b": EAGLE_LOOKUP_CAPPED,
    "4da7fd4cc99e66c0": next(b for b in HYBRID_BUGS if b.name == "eagle-drops-twice"),
}
"""Known hybrid bug (fingerprint) -> the VllmBug that reproduces its historical code in the installed release."""
