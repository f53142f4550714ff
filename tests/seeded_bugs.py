"""A catalogue of realistic allocator bugs, each seeded into a copy of a reference simulator.

Every invariant of the kit has at least one bug here that only it (or it first)
reports; tests/test_seeded_bugs.py asserts that `kvspec check` finds each one,
names the right invariant, and shrinks it to a short op sequence.

Bugs come from the three bundled implementations: the paged prefix cache
(block granularity), the lifecycle simulator (record granularity) and the
scheduler simulator (entry granularity). Each entry names the unbugged adapter
of the same kind, on which its counterexample must hold.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvspec.adapter import Adapter
from kvspec.adapters.lifecycle_sim import LifecycleSimAdapter
from kvspec.adapters.reference_paged import (
    ReferenceFamilyProtectAdapter,
    ReferenceNewestAdapter,
    ReferencePagedAdapter,
    ReferenceSharedAwareAdapter,
    policy_for,
)
from kvspec.adapters.scheduler_sim import SchedulerSimAdapter
from kvspec.reference.eviction_policies import BlockStats, FamilyProtectPolicy, SharedAwarePolicy
from kvspec.reference.lifecycle import CapacityError, LifecycleSim, Record
from kvspec.reference.paged import Block, NoFreeBlocks, PagedPrefixCache, hash_block
from kvspec.reference.paged_newest import NewestOwnsIndex
from kvspec.reference.scheduler import Entry, QueueItem, SchedulerSim
from kvspec.spec import Op, Outcome, Semantics

AdapterFactory = Callable[[], Adapter]


@dataclass(frozen=True)
class SeededBug:
    """One buggy adapter, the invariant that must report it, and the unbugged adapter it was seeded into."""

    name: str
    invariant: str
    factory: AdapterFactory
    description: str
    max_ops: int = 8  # the shrunk counterexample is at most this long
    correct: AdapterFactory = ReferencePagedAdapter
    # The invariant the kit names first (Violation.invariant, the case file's "invariant") where it is not
    # ``invariant``: the same step also breaks one listed earlier in INVARIANT_NAMES. Measured, not chosen.
    named_first: str = ""
    # Other invariants the bug breaks first on some paths (both its symptoms: which one a search meets first
    # depends on the path it takes). Measured, not chosen.
    symptoms: frozenset[str] = frozenset()


def _doc(cls: type) -> str:
    """The first line of a bug class's docstring: the realistic mistake it makes."""
    return (cls.__doc__ or "").strip().splitlines()[0]


# -- the paged prefix cache (block granularity) ---------------------------------------


def _paged(cls: type[PagedPrefixCache]) -> AdapterFactory:
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
    """A prefix hit on a cached-free block takes a reference but leaves it in the free queue.

    The pool counts references up as vLLM's does (``ref_cnt += 1``, not ``= 1``), so a
    popped block that is still read keeps a correct count: what breaks is that it is
    evicted and handed out while another request reads it.
    """

    def _take_free_blocks(self, n: int) -> list[Block]:
        taken = []
        for _ in range(n):
            _, block = self.free_queue.popitem(last=False)
            if block.block_hash is not None:
                del self.cached[block.block_hash]
                self.evictions.append(("evict", block.block_id, block.block_hash))
                block.block_hash = None
                block.hit_count = 0
            block.ref_cnt += 1
            taken.append(block)
        return taken

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
    """A cached prefix is copied into fresh blocks instead of shared, whenever the pool has room for the copy."""

    def find_cached_prefix(self, tokens: Sequence[int]) -> list[Block]:
        found = super().find_cached_prefix(tokens)
        # Only where the copy fits: otherwise it would refuse what sharing admits, which
        # no_spurious_refusal reports first, and this bug is the one for share_without_duplication.
        return [] if self._blocks_needed(len(tokens)) <= self.num_free_blocks() else found

    def allocate(self, req_id: str, tokens: Sequence[int]) -> int:
        # It claims the hit it copied (the KV is there, in the copy): no lost hit, a duplication.
        claimed = len(PagedPrefixCache.find_cached_prefix(self, tokens)) * self.block_size
        return max(super().allocate(req_id, tokens), claimed)


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


class HitDropsKey(PagedPrefixCache):
    """A prefix hit on a cached-free block takes it back as a fresh block: its hash is dropped (nano-vllm 8d63a98)."""

    def allocate(self, req_id: str, tokens: Sequence[int]) -> int:
        idle = [b for b in self.find_cached_prefix(tokens) if b.ref_cnt == 0]
        hit = super().allocate(req_id, tokens)
        for block in idle:
            if block.block_hash is not None:
                self._uncache(block)
        return hit


class DropsEntryOnFree(PagedPrefixCache):
    """A block whose last reference goes leaves the cache index but keeps its hash: lost hits (nano-vllm-fork)."""

    def free(self, req_id: str, *, keep_cached: bool = True) -> None:
        blocks = list(self.req_blocks.get(req_id, []))
        super().free(req_id, keep_cached=keep_cached)
        for block in blocks:
            if block.ref_cnt == 0 and block.block_hash is not None and self.cached.get(block.block_hash) is block:
                del self.cached[block.block_hash]

    def _cache_full_blocks(self, req_id: str, start: int) -> None:
        blocks, hashes = self.req_blocks[req_id], self.block_hashes(self.req_tokens[req_id])
        for i in range(start, len(hashes)):
            if hashes[i] not in self.cached:
                blocks[i].block_hash, blocks[i].parent_hash = hashes[i], hashes[i - 1] if i else None
                self.cached[hashes[i]] = blocks[i]

    def _uncache(self, block: Block) -> None:
        assert block.block_hash is not None
        owner = self.cached.get(block.block_hash)
        self.cached[block.block_hash] = block
        super()._uncache(block)
        if owner is not None and owner is not block and owner.block_hash is not None:
            self.cached[owner.block_hash] = owner


class NewestKeepsFirst(NewestOwnsIndex):
    """Declared newest-owns, but a duplicate leaves the index entry with the block that had it first."""

    def _cache_full_blocks(self, req_id: str, start: int) -> None:
        blocks, hashes = self.req_blocks[req_id], self.block_hashes(self.req_tokens[req_id])
        for i in range(start, len(hashes)):
            blocks[i].block_hash, blocks[i].parent_hash = hashes[i], hashes[i - 1] if i else None
            self.cached.setdefault(hashes[i], blocks[i])


class NewestUnkeysOwner(NewestOwnsIndex):
    """Declared newest-owns, but the new block takes the index entry by dropping the hash of the block that had it."""

    def _cache_full_blocks(self, req_id: str, start: int) -> None:
        blocks, hashes = self.req_blocks[req_id], self.block_hashes(self.req_tokens[req_id])
        for i in range(start, len(hashes)):
            owner = self.cached.get(hashes[i])
            if owner is not None and owner is not blocks[i]:
                PagedPrefixCache._uncache(self, owner)
        super()._cache_full_blocks(req_id, start)


class DropsComputedOnFree(PagedPrefixCache):
    """Release frees an unhashed duplicate block even when no other block holds its hash any more: what the
    request computed is dropped instead of cached (the paged reference before the lost-hit checks)."""

    def free(self, req_id: str, *, keep_cached: bool = True) -> None:
        blocks = self.req_blocks.get(req_id, [])
        unhashed = {b.block_id for b in blocks if b.block_hash is None}
        super().free(req_id, keep_cached=keep_cached)
        for block in blocks:
            if block.block_id in unhashed and block.block_hash is not None and not block.ref_cnt:
                self._uncache(block)


class NewestForgetsCopies(NewestOwnsIndex):
    """One index entry per hash, the newest block's: when it leaves the cache the hash leaves the index, and the
    older copies the pool still holds are found by no lookup (nano-vllm's hash_to_block_id)."""

    def _uncache(self, block: Block) -> None:
        if self.cached.get(block.block_hash or b"") is block:
            self.copies.pop(block.block_hash or b"", None)  # the index remembers no older copy
        super()._uncache(block)


class IndexedCopies(NewestOwnsIndex):
    """Every copy of a hash indexed in insertion order, the first one the entry (duplicate_keys="indexed")."""

    def _cache_full_blocks(self, req_id: str, start: int) -> None:
        blocks, hashes = self.req_blocks[req_id], self.block_hashes(self.req_tokens[req_id])
        limit = self.req_cache_limit.get(req_id)
        for i in range(start, len(hashes) if limit is None else min(len(hashes), limit)):
            owner = self.cached.get(hashes[i])
            if owner is None:
                self._cache_block(blocks[i], hashes, i)
            elif owner is not blocks[i] and blocks[i] not in self.copies.get(hashes[i], []):
                blocks[i].block_hash, blocks[i].parent_hash = hashes[i], hashes[i - 1] if i else None
                blocks[i].prefix_depth = i + 1
                self.copies.setdefault(hashes[i], []).append(blocks[i])
                if i:
                    self.children[hashes[i - 1]] += 1


class IndexedForgetsCopies(IndexedCopies):
    """Indexed copies, but when the entry's block leaves the cache the copies behind it leave the index too."""

    def _uncache(self, block: Block) -> None:
        if self.cached.get(block.block_hash or b"") is block:
            self.copies.pop(block.block_hash or b"", None)
        super()._uncache(block)


class PrefersIdleCopy(NewestOwnsIndex):
    """A hit takes the index entry's idle copy although a running request holds another with the same tokens:
    one block more leaves the free queue than the admission needs."""

    def find_cached_prefix(self, tokens: Sequence[int]) -> list[Block]:
        return PagedPrefixCache.find_cached_prefix(self, tokens)


class OverCountsFirstBlock(PagedPrefixCache):
    """An admission takes one reference too many on the request's first block."""

    def allocate(self, req_id: str, tokens: Sequence[int]) -> int:
        hit = super().allocate(req_id, tokens)
        self.req_blocks[req_id][0].ref_cnt += 1
        return hit


class UnchainedHashes(PagedPrefixCache):
    """A block's hash is its own tokens only, not chained on its parent's: a lookup hits a block that holds the
    same tokens after another prefix (a wrong-prefix hit: wrong output)."""

    def block_hashes(self, tokens: Sequence[int]) -> list[bytes]:
        bs = self.block_size
        return [hash_block(None, tokens[i : i + bs]) for i in range(0, len(tokens) - bs + 1, bs)]


class WrongHitBehindLeak(OverCountsFirstBlock, UnchainedHashes):
    """Both: every admission breaks ref counts first, so a plain run never reaches the wrong-prefix hit."""


class BystanderReference(PagedPrefixCache):
    """allocate() also takes a reference on the first block of another live request, outside the new one's table.

    The adapter's delta (ReferencePagedAdapter.observe_delta) names the admitted request's blocks only, so the
    corrupted block lies outside the step's reported delta: with incremental checking on, the local check of
    that step cannot see it, and the periodic full check (every K steps, and at the end) must.
    """

    def allocate(self, req_id: str, tokens: Sequence[int]) -> int:
        hit = super().allocate(req_id, tokens)
        other = next((blocks for req, blocks in self.req_blocks.items() if req != req_id and blocks), None)
        if other is not None and other[0] not in self.req_blocks[req_id]:
            other[0].ref_cnt += 1
        return hit


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


def _newest(cls: type[NewestOwnsIndex]) -> AdapterFactory:
    def factory() -> Adapter:
        return ReferenceNewestAdapter(lambda c: cls(c.capacity, c.block_size, hit_cap=True))

    return factory


class ReferenceIndexedAdapter(ReferenceNewestAdapter):
    """The paged pool with every copy of a hash indexed in insertion order (duplicate_keys="indexed")."""

    name = "reference-indexed"
    capabilities = dataclasses.replace(
        ReferenceNewestAdapter.capabilities,
        semantics=Semantics(duplicate_keys="indexed", hit_prefers_held=True),
    )


def _indexed(cls: type[NewestOwnsIndex]) -> AdapterFactory:
    def factory() -> Adapter:
        return ReferenceIndexedAdapter(lambda c: cls(c.capacity, c.block_size, hit_cap=True))

    return factory


def _paged_bug(
    name: str, invariant: str, cls: type[PagedPrefixCache], max_ops: int, named_first: str = ""
) -> SeededBug:
    return SeededBug(name, invariant, _paged(cls), _doc(cls), max_ops, named_first=named_first)


# max_ops: the shrunk length measured under tests/test_seeded_bugs.py's profile, plus a little slack.
PAGED_BUGS: tuple[SeededBug, ...] = (
    _paged_bug("forget-decrement", "ref_count_matches_references", ForgetDecrement, 5),  # measured 3
    _paged_bug("double-decrement", "non_negative_ref_counts", DoubleDecrement, 4),  # measured 2
    _paged_bug("evict-referenced", "no_active_eviction", TouchKeepsQueued, 4),  # measured 2
    _paged_bug("leak-on-refusal", "atomic_failure", LeakOnRefusal, 4),  # measured 2
    _paged_bug("floor-rounding", "tail_rounding", FloorRounding, 3),  # measured 1
    _paged_bug("bystander-reference", "ref_count_matches_references", BystanderReference, 4),  # measured 2
    SeededBug(  # measured 3; the copy it claims as a hit may be a reused block (hit_keeps_key), or be needless
        "share-copies",
        "share_without_duplication",
        _paged(ShareCopies),
        _doc(ShareCopies),
        5,
        symptoms=frozenset({"hit_keeps_key", "no_needless_allocation"}),
    ),
    _paged_bug("hit-drops-key", "hit_keeps_key", HitDropsKey, 5),  # measured 3
    _paged_bug("reuse-keeps-index", "cache_index_consistency", ReuseKeepsIndex, 6),  # measured 4
    _paged_bug("lost-on-reclaim", "capacity_conservation", LostOnReclaim, 4),  # measured 2
    _paged_bug("silent-double-release", "bad_input_rejected", SilentDoubleRelease, 3),  # measured 1
    # the freed block is found by no lookup: the lost hit at the release itself (index_completeness follows)
    _paged_bug("drops-entry-on-free", "release_keeps_cache", DropsEntryOnFree, 4),
    SeededBug(
        "newest-keeps-first",
        "index_completeness",
        lambda: ReferenceNewestAdapter(lambda c: NewestKeepsFirst(c.capacity, c.block_size, hit_cap=True)),
        _doc(NewestKeepsFirst),
        8,
        ReferenceNewestAdapter,
    ),
    SeededBug(
        "newest-unkeys-owner",
        "no_active_eviction",
        lambda: ReferenceNewestAdapter(lambda c: NewestUnkeysOwner(c.capacity, c.block_size, hit_cap=True)),
        _doc(NewestUnkeysOwner),
        8,
        ReferenceNewestAdapter,
    ),
    _paged_bug("drops-computed-on-free", "release_keeps_cache", DropsComputedOnFree, 8),
    SeededBug(
        "newest-forgets-copies",
        "release_keeps_cache",  # measured; tests/test_lost_hits.py drives its lost hit on admission
        _newest(NewestForgetsCopies),
        _doc(NewestForgetsCopies),
        10,
        ReferenceNewestAdapter,
        symptoms=frozenset({"no_lost_hit"}),
    ),
    SeededBug(
        "indexed-forgets-copies",
        "release_keeps_cache",  # measured: the copy a release leaves is found by no lookup
        _indexed(IndexedForgetsCopies),
        _doc(IndexedForgetsCopies),
        10,
        _indexed(IndexedCopies),
        symptoms=frozenset({"no_lost_hit"}),
    ),
    # the lost hit itself, judged against the pool (refinement off: the safety check must see it)
    _paged_bug("short-chain-lost-hit", "no_lost_hit", ShortChain, 5),
    _paged_bug("no-eviction-on-admit", "predicted_admission", NoEvictionOnAdmit, 5),  # measured 3
    # the hit it under-reports is a lost hit, judged against the pool before the spec's prediction
    _paged_bug("short-chain", "predicted_prefix_hits", ShortChain, 5, "no_lost_hit"),  # measured 3
    _paged_bug("most-recent-evicted", "predicted_eviction", MostRecentEvicted, 5),  # measured 3
    # the cache it drops on a kept release is named first; the free capacity it loses is reported too
    _paged_bug("eager-reclaim", "predicted_free_capacity", EagerReclaim, 4, "release_keeps_cache"),  # measured 2
    SeededBug("raises-on-resume", "adapter_contract", RaisesOnResume, _doc(RaisesOnResume), 4),  # measured 3
)


# -- the lifecycle simulator (record granularity) ---------------------------------------


class RecordFloorRounding(LifecycleSim):
    """Blocks per record rounded down: a partial tail block is never paid for."""

    def blocks_for_tokens(self, n: int) -> int:
        if n <= 0:
            raise ValueError("token count must be positive")
        return max(n // self.block_size_tokens, 1)


class PlainLRU(LifecycleSim):
    """Idle records are evicted least recently used first, ignoring their hit counts."""

    def _eviction_candidates(self) -> list[Record]:
        return sorted((r for r in self.records.values() if r.ref_count == 0), key=lambda r: r.last_used)


class EvictsActive(LifecycleSim):
    """The eviction candidates are not filtered by ref count: a record in use can be evicted."""

    def _eviction_candidates(self) -> list[Record]:
        return sorted(self.records.values(), key=lambda r: (r.hits, r.last_used, -r.block_count))


class EvictsBeforeChecking(LifecycleSim):
    """Evicts first and checks afterwards: a refused request has already lost the cache."""

    def _make_room(self, needed: int) -> None:
        for rec in self._eviction_candidates():
            if self.free_blocks >= needed:
                break
            self._drop(rec, "evict")
        if self.free_blocks < needed:
            raise CapacityError("insufficient blocks")


def _lifecycle(cls: type[LifecycleSim]) -> AdapterFactory:
    def factory() -> Adapter:
        return LifecycleSimAdapter(sim_factory=lambda c: cls(c.capacity, c.block_size))

    return factory


def _lifecycle_bug(
    name: str, invariant: str, cls: type[LifecycleSim], max_ops: int, named_first: str = ""
) -> SeededBug:
    return SeededBug(name, invariant, _lifecycle(cls), _doc(cls), max_ops, LifecycleSimAdapter, named_first)


LIFECYCLE_BUGS: tuple[SeededBug, ...] = (
    _lifecycle_bug("lifecycle-floor-rounding", "tail_rounding", RecordFloorRounding, 3),  # measured 1
    _lifecycle_bug("lifecycle-plain-lru", "predicted_eviction", PlainLRU, 9),  # measured 7
    _lifecycle_bug("lifecycle-evicts-active", "no_active_eviction", EvictsActive, 4),  # measured 2
    _lifecycle_bug("lifecycle-evicts-before-checking", "atomic_failure", EvictsBeforeChecking, 6),  # measured 4
)


# -- the scheduler simulator (entry granularity) ------------------------------------------


class StaleBlind(SchedulerSim):
    """Trusts any heap item whose entry still exists, however old: a stale heap entry is evicted."""

    def _is_stale(self, item: QueueItem, entry: Entry | None) -> bool:
        return entry is None


class EvictsLargest(SchedulerSim):
    """Evicts the largest entry to make room fastest, ignoring the retention score."""

    def _pop_victim(self) -> Entry:
        return max(self.entries.values(), key=lambda e: (e.size_bytes, -e.last_used))


class ForgetsReuse(SchedulerSim):
    """The retention score leaves out the reuse count: a hot entry scores like a one-off."""

    def score(self, hits: int, size: int, last_used: int) -> float:
        return super().score(1, size, last_used)


class FreesIncomingSize(SchedulerSim):
    """Eviction subtracts the incoming entry's bytes from current_bytes instead of the victim's."""

    def _evict_until_fit(self, needed: int) -> None:
        while self.current_bytes + needed > self.capacity_bytes:
            victim = self._pop_victim()
            del self.entries[victim.prefix]
            self.current_bytes -= needed
            self.evictions.append(victim.prefix)
            self.log.append(f"evict {victim.prefix} bytes={victim.size_bytes}")


def _scheduler(cls: type[SchedulerSim]) -> AdapterFactory:
    def factory() -> Adapter:
        return SchedulerSimAdapter(sim_factory=lambda c: cls(c.capacity))

    return factory


def _scheduler_bug(name: str, invariant: str, cls: type[SchedulerSim], max_ops: int) -> SeededBug:
    return SeededBug(name, invariant, _scheduler(cls), _doc(cls), max_ops, SchedulerSimAdapter)


SCHEDULER_BUGS: tuple[SeededBug, ...] = (
    _scheduler_bug("scheduler-stale-blind", "predicted_eviction", StaleBlind, 11),  # measured 9
    _scheduler_bug("scheduler-evicts-largest", "predicted_eviction", EvictsLargest, 12),  # measured 10
    _scheduler_bug("scheduler-forgets-reuse", "predicted_eviction", ForgetsReuse, 12),  # measured 10
    _scheduler_bug("scheduler-frees-incoming-size", "capacity_conservation", FreesIncomingSize, 6),  # measured 4
)


# -- eviction policies of the paged prefix cache ------------------------------------------
# A policy object only orders the candidates the pool hands it, so a policy cannot evict a
# block in use or refuse by itself: those two bugs are pools that hand it the wrong set.


class RanksReferenced(PagedPrefixCache):
    """The candidates handed to the policy are every cached block, referenced ones included."""

    def _take_free_blocks(self, n: int) -> list[Block]:
        taken = []
        for _ in range(n):
            uncached = [b for b in self.free_queue.values() if b.block_hash is None]
            if uncached:
                block = uncached[0]
            else:
                ranked = self.policy.order([self.block_stats(b) for b in self.blocks if b.block_hash is not None])
                block = self.blocks[ranked[0].block_id]
            self.free_queue.pop(block.block_id, None)
            if block.block_hash is not None:
                self.evictions.append(("evict", block.block_id, block.block_hash))
                self._uncache(block)
            block.ref_cnt = 1
            block.share_degree = 1
            block.last_used = self.clock
            taken.append(block)
        return taken


class RefusesToProtect(PagedPrefixCache):
    """Protects a family by refusing: protected cached-free blocks are not counted as available."""

    def num_free_blocks(self) -> int:
        policy = self.policy
        assert isinstance(policy, FamilyProtectPolicy)
        return sum(
            1 for b in self.free_queue.values() if b.block_hash is None or not policy.protected(self.block_stats(b))
        )


class ClaimsSharedAwareRanksByLRU(SharedAwarePolicy):
    """Declared shared_aware, but ranks the candidates in free queue order."""

    def order(self, candidates: Sequence[BlockStats]) -> list[BlockStats]:
        return sorted(candidates, key=lambda s: s.free_seq)


def _policy_paged(
    cls: type[PagedPrefixCache], adapter: type[ReferencePagedAdapter], policy: type[SharedAwarePolicy] | None = None
) -> AdapterFactory:
    """``adapter`` driving a ``cls`` pool that runs the adapter's declared policy (or ``policy``, if given)."""
    semantics = adapter.capabilities.semantics

    def factory() -> Adapter:
        return adapter(
            lambda c: cls(
                c.capacity,
                c.block_size,
                hit_cap=semantics.hit_cap,
                policy=policy() if policy is not None else policy_for(semantics, c),
                admission_anchor_blocks=semantics.admission_anchor_blocks,
            )
        )

    return factory


def _policy_bug(
    name: str,
    invariant: str,
    factory: AdapterFactory,
    cls: type,
    max_ops: int,
    correct: AdapterFactory,
    named_first: str = "",
) -> SeededBug:
    return SeededBug(name, invariant, factory, _doc(cls), max_ops, correct, named_first)


POLICY_BUGS: tuple[SeededBug, ...] = (
    _policy_bug(
        "policy-evicts-referenced",
        "candidates_unreferenced",
        _policy_paged(RanksReferenced, ReferenceSharedAwareAdapter),
        RanksReferenced,
        7,  # measured 5
        ReferenceSharedAwareAdapter,
        "no_active_eviction",  # the evicted block is another request's, which no_active_eviction names first
    ),
    _policy_bug(
        "policy-refuses-to-protect",
        "no_spurious_refusal",
        _policy_paged(RefusesToProtect, ReferenceFamilyProtectAdapter),
        RefusesToProtect,
        7,  # measured 5
        ReferenceFamilyProtectAdapter,
    ),
    _policy_bug(
        "lru-most-recent-first",
        "policy_conformance",
        _paged(MostRecentEvicted),
        MostRecentEvicted,
        5,  # measured 3
        ReferencePagedAdapter,
    ),
    _policy_bug(
        "shared-aware-ranks-by-lru",
        "policy_conformance",
        _policy_paged(PagedPrefixCache, ReferenceSharedAwareAdapter, ClaimsSharedAwareRanksByLRU),
        ClaimsSharedAwareRanksByLRU,
        7,  # measured 5
        ReferenceSharedAwareAdapter,
    ),
)


# A hang is cut off, never shrunk: its case is at most one example long (20 steps in the test's profile).
# Measured 1, because run_check saves only the op that hung (see tests/test_seeded_bugs.py).
HANG = SeededBug("hangs-on-reset", "adapter_contract", HangsOnReset, _doc(HangsOnReset), 20)
"""Not in SEEDED_BUGS: it needs a short step timeout, see tests/test_seeded_bugs.py."""

SEEDED_BUGS: tuple[SeededBug, ...] = PAGED_BUGS + LIFECYCLE_BUGS + SCHEDULER_BUGS + POLICY_BUGS

LONG_SEARCH_BUGS: tuple[SeededBug, ...] = (
    SeededBug(
        "prefers-idle-copy",
        "no_needless_allocation",
        _newest(PrefersIdleCopy),
        _doc(PrefersIdleCopy),
        6,  # measured 4 (Hypothesis) and 5 (swarm), refinement off
        ReferenceNewestAdapter,
        symptoms=frozenset({"no_spurious_refusal"}),  # the block it wastes refuses the next admission
    ),
)
"""Bugs that need two copies of one block, one of them held (two requests appending the same tokens): beyond
the catalogue's 20-step examples, found by both engines under the ci profile (tests/test_lost_hits.py)."""


def by_name(name: str) -> SeededBug:
    """The seeded bug called ``name``."""
    return next(bug for bug in (*SEEDED_BUGS, HANG) if bug.name == name)


def short_chain() -> Adapter:
    """The short-chain bug (every hit under-reported: a lost hit), loadable by path for trace recording."""
    return by_name("short-chain").factory()


def forget_decrement() -> Adapter:
    """The forget-decrement bug, loadable by path (``--adapter seeded_bugs:forget_decrement``) for CLI tests."""
    return by_name("forget-decrement").factory()
