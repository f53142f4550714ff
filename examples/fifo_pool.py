"""The allocator of README's worked example: a toy KV block pool (no prefix cache, a FIFO free list), and a
leaky twin whose release gives back all but the last block. Its adapter is examples/fifo_adapter.py."""

from __future__ import annotations


class FifoPool:
    """The allocator under test: a request holds ceil(tokens / block_size) blocks, taken from the free list's head."""

    def __init__(self, blocks: int, block_size: int) -> None:
        self.capacity, self.block_size, self.free = blocks, block_size, list(range(blocks))
        self.tables: dict[str, list[int]] = {}
        self.tokens: dict[str, list[int]] = {}

    def grow(self, req: str, tokens: list[int]) -> bool:
        """Give ``req`` the blocks for ``tokens`` more, all or nothing; whether it could."""
        held = [*self.tokens.get(req, []), *tokens]
        need = -(-len(held) // self.block_size) - len(self.tables.get(req, []))
        if need > len(self.free):
            return False
        self.tables.setdefault(req, []).extend(self.free.pop(0) for _ in range(need))
        self.tokens[req] = held
        return True

    def release(self, req: str) -> None:
        self.free.extend(self.tables.pop(req))
        del self.tokens[req]


class LeakyFifoPool(FifoPool):
    def release(self, req: str) -> None:  # the bug: the last block of a table never goes back
        self.free.extend(self.tables.pop(req)[:-1])
        del self.tokens[req]
