"""tinyengine's block allocator: the kit's paged reference pool with the engine's own release path."""

from __future__ import annotations

from kvspec.reference.paged import PagedPrefixCache


class Allocator(PagedPrefixCache):
    """A paged prefix cache whose ``free`` is the engine's own code (the line a change may break)."""

    def free(self, req_id: str, *, keep_cached: bool = True) -> None:
        """Each of the request's blocks loses one reference; a block nobody holds joins the free queue's tail."""
        if req_id not in self.req_blocks:
            raise ValueError(f"unknown request {req_id!r}")
        blocks = self.req_blocks.pop(req_id)
        hashes = self.block_hashes(self.req_tokens.pop(req_id))
        limit = self.req_cache_limit.pop(req_id, None)
        for i in reversed(range(len(blocks))):
            block = blocks[i]
            block.ref_cnt -= 1
            if block.ref_cnt > 0:  # still held by another request
                continue
            kept = keep_cached and i < len(hashes) and (limit is None or i < limit)
            if kept and block.block_hash is None and hashes[i] not in self.cached:
                self._cache_block(block, hashes, i)  # the last copy of what the request computed stays cached
            if block.block_hash is not None and not keep_cached:
                self.evictions.append(("reclaim", block.block_id, block.block_hash))
                self._uncache(block)
            self.free_seqs += 1
            block.free_seq = self.free_seqs
            self.free_queue[block.block_id] = block
