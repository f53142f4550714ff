"""A catalogue of realistic allocator bugs, each seeded into a copy of a reference simulator.

Every invariant of the kit has at least one bug here that only it (or it first)
reports; tests/test_seeded_bugs.py asserts that `kvspec check` finds each one,
names the right invariant, and shrinks it to a short op sequence.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvspec.adapters.base import Adapter
from kvspec.adapters.reference_paged import ReferencePagedAdapter
from kvspec.reference.paged import Block, NoFreeBlocks, PagedPrefixCache
from kvspec.spec import Config, Op, Outcome


@dataclass(frozen=True)
class SeededBug:
    name: str
    invariant: str
    factory: Callable[[], Adapter]
    description: str
    max_ops: int = 8  # the shrunk counterexample is at most this long


def _paged(cls: type[PagedPrefixCache]) -> Callable[[], Adapter]:
    def factory() -> Adapter:
        return ReferencePagedAdapter(lambda c: cls(c.capacity, c.block_size, hit_cap=True))

    return factory


class ForgetDecrement(PagedPrefixCache):
    """free() skips the decrement of a block another request still shares."""

    def free(self, req_id: str, *, keep_cached: bool = True) -> None:
        for block in self.req_blocks.get(req_id, []):
            if block.ref_cnt > 1:
                block.ref_cnt += 1  # the later decrement cancels out: a reference leaks
        super().free(req_id, keep_cached=keep_cached)


class DoubleDecrement(PagedPrefixCache):
    """free() decrements the first block twice."""

    def free(self, req_id: str, *, keep_cached: bool = True) -> None:
        blocks = self.req_blocks.get(req_id, [])
        if blocks:
            blocks[0].ref_cnt -= 1
        super().free(req_id, keep_cached=keep_cached)


class TouchKeepsQueued(PagedPrefixCache):
    """A prefix hit on a cached-free block takes a reference but leaves it in the free queue."""

    def allocate(self, req_id: str, tokens: Sequence[int]) -> int:
        queued = dict(self.free_queue)
        hit = super().allocate(req_id, tokens)
        for block in self.req_blocks[req_id]:
            if block.block_id in queued and block.block_id not in self.free_queue and block.block_hash is not None:
                self.free_queue[block.block_id] = block  # still poppable while referenced
        return hit

    def free(self, req_id: str, *, keep_cached: bool = True) -> None:
        if req_id not in self.req_blocks:
            raise ValueError(f"unknown request {req_id!r}")
        blocks = self.req_blocks.pop(req_id)
        del self.req_tokens[req_id]
        for block in reversed(blocks):
            block.ref_cnt -= 1
            if block.ref_cnt == 0 and block.block_id not in self.free_queue:
                self.free_queue[block.block_id] = block


class LeakOnRefusal(PagedPrefixCache):
    """A refused admission keeps the references it took on its cached prefix."""

    def allocate(self, req_id: str, tokens: Sequence[int]) -> int:
        hit = self.find_cached_prefix(tokens)
        try:
            return super().allocate(req_id, tokens)
        except NoFreeBlocks:
            for block in hit:
                if block.ref_cnt == 0:
                    del self.free_queue[block.block_id]
                block.ref_cnt += 1
            raise


class FloorRounding(PagedPrefixCache):
    """Blocks per request rounded down: the partial tail gets no block."""

    def _blocks_needed(self, num_tokens: int) -> int:
        return max(1, num_tokens // self.block_size)

    def _cache_full_blocks(self, req_id: str, start: int) -> None:
        blocks, hashes = self.req_blocks[req_id], self.block_hashes(self.req_tokens[req_id])
        for i in range(start, min(len(hashes), len(blocks))):
            if hashes[i] not in self.cached:
                blocks[i].block_hash = hashes[i]
                self.cached[hashes[i]] = blocks[i]


class ShareCopies(PagedPrefixCache):
    """A cached prefix is copied into fresh blocks instead of shared."""

    def find_cached_prefix(self, tokens: Sequence[int]) -> list[Block]:
        return []


class ReuseKeepsIndex(PagedPrefixCache):
    """A cached-free block popped for reuse loses its hash but stays in the cache index."""

    def _take_free_blocks(self, n: int) -> list[Block]:
        taken = []
        for _ in range(n):
            _, block = self.free_queue.popitem(last=False)
            if block.block_hash is not None:
                self.evictions.append(("evict", block.block_id, block.block_hash))
                block.block_hash = None  # but the index entry stays
            block.ref_cnt = 1
            taken.append(block)
        return taken

    def _cache_full_blocks(self, req_id: str, start: int) -> None:
        blocks, hashes = self.req_blocks[req_id], self.block_hashes(self.req_tokens[req_id])
        for i in range(start, len(hashes)):
            if self.cached.get(hashes[i]) is None or self.cached[hashes[i]].block_hash != hashes[i]:
                blocks[i].block_hash = hashes[i]
                self.cached[hashes[i]] = blocks[i]


class LostOnReclaim(PagedPrefixCache):
    """A reclaimed block is never returned to the free queue: capacity leaks."""

    def free(self, req_id: str, *, keep_cached: bool = True) -> None:
        super().free(req_id, keep_cached=keep_cached)
        if not keep_cached:
            for block_id, block in list(self.free_queue.items()):
                if block.block_hash is None and block.hit_count == 0 and block_id == next(reversed(self.free_queue)):
                    del self.free_queue[block_id]


class SilentDoubleRelease(PagedPrefixCache):
    """Freeing a request that is not allocated is silently ignored."""

    def free(self, req_id: str, *, keep_cached: bool = True) -> None:
        if req_id in self.req_blocks:
            super().free(req_id, keep_cached=keep_cached)


class NoEvictionOnAdmit(PagedPrefixCache):
    """Admission counts only empty blocks as available, never cached-free ones."""

    def num_free_blocks(self) -> int:
        return sum(1 for b in self.free_queue.values() if b.block_hash is None)


class ShortChain(PagedPrefixCache):
    """The reported number of computed (cached) tokens misses the last hit block."""

    def allocate(self, req_id: str, tokens: Sequence[int]) -> int:
        return max(0, super().allocate(req_id, tokens) - self.block_size)


class MostRecentEvicted(PagedPrefixCache):
    """The free queue is popped from the tail: the most recently freed block is evicted first."""

    def _take_free_blocks(self, n: int) -> list[Block]:
        self.free_queue = type(self.free_queue)(reversed(list(self.free_queue.items())))
        taken = super()._take_free_blocks(n)
        self.free_queue = type(self.free_queue)(reversed(list(self.free_queue.items())))
        return taken


class EagerReclaim(PagedPrefixCache):
    """Release drops the cached prefix at once even when asked to keep it."""

    def free(self, req_id: str, *, keep_cached: bool = True) -> None:
        super().free(req_id, keep_cached=False)


class RaisesOnResume(ReferencePagedAdapter):
    """The adapter's engine crashes on a resumed request."""

    def apply(self, op: Op) -> Outcome:
        if op.op == "resume":
            raise KeyError(op.req)
        return super().apply(op)


class HangsOnReset(ReferencePagedAdapter):
    """The engine never returns from a cache reset."""

    def apply(self, op: Op) -> Outcome:
        if op.op == "reset_cache":
            time.sleep(3)
        return super().apply(op)


PAGED_BUGS: tuple[SeededBug, ...] = (
    SeededBug(
        "forget-decrement", "ref_count_matches_references", _paged(ForgetDecrement), ForgetDecrement.__doc__ or ""
    ),
    SeededBug("double-decrement", "non_negative_ref_counts", _paged(DoubleDecrement), DoubleDecrement.__doc__ or ""),
    SeededBug("evict-referenced", "no_active_eviction", _paged(TouchKeepsQueued), TouchKeepsQueued.__doc__ or ""),
    SeededBug("leak-on-refusal", "atomic_failure", _paged(LeakOnRefusal), LeakOnRefusal.__doc__ or ""),
    SeededBug("floor-rounding", "tail_rounding", _paged(FloorRounding), FloorRounding.__doc__ or ""),
    SeededBug("share-copies", "share_without_duplication", _paged(ShareCopies), ShareCopies.__doc__ or ""),
    SeededBug("reuse-keeps-index", "cache_index_consistency", _paged(ReuseKeepsIndex), ReuseKeepsIndex.__doc__ or ""),
    SeededBug("lost-on-reclaim", "capacity_conservation", _paged(LostOnReclaim), LostOnReclaim.__doc__ or ""),
    SeededBug(
        "silent-double-release", "bad_input_rejected", _paged(SilentDoubleRelease), SilentDoubleRelease.__doc__ or ""
    ),
    SeededBug(
        "no-eviction-on-admit", "predicted_admission", _paged(NoEvictionOnAdmit), NoEvictionOnAdmit.__doc__ or ""
    ),
    SeededBug("short-chain", "predicted_prefix_hits", _paged(ShortChain), ShortChain.__doc__ or ""),
    SeededBug("most-recent-evicted", "predicted_eviction", _paged(MostRecentEvicted), MostRecentEvicted.__doc__ or ""),
    SeededBug("eager-reclaim", "predicted_free_capacity", _paged(EagerReclaim), EagerReclaim.__doc__ or ""),
    SeededBug("raises-on-resume", "adapter_contract", RaisesOnResume, RaisesOnResume.__doc__ or ""),
)

HANG = SeededBug("hangs-on-reset", "adapter_contract", HangsOnReset, HangsOnReset.__doc__ or "")

SEEDED_BUGS: tuple[SeededBug, ...] = PAGED_BUGS

_ = Config
