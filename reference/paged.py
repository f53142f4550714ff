"""A paged prefix cache in the style of vLLM's block pool.

Physical blocks carry a ref count and, once full, a chained hash of (parent
hash, tokens). Unreferenced blocks wait in an LRU free queue; a cached one keeps
its hash there and is evicted lazily, when it is popped for reuse. A new request
reuses the longest chain of cached full blocks of its prompt.

Which cached block is evicted is the eviction policy's choice (reference/eviction_policies.py):
``lru`` pops the free queue's head, as vLLM before 0.24 does; with ``uncached_first``
(the default of every other policy, and vLLM from 0.24 on, which frees uncached blocks to
the queue's head) the pool takes uncached free blocks first and then evicts the candidate
the policy ranks first. The pool keeps a
side table per block (hit_count, share_degree, prefix depth, last use, free queue
sequence; branch factor from its cached children) for the policies and for logs.
"""

from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any

from .eviction_policies import BlockStats, EvictionPolicy, LRUPolicy


class NoFreeBlocks(RuntimeError):
    """Not enough free or evictable blocks; nothing was changed."""


class Block:
    """One physical KV block. ``block_hash`` is set only while it is full and cached."""

    __slots__ = (
        "block_hash",
        "block_id",
        "free_seq",
        "hit_count",
        "last_used",
        "parent_hash",
        "prefix_depth",
        "ref_cnt",
        "share_degree",
    )

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: bytes | None = None
        self.hit_count = 0
        # Side table: set when the block is taken, hit, cached or freed.
        self.share_degree = 0
        self.last_used = 0
        self.free_seq = 0
        self.parent_hash: bytes | None = None
        self.prefix_depth = 0

    def __repr__(self) -> str:
        return f"Block({self.block_id}, ref_cnt={self.ref_cnt}, cached={self.block_hash is not None})"


def hash_block(parent: bytes | None, tokens: Sequence[int]) -> bytes:
    """Chained block hash: identical only for identical token prefixes."""
    h = hashlib.sha256(parent or b"root")
    h.update(b"|" + ",".join(map(str, tokens)).encode())
    return h.digest()[:16]


class PagedPrefixCache:
    """Block pool + prefix cache index + per-request block tables.

    Invariant kept by every public method: each block is either referenced
    (ref_cnt > 0, in some block table ref_cnt times) or in the free queue, never
    both; a block is in ``cached`` under its hash exactly while its hash is set.

    The same invariant as CrossHair contracts (``kvspec crosshair``):

    inv: len(self.blocks) == self.num_blocks
    inv: all((b.ref_cnt == 0) == (b.block_id in self.free_queue) for b in self.blocks)
    inv: all(b.ref_cnt == sum(t.count(b) for t in self.req_blocks.values()) for b in self.blocks)
    inv: all(self.cached.get(b.block_hash) is b for b in self.blocks if b.block_hash is not None)
    inv: all(b.block_hash == h for h, b in self.cached.items())
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        hit_cap: bool = True,
        policy: EvictionPolicy | None = None,
        admission_anchor_blocks: int | None = None,
        uncached_first: bool | None = None,
    ) -> None:
        """A pool of ``num_blocks`` empty blocks of ``block_size`` tokens.

        policy: the eviction policy (None: lru, the free queue's head).
        admission_anchor_blocks: a request with no prefix hit caches at most this
        many of its full blocks, its first ones; the rest stay uncached, to be
        reused before any cached block is evicted (None: no limit).
        uncached_first: take free blocks that hold no cached hash before evicting any
        (None: for every policy but lru).

        The bounds below only keep CrossHair's symbolic pools small; any size works.

        pre: num_blocks <= 4
        pre: block_size <= 3
        raises: ValueError
        """
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.hit_cap = hit_cap
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, Block] = OrderedDict((b.block_id, b) for b in self.blocks)
        self.cached: dict[bytes, Block] = {}
        self.req_blocks: dict[str, list[Block]] = {}
        self.req_tokens: dict[str, list[int]] = {}
        self.evictions: list[tuple[str, int, bytes]] = []
        self.policy: EvictionPolicy = policy if policy is not None else LRUPolicy()
        self.admission_anchor_blocks = admission_anchor_blocks
        self.uncached_first = self.policy.name != "lru" if uncached_first is None else uncached_first
        if not self.uncached_first and self.policy.name != "lru":
            raise ValueError("only lru may evict a cached block while uncached ones are free")
        self.clock = 0  # advances on every allocate and append
        self.free_seqs = 0  # blocks that ever joined the free queue
        self.req_cache_limit: dict[str, int | None] = {}
        self.children: Counter[bytes] = Counter()  # parent hash -> cached blocks chained on it
        self.lifecycle_log: list[dict[str, Any]] | None = None  # set to a list to record policy events

    # -- queries ------------------------------------------------------------------
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now: empty ones and cached unreferenced ones.

        post: 0 <= __return__ <= self.num_blocks
        """
        return len(self.free_queue)

    def block_hashes(self, tokens: Sequence[int]) -> list[bytes]:
        """Hashes of the full blocks of ``tokens``, each chained on the previous one.

        pre: len(tokens) <= 8
        post: len(__return__) == len(tokens) // self.block_size
        """
        hashes: list[bytes] = []
        parent: bytes | None = None
        for start in range(0, len(tokens) - self.block_size + 1, self.block_size):
            parent = hash_block(parent, tokens[start : start + self.block_size])
            hashes.append(parent)
        return hashes

    def entries(self, block_hash: bytes) -> list[Block]:
        """The blocks a lookup of ``block_hash`` can find, the one it takes first (none when it is not cached)."""
        block = self.cached.get(block_hash)
        return [] if block is None else [block]

    def find_cached_prefix(self, tokens: Sequence[int]) -> list[Block]:
        """The longest chain of cached blocks that starts the prompt, leaving one token to compute.

        pre: len(tokens) <= 8
        post: len(__return__) <= len(tokens) // self.block_size
        post: not self.hit_cap or len(__return__) * self.block_size < max(len(tokens), 1)
        """
        found: list[Block] = []
        for block_hash in self.block_hashes(tokens):
            block = self.cached.get(block_hash)
            if block is None:
                break
            found.append(block)
        if self.hit_cap:
            found = found[: (len(tokens) - 1) // self.block_size]
        return found

    # -- block pool -----------------------------------------------------------------
    def block_stats(self, block: Block) -> BlockStats:
        """The side table's row for ``block``, as a policy sees it now."""
        return BlockStats(
            block_id=block.block_id,
            block_hash=block.block_hash,
            hit_count=block.hit_count,
            share_degree=block.share_degree,
            branch_factor=self.children[block.block_hash] if block.block_hash is not None else 0,
            prefix_depth=block.prefix_depth,
            last_used=block.last_used,
            free_seq=block.free_seq,
            clock=self.clock,
        )

    def _next_victim(self) -> Block:
        """The free block to take next: plain lru pops the queue's head, cached or not; otherwise
        an uncached block if any, else the candidate the policy ranks first."""
        if not self.uncached_first:
            return next(iter(self.free_queue.values()))
        for block in self.free_queue.values():
            if block.block_hash is None:
                return block
        ranked = self.policy.order([self.block_stats(b) for b in self.free_queue.values()])
        if self.lifecycle_log is not None:
            self.lifecycle_log.append(
                {
                    "event": "eviction_candidates_ranked",
                    "policy": self.policy.name,
                    "candidates": [[s.block_id, self.policy.retain_score(s)] for s in ranked],
                }
            )
        return self.blocks[ranked[0].block_id]

    def _uncache(self, block: Block) -> None:
        """Drop ``block``'s hash from the prefix cache and its side table with it."""
        assert block.block_hash is not None
        del self.cached[block.block_hash]
        if block.parent_hash is not None:
            self.children[block.parent_hash] -= 1
            if not self.children[block.parent_hash]:
                del self.children[block.parent_hash]
        block.block_hash = None
        block.parent_hash = None
        block.prefix_depth = 0
        block.hit_count = 0

    def _take_free_blocks(self, n: int) -> list[Block]:
        """Take ``n`` free blocks in the policy's order; a cached one loses its hash (eviction)."""
        taken = []
        for _ in range(n):
            block = self._next_victim()
            del self.free_queue[block.block_id]
            if block.block_hash is not None:
                if self.lifecycle_log is not None:
                    stats = self.block_stats(block)
                    row = {"event": "block_evicted", "block_id": block.block_id, "policy": self.policy.name}
                    self.lifecycle_log.append({**row, "retain_score": self.policy.retain_score(stats)})
                self.evictions.append(("evict", block.block_id, block.block_hash))
                self._uncache(block)
            block.ref_cnt = 1
            block.share_degree = 1
            block.last_used = self.clock
            taken.append(block)
        return taken

    def _cache_full_blocks(self, req_id: str, start: int) -> None:
        """Hash the request's full blocks from ``start`` on; an already cached hash stays with its block."""
        blocks, tokens = self.req_blocks[req_id], self.req_tokens[req_id]
        hashes = self.block_hashes(tokens)
        limit = self.req_cache_limit.get(req_id)
        for i in range(start, len(hashes) if limit is None else min(len(hashes), limit)):
            if hashes[i] not in self.cached:
                self._cache_block(blocks[i], hashes, i)

    def _cache_block(self, block: Block, hashes: Sequence[bytes], i: int) -> None:
        """``block``, the i-th of a request whose full blocks hash to ``hashes``, takes its hash and the index entry."""
        block.block_hash = hashes[i]
        block.parent_hash = hashes[i - 1] if i else None
        block.prefix_depth = i + 1
        self.cached[hashes[i]] = block
        if i:
            self.children[hashes[i - 1]] += 1

    def _blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- request lifecycle --------------------------------------------------------------
    def allocate(self, req_id: str, tokens: Sequence[int]) -> int:
        """Admit a request: reuse its cached prefix, allocate the rest. Returns hit tokens.

        Raises NoFreeBlocks (changing nothing) when the free queue cannot cover the
        new blocks plus the cached-free prefix blocks that leave it.

        pre: len(tokens) <= 8
        raises: ValueError, NoFreeBlocks
        post: len(self.req_blocks[req_id]) == -(-len(tokens) // self.block_size)
        post: __return__ % self.block_size == 0 and 0 <= __return__ < len(tokens) + int(not self.hit_cap)
        post: self.num_free_blocks() <= __old__.self.num_free_blocks()
        """
        if not req_id or req_id in self.req_blocks:
            raise ValueError(f"request {req_id!r} is empty or already allocated")
        if not tokens:
            raise ValueError("empty prompt")
        total = self._blocks_needed(len(tokens))
        if total > self.num_blocks:
            raise ValueError("prompt is larger than the whole pool")
        hit = self.find_cached_prefix(tokens)
        leaving_queue = sum(1 for b in hit if b.ref_cnt == 0)
        if total - len(hit) + leaving_queue > self.num_free_blocks():
            raise NoFreeBlocks(f"{req_id}: need {total - len(hit)} new blocks")
        self.clock += 1
        for block in hit:
            if block.ref_cnt == 0:
                del self.free_queue[block.block_id]
            block.ref_cnt += 1
            block.hit_count += 1
            block.share_degree = max(block.share_degree, block.ref_cnt)
            block.last_used = self.clock
        self.req_blocks[req_id] = hit + self._take_free_blocks(total - len(hit))
        self.req_tokens[req_id] = list(tokens)
        anchor = self.admission_anchor_blocks
        self.req_cache_limit[req_id] = anchor if anchor is not None and not hit else None
        held_back = len(tokens) // self.block_size - anchor if anchor is not None and not hit else 0
        if held_back > 0 and self.lifecycle_log is not None:
            self.lifecycle_log.append({"event": "cache_admission_limited", "req": req_id, "held_back": held_back})
        self._cache_full_blocks(req_id, len(hit))
        return len(hit) * self.block_size

    def append(self, req_id: str, tokens: Sequence[int]) -> int:
        """Append decoded tokens; allocate only for the blocks past the tail. Returns new blocks.

        pre: len(tokens) <= 8
        raises: ValueError, NoFreeBlocks
        post: len(self.req_blocks[req_id]) == -(-len(self.req_tokens[req_id]) // self.block_size)
        post: __return__ == len(self.req_blocks[req_id]) - len(__old__.self.req_blocks[req_id])
        """
        if req_id not in self.req_blocks:
            raise ValueError(f"unknown request {req_id!r}")
        if not tokens:
            raise ValueError("append needs at least one token")
        blocks, current = self.req_blocks[req_id], self.req_tokens[req_id]
        total = self._blocks_needed(len(current) + len(tokens))
        if total > self.num_blocks:
            raise ValueError("request would be larger than the whole pool")
        new = total - len(blocks)
        if new > self.num_free_blocks():
            raise NoFreeBlocks(f"{req_id}: need {new} new blocks")
        full_before = len(current) // self.block_size
        self.clock += 1
        blocks.extend(self._take_free_blocks(new))
        current.extend(tokens)
        blocks[-1].last_used = self.clock
        self._cache_full_blocks(req_id, full_before)
        return new

    def free(self, req_id: str, *, keep_cached: bool = True) -> None:
        """Drop a request's references, tail block first, onto the free queue's tail.

        With keep_cached=False a block whose last reference goes is reclaimed: it
        leaves the prefix cache at once instead of waiting for lazy eviction. With
        it, a full block left unhashed as a duplicate takes its hash if no block
        holds that hash any more: what the request computed stays findable.

        raises: ValueError
        post: req_id not in self.req_blocks and req_id not in self.req_tokens
        post: self.num_free_blocks() >= __old__.self.num_free_blocks()
        """
        if req_id not in self.req_blocks:
            raise ValueError(f"unknown request {req_id!r}")
        blocks = self.req_blocks.pop(req_id)
        hashes = self.block_hashes(self.req_tokens.pop(req_id))
        limit = self.req_cache_limit.pop(req_id, None)
        for i in reversed(range(len(blocks))):
            block = blocks[i]
            block.ref_cnt -= 1
            if block.ref_cnt:
                continue
            kept = keep_cached and i < len(hashes) and (limit is None or i < limit)
            if kept and block.block_hash is None and hashes[i] not in self.cached:
                self._cache_block(block, hashes, i)
            if block.block_hash is not None and not keep_cached:
                self.evictions.append(("reclaim", block.block_id, block.block_hash))
                self._uncache(block)
            self.free_seqs += 1
            block.free_seq = self.free_seqs
            self.free_queue[block.block_id] = block

    def reset_prefix_cache(self) -> bool:
        """Forget every cached hash. Refused (False) while any block is referenced.

        post: __return__ == all(b.ref_cnt == 0 for b in self.blocks)
        post: not __return__ or not self.cached
        """
        if any(b.ref_cnt for b in self.blocks):
            return False
        for block in self.blocks:
            if block.block_hash is not None:
                self.evictions.append(("reclaim", block.block_id, block.block_hash))
                self._uncache(block)
        return True
