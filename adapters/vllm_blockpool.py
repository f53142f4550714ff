"""Adapter for vLLM v1's BlockPool alone, driven with the block operations the engine uses.

Where ``vllm`` goes through the KVCacheManager, this adapter plays the manager
itself and calls the pool directly, so that the pool's own contracts are held
to the spec, including inputs the manager rarely or never produces:

=================  ======================================================================
spec               BlockPool calls
=================  ======================================================================
admit(r, prompt)   get_cached_block for each full block's hash, up to the hit cap;
                   refused when new blocks + cached-free hits > get_num_free_blocks();
                   else touch(hits), get_new_blocks(rest), cache_full_blocks.
append(r, toks)    the Request grows; refused when the blocks past its tail exceed
                   get_num_free_blocks(); else get_new_blocks for them and
                   cache_full_blocks for the newly full ones. Contract ``unchecked``: no
                   count first, get_new_blocks raising (ValueError) when the pool is short
                   is the refusal, and must leave the pool as it was.
release(r)         free_blocks once, tail first, with r's references *and* those of a
                   sibling that shares r's cached blocks and finishes in the same step
                   (parallel sampling): touch(cached blocks), then free_blocks with each
                   cached block listed twice. A correct pool ends exactly as free(r).
                   keep=False: first drop the cache entries of blocks only r holds.
preempt(r)         as release (keep=True), and r waits with all its tokens.
resume(r)          as admit, for the waiting Request.
reset_cache()      reset_prefix_cache().
=================  ======================================================================

The BlockPool has no request-level free (the caller owns the tables), so the repeated and
never-admitted frees of the ``vllm`` adapter have no pool-level counterpart here; and no
``admit:unchecked``: an admission touches its hit blocks before get_new_blocks, so a raise there
leaves the caller's touch, which only the caller can undo (vLLM's manager counts first).

The repeated references in one free_blocks call exercise the pool's
misuse-tolerant contract: a block freed twice in one call while it holds two
references is queued once, when its count reaches zero. Pass
``sibling_frees=False`` to free one reference per block, as the manager does.
"""

from __future__ import annotations

from typing import Any

from kvspec.adapter import Op, Outcome, blocks_for
from kvspec.adapters import _vllm_shims as shims
from kvspec.adapters.vllm_inprocess import VllmProjection


class VllmBlockPoolAdapter(VllmProjection):
    """vLLM's BlockPool, with this adapter in the role of the single-type KV cache manager."""

    name = "vllm-blockpool"
    CONTRACTS = frozenset({"append:unchecked"})

    def __init__(self, *, sibling_frees: bool = True) -> None:
        self.sibling_frees = sibling_frees
        self.block_tables: dict[str, list[Any]] = {}  # request id -> the blocks it holds, in order
        super().__init__()

    def _new_pool(self, num_blocks: int) -> Any:
        self.block_tables = {}
        return self.vllm.pool(num_blocks, self.block_size)

    def _table(self, rid: str) -> list[Any]:
        return self.block_tables.get(rid, [])

    def _pool_reset(self) -> bool:
        return bool(self.pool.reset_prefix_cache())

    # -- admission ------------------------------------------------------------------------
    def _schedule(self, request: Any) -> Outcome:
        pool, bs, n = self.pool, self.block_size, request.num_tokens
        hits: list[Any] = []
        for block_hash in request.block_hashes[: (n - 1) // bs]:  # the hit cap: one token is computed
            found = pool.get_cached_block(block_hash, [shims.GROUP])
            if not found:
                break
            hits.append(found[0])
        new = blocks_for(n, bs) - len(hits)
        leaving_queue = sum(1 for b in hits if b.ref_cnt == 0)
        if new + leaving_queue > pool.get_num_free_blocks():
            return Outcome.refused("not enough free blocks")
        self.vllm.touch(pool, hits)
        table = hits + pool.get_new_blocks(new)
        self.vllm.cache_full_blocks(pool, request, table, len(hits), n // bs, bs)
        request.num_computed_tokens = n
        request.status = self.vllm.RequestStatus.RUNNING
        self.running[request.request_id] = request
        self.block_tables[request.request_id] = table
        return Outcome.ok(len(hits) * bs)

    def _append(self, req: str, op: Op) -> Outcome:
        pool, bs = self.pool, self.block_size
        request, table = self.running[req], self.block_tables[req]
        before = request.num_tokens
        request.append_output_token_ids(list(op.tokens))
        new = blocks_for(request.num_tokens, bs) - len(table)
        if op.contract != "unchecked" and new > pool.get_num_free_blocks():
            self.vllm.truncate_request(request, before, bs)
            return Outcome.refused("not enough free blocks")
        if new > 0:
            try:
                table.extend(pool.get_new_blocks(new))
            except ValueError as exc:  # the contract "unchecked": the pool's own refusal, which must change nothing
                self.vllm.truncate_request(request, before, bs)
                return Outcome.refused(f"get_new_blocks raised: {exc}")
        self.vllm.cache_full_blocks(pool, request, table, before // bs, request.num_tokens // bs, bs)
        request.num_computed_tokens = request.num_tokens
        return Outcome.ok()

    # -- release ----------------------------------------------------------------------------
    def _free(self, table: list[Any]) -> None:
        """Return one request's references, tail first, in one free_blocks call (with a sibling's, see module doc)."""
        if not self.sibling_frees:
            self.pool.free_blocks(list(reversed(table)))
            return
        shared = [b for b in table if b.block_hash is not None]
        self.vllm.touch(self.pool, shared)
        ordered: list[Any] = []
        for block in reversed(table):
            ordered.append(block)
            if block.block_hash is not None:
                ordered.append(block)
        self.pool.free_blocks(ordered)

    def _release(self, req: str, op: Op) -> Outcome:
        if req in self.waiting:
            del self.waiting[req]
            return Outcome.ok()
        del self.running[req]
        table = self.block_tables.pop(req)
        if not op.keep:
            self.vllm.drop_cached(self.pool, [b for b in table if b.ref_cnt == 1 and b.block_hash is not None])
        self._free(table)
        return Outcome.ok()

    def _preempt(self, req: str, op: Op) -> Outcome:
        request = self.running.pop(req)
        self._free(self.block_tables.pop(req))
        request.status = self.vllm.RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        self.waiting[req] = request
        return Outcome.ok()


def single_frees() -> VllmBlockPoolAdapter:
    """The block-level adapter freeing one reference per block per call, as vLLM's own manager does."""
    adapter = VllmBlockPoolAdapter(sibling_frees=False)
    adapter.name = "vllm-blockpool-single"
    return adapter
