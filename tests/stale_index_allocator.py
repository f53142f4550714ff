"""A small paged allocator in the shape of nano-vllm's first API generation, which keeps stale index entries.

It offers the calls the nano-vllm adapter drives (``BlockManager.can_allocate``/``allocate``/``deallocate``/
``may_append``, ``blocks``, ``hash_to_block_id``, ``free_block_ids``; ``Sequence``), so that
``NanoVllmAdapter(engine=ENGINE)`` drives it with no nano-vllm installed. Its one flaw is upstream nano-vllm's
up to 8d63a98 (docs/nanovllm-matrix.md, finding 3): a block taken from the free list for reuse keeps its old
``hash_to_block_id`` entry, and a lookup guards an entry only by the block's own tokens, so a reused block that
holds the same tokens under another prefix is hit for the old prefix. Everything else is correct: its
``can_allocate`` counts what ``allocate`` takes from the free list, hits on used blocks taking none.

Two adapters over it (tests/test_adapter_shows_state.py): ``ShowsStaleEntries`` is the nano-vllm adapter as
it is (the index as the allocator holds it); ``HidesStaleEntries`` filters the index to entries whose block
carries the entry's key, as the nano-vllm adapter once did ("a lookup cannot hit them").
"""

from __future__ import annotations

import dataclasses
from collections import deque
from types import SimpleNamespace

from kvspec.adapters.nano_vllm import NanoVllmAdapter
from kvspec.spec import Observation


class Block:
    def __init__(self, block_id: int) -> None:
        self.block_id, self.ref_count, self.hash, self.token_ids = block_id, 0, -1, []


class Sequence:
    """A request's tokens and block table (``block_size``: a class attribute, as nano-vllm's)."""

    block_size = 256

    def __init__(self, token_ids: list[int], sampling_params: object = None) -> None:
        self.token_ids = list(token_ids)
        self.num_cached_tokens = 0
        self.block_table: list[int] = []

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_blocks(self) -> int:
        return (len(self.token_ids) + self.block_size - 1) // self.block_size

    def block(self, i: int) -> list[int]:
        return self.token_ids[i * self.block_size : (i + 1) * self.block_size]

    def append_token(self, token: int) -> None:
        self.token_ids.append(token)


class BlockManager:
    """Blocks, a free list (LRU: freed blocks join the tail, the head is taken) and one index entry per hash."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.hash_to_block_id: dict[int, int] = {}
        self.free_block_ids: deque[int] = deque(range(num_blocks))
        self.used_block_ids: set[int] = set()

    @staticmethod
    def compute_hash(token_ids: list[int], prefix: int = -1) -> int:
        return hash((prefix, tuple(token_ids))) & 0x7FFF_FFFF_FFFF_FFFF  # never -1, the "no hash" mark

    def _take(self, block_id: int) -> Block:
        """A block out of the free list: its hash is reset, its index entry is left where it is (the flaw)."""
        block = self.blocks[block_id]
        block.ref_count, block.hash, block.token_ids = 1, -1, []
        self.free_block_ids.remove(block_id)
        self.used_block_ids.add(block_id)
        return block

    def _walk(self, seq: Sequence) -> list[tuple[int, list[int], int]]:
        """(hash or -1, tokens, the block a lookup hits or -1) of each block of ``seq``, as allocate walks them."""
        out, h, missed = [], -1, False
        for i in range(seq.num_blocks):
            tokens = seq.block(i)
            h = self.compute_hash(tokens, h) if len(tokens) == self.block_size else -1
            hit = self.hash_to_block_id.get(h, -1)
            missed = missed or hit == -1 or self.blocks[hit].token_ids != tokens  # the lookup's only guard
            out.append((h, tokens, -1 if missed else hit))
        return out

    def can_allocate(self, seq: Sequence) -> bool:
        return len(self.free_block_ids) >= sum(1 for _, _, hit in self._walk(seq) if hit not in self.used_block_ids)

    def allocate(self, seq: Sequence) -> None:
        assert not seq.block_table
        for h, tokens, hit in self._walk(seq):
            if hit != -1 and hit in self.used_block_ids:
                block = self.blocks[hit]
                block.ref_count += 1
            else:
                block = self._take(self.free_block_ids[0] if hit == -1 else hit)
            if hit != -1:
                seq.num_cached_tokens += self.block_size
            if h != -1:
                block.hash, block.token_ids = h, tokens
                self.hash_to_block_id[h] = block.block_id
            seq.block_table.append(block.block_id)

    def deallocate(self, seq: Sequence) -> None:
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:  # it keeps its hash and its entry: cached, found by a later lookup
                self.used_block_ids.remove(block_id)
                self.free_block_ids.append(block_id)
        seq.num_cached_tokens = 0
        seq.block_table.clear()

    def may_append(self, seq: Sequence) -> None:
        bs, table = self.block_size, seq.block_table
        if len(seq) % bs == 1:
            table.append(self._take(self.free_block_ids[0]).block_id)
        elif len(seq) % bs == 0:
            last = self.blocks[table[-1]]
            prefix = self.blocks[table[-2]].hash if len(table) > 1 else -1
            last.hash, last.token_ids = self.compute_hash(seq.block(len(table) - 1), prefix), seq.block(len(table) - 1)
            self.hash_to_block_id[last.hash] = last.block_id


ENGINE = (
    SimpleNamespace(BlockManager=BlockManager, __file__=__file__),
    SimpleNamespace(Sequence=Sequence, SamplingParams=lambda: None),
)
"""The (block_manager, sequence) modules the nano-vllm adapter drives (NanoVllmAdapter's ``engine``)."""


class ShowsStaleEntries(NanoVllmAdapter):
    """The nano-vllm adapter over this allocator: ``hash_to_block_id`` as it is, stale entries too."""

    name = "shows-stale-entries"

    def __init__(self) -> None:
        super().__init__(engine=ENGINE)


class HidesStaleEntries(ShowsStaleEntries):
    """The same, with the index filtered to what a lookup "can hit" (the entry's block carries its key): the
    projection the adapter contract forbids."""

    name = "hides-stale-entries"

    def observe(self) -> Observation:
        obs = super().observe()
        shown = {h: oids for h, oids in (obs.index or {}).items() if self.bm.blocks[oids[0]].hash == h}
        return dataclasses.replace(obs, index=shown)
