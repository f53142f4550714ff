"""The paged prefix cache with one index entry per hash that the newest block takes (nano-vllm's choice).

A block that becomes full while another block is cached under the same hash takes the index entry; the
older copies keep their hash and stay behind it, newest first, so that when the entry's owner leaves the
cache the next copy takes the entry (a lookup never loses a copy the pool still holds), and a hit shares a copy
a request holds before the entry's idle one (``hit_prefers_held``). Everything else is
``PagedPrefixCache``. Kept out of paged.py: its blocks break that class's contract that every hashed block
is the index's entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .paged import Block, PagedPrefixCache


class NewestOwnsIndex(PagedPrefixCache):
    """PagedPrefixCache where a duplicate hash moves the index entry to the newest block."""

    def __init__(self, num_blocks: int, block_size: int, **kwargs: Any) -> None:
        super().__init__(num_blocks, block_size, **kwargs)
        self.copies: dict[bytes, list[Block]] = {}  # hash -> the older blocks that carry it, newest first

    def _cache_full_blocks(self, req_id: str, start: int) -> None:
        """Hash the request's full blocks from ``start`` on; each takes its hash's index entry."""
        blocks, tokens = self.req_blocks[req_id], self.req_tokens[req_id]
        hashes = self.block_hashes(tokens)
        limit = self.req_cache_limit.get(req_id)
        for i in range(start, len(hashes) if limit is None else min(len(hashes), limit)):
            block, owner = blocks[i], self.cached.get(hashes[i])
            if owner is block:
                continue
            if owner is not None:
                self.copies.setdefault(hashes[i], []).insert(0, owner)
            self._cache_block(block, hashes, i)

    def entries(self, block_hash: bytes) -> list[Block]:
        """The entry's owner, then the older copies, newest first."""
        return [*super().entries(block_hash), *self.copies.get(block_hash, ())]

    def find_cached_prefix(self, tokens: Sequence[int]) -> list[Block]:
        """The longest cached chain, as PagedPrefixCache finds it, each block a copy a request holds where one
        does (sharing it takes nothing out of the free queue), else the index's entry."""
        found = super().find_cached_prefix(tokens)
        return [
            block if block.ref_cnt else next((c for c in self.copies.get(h, ()) if c.ref_cnt), block)
            for block, h in zip(found, self.block_hashes(tokens), strict=False)
        ]

    def _uncache(self, block: Block) -> None:
        """Drop ``block``'s hash; if it owned the index entry, the newest other copy takes it."""
        assert block.block_hash is not None
        block_hash = block.block_hash
        owner = self.cached.get(block_hash)
        copies = self.copies.get(block_hash, [])
        self.cached[block_hash] = block
        super()._uncache(block)
        if owner is not None and owner is not block:
            copies.remove(block)
            self.cached[block_hash] = owner
        elif copies:
            self.cached[block_hash] = copies.pop(0)
        if not copies:
            self.copies.pop(block_hash, None)
