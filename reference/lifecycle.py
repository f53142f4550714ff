"""A shared-prefix record pool: the lifecycle simulator.

Each cached prefix is one record that owns whole blocks. A new request either
shares an existing record (one more reference, no new blocks) or allocates a
fresh one; decode tokens grow the record's tail; a release drops a reference
and, at zero, either keeps the record for reuse or reclaims it at once. When a
request needs blocks that are not free, unreferenced records are evicted,
least reused and least recently used first.

This module is an implementation under test: it imports nothing of the kit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

EventKind = Literal["evict", "reclaim"]


class CapacityError(RuntimeError):
    """Not enough free or evictable blocks for the request; the pool was left untouched."""


@dataclass
class Record:
    """One shared prefix and the blocks it owns.

    ``used_tokens`` is how many tokens the record covers; ``block_count`` is the
    whole blocks they occupy (a partial tail still takes a block).
    """

    prefix: str
    used_tokens: int
    block_count: int
    ref_count: int = 1
    hits: int = 1
    last_used: int = 0

    @property
    def state(self) -> str:
        return "active" if self.ref_count > 0 else "reusable"


class LifecycleSim:
    """Block ledger of shared prefix records.

    Invariant kept by every public method: ``allocated_blocks`` (the sum of the
    records' block counts) never exceeds ``total_blocks``; no ref count is
    negative; only records with ref_count == 0 ever leave the pool; and a call
    that raises leaves every record exactly as it was.

    The same invariant as CrossHair contracts (``kvspec crosshair``):

    inv: 0 <= self.allocated_blocks <= self.total_blocks
    inv: all(rec.ref_count >= 0 for rec in self.records.values())
    inv: all(rec.block_count == -(-rec.used_tokens // self.block_size_tokens) for rec in self.records.values())
    inv: all(key == rec.prefix for key, rec in self.records.items())
    """

    def __init__(self, total_blocks: int = 16, block_size_tokens: int = 4) -> None:
        """An empty pool of ``total_blocks`` blocks of ``block_size_tokens`` tokens.

        The bounds below only keep CrossHair's symbolic pools small; any size works.

        pre: total_blocks <= 8
        pre: block_size_tokens <= 4
        raises: ValueError
        """
        if total_blocks <= 0 or block_size_tokens <= 0:
            raise ValueError("total_blocks and block_size_tokens must be positive")
        self.total_blocks = total_blocks
        self.block_size_tokens = block_size_tokens
        self.time = 0
        self.records: dict[str, Record] = {}
        self.log: list[str] = []
        # Structured twin of the log's evict/reclaim lines, drained by adapters.
        self.evictions: list[tuple[EventKind, str]] = []

    # -- ledger ---------------------------------------------------------------
    @property
    def allocated_blocks(self) -> int:
        """Blocks held by records, referenced or kept for reuse."""
        return sum(rec.block_count for rec in self.records.values())

    @property
    def free_blocks(self) -> int:
        """Blocks that no record holds."""
        return self.total_blocks - self.allocated_blocks

    def blocks_for_tokens(self, n: int) -> int:
        """Whole blocks needed for ``n`` tokens (ceiling division); ``n`` must be positive.

        raises: ValueError
        post: (__return__ - 1) * self.block_size_tokens < n <= __return__ * self.block_size_tokens
        """
        if n <= 0:
            raise ValueError("token count must be positive")
        return -(-n // self.block_size_tokens)

    # -- eviction -------------------------------------------------------------
    def _eviction_candidates(self) -> list[Record]:
        """Unreferenced records in the order they are given up: fewest hits, then
        least recently used, then the larger record first."""
        idle = [rec for rec in self.records.values() if rec.ref_count == 0]
        idle.sort(key=lambda rec: (rec.hits, rec.last_used, -rec.block_count))
        return idle

    def _drop(self, rec: Record, kind: EventKind) -> None:
        del self.records[rec.prefix]
        self.evictions.append((kind, rec.prefix))
        self.log.append(f"{kind} {rec.prefix} blocks={rec.block_count}")

    def _make_room(self, needed: int) -> None:
        """Free ``needed`` blocks by evicting idle records; all or nothing.

        The whole shortfall is checked against the evictable blocks first, so a
        request that cannot fit raises CapacityError before anything is evicted.
        """
        if self.free_blocks >= needed:
            return
        victims = self._eviction_candidates()
        if self.free_blocks + sum(rec.block_count for rec in victims) < needed:
            raise CapacityError(
                f"need {needed} blocks, {self.free_blocks} free and {sum(rec.block_count for rec in victims)} evictable"
            )
        for rec in victims:
            if self.free_blocks >= needed:
                break
            self._drop(rec, "evict")

    # -- lifecycle ------------------------------------------------------------
    @staticmethod
    def _check_prefix(prefix: object) -> None:
        if not isinstance(prefix, str) or not prefix:
            raise ValueError("prefix must be a non-empty string")

    def _active(self, prefix: str, what: str) -> Record:
        self._check_prefix(prefix)
        rec = self.records.get(prefix)
        if rec is None or rec.ref_count <= 0:
            raise ValueError(f"{what} needs a referenced record, {prefix!r} has none")
        return rec

    def acquire(self, prefix: str, prompt_tokens: int) -> Record:
        """Reference the record of ``prefix``, allocating it if it is not cached.

        A cached record is shared even when nothing references it (it was kept
        for reuse): it gains a reference and a hit but no blocks.

        raises: ValueError, CapacityError
        post: self.records[prefix] is __return__ and __return__.ref_count >= 1
        post: prefix not in __old__.self.records or self.allocated_blocks == __old__.self.allocated_blocks
        """
        self._check_prefix(prefix)
        needed = self.blocks_for_tokens(prompt_tokens)
        if needed > self.total_blocks:
            raise ValueError(f"a prompt of {prompt_tokens} tokens is larger than the whole pool")
        self.time += 1
        rec = self.records.get(prefix)
        if rec is not None:
            rec.ref_count += 1
            rec.hits += 1
            rec.last_used = self.time
            self.log.append(f"share {prefix} refs={rec.ref_count}")
            return rec
        self._make_room(needed)
        rec = Record(prefix, prompt_tokens, needed, last_used=self.time)
        self.records[prefix] = rec
        self.log.append(f"allocate {prefix} blocks={needed}")
        return rec

    def append(self, prefix: str, new_tokens: int) -> int:
        """Grow a referenced record by ``new_tokens``; return the blocks it gained.

        Tokens that fit in the tail block's slack cost no new block.

        raises: ValueError, CapacityError
        post: __return__ == self.allocated_blocks - __old__.self.allocated_blocks
        post: __return__ >= 0
        """
        rec = self._active(prefix, "append")
        if new_tokens <= 0:
            raise ValueError("new_tokens must be positive")
        target = self.blocks_for_tokens(rec.used_tokens + new_tokens)
        if target > self.total_blocks:
            raise ValueError("the record would be larger than the whole pool")
        self.time += 1
        added = target - rec.block_count
        if added > 0:
            self._make_room(added)
        rec.used_tokens += new_tokens
        rec.block_count = target
        rec.last_used = self.time
        self.log.append(f"append {prefix} tokens={new_tokens} blocks+={added}")
        return added

    def release(self, prefix: str, *, keep_reusable: bool = True) -> int:
        """Drop one reference to ``prefix``; return how many remain.

        At zero references the record stays cached for reuse, or, with
        ``keep_reusable=False``, is reclaimed and its blocks freed at once.

        raises: ValueError
        post: __return__ == __old__.self.records[prefix].ref_count - 1
        post: __return__ > 0 or keep_reusable or prefix not in self.records
        """
        rec = self._active(prefix, "release")
        self.time += 1
        rec.ref_count -= 1
        if rec.ref_count == 0 and not keep_reusable:
            self._drop(rec, "reclaim")
        else:
            rec.last_used = self.time
            self.log.append(f"release {prefix} refs={rec.ref_count} ({rec.state})")
        return rec.ref_count

    def snapshot(self) -> list[dict[str, int | str]]:
        """Every record's ledger fields, ordered by prefix.

        post: len(__return__) == len(self.records)
        """
        return [
            {
                "prefix": rec.prefix,
                "state": rec.state,
                "used_tokens": rec.used_tokens,
                "block_count": rec.block_count,
                "ref_count": rec.ref_count,
                "hits": rec.hits,
                "last_used": rec.last_used,
            }
            for _, rec in sorted(self.records.items())
        ]
