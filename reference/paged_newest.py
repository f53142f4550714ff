"""The paged prefix cache with one index entry per hash that the newest block takes (nano-vllm's choice).

A block that becomes full while another block is cached under the same hash takes the index entry; the
other keeps its hash, cached but unreachable (no lookup finds it), until it is evicted or reclaimed. When
the entry's owner leaves the cache, the hash leaves the index. Everything else is ``PagedPrefixCache``.
Kept out of paged.py: its blocks break that class's contract that every hashed block is in the index.
"""

from __future__ import annotations

from .paged import Block, PagedPrefixCache


class NewestOwnsIndex(PagedPrefixCache):
    """PagedPrefixCache where a duplicate hash moves the index entry to the newest block."""

    def _cache_full_blocks(self, req_id: str, start: int) -> None:
        """Hash the request's full blocks from ``start`` on; each takes its hash's index entry."""
        blocks, tokens = self.req_blocks[req_id], self.req_tokens[req_id]
        hashes = self.block_hashes(tokens)
        limit = self.req_cache_limit.get(req_id)
        for i in range(start, len(hashes) if limit is None else min(len(hashes), limit)):
            block = blocks[i]
            if self.cached.get(hashes[i]) is block:
                continue
            block.block_hash = hashes[i]
            block.parent_hash = hashes[i - 1] if i else None
            block.prefix_depth = i + 1
            self.cached[hashes[i]] = block
            if i:
                self.children[hashes[i - 1]] += 1

    def _uncache(self, block: Block) -> None:
        """Drop ``block``'s hash; the index entry goes with it only if the block owns it."""
        assert block.block_hash is not None
        owner = self.cached.get(block.block_hash)
        self.cached[block.block_hash] = block
        super()._uncache(block)
        if owner is not None and owner is not block and owner.block_hash is not None:
            self.cached[owner.block_hash] = owner
