"""A byte-budgeted prefix cache with a retention score: the scheduler simulator.

Every cached prefix is an entry of some bytes. Each access refreshes the
entry's retention score (reuse + recency - size) and pushes a fresh item onto a
min-heap; older items of the same entry stay in the heap and are recognised as
stale when popped (lazy deletion). When a new entry does not fit, the lowest
valid heap items are evicted until it does.

This module is an implementation under test: it imports nothing of the kit.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

QueueItem = tuple[float, int, str]
"""(priority, last_used, prefix) as pushed onto the eviction heap."""


@dataclass
class Entry:
    """One cached prefix: its size in bytes, reuse count, last access and current score."""

    prefix: str
    size_bytes: int
    hits: int = 1
    last_used: int = 0
    priority: float = 0.0


class SchedulerSim:
    """Cache entries under a byte budget, evicted lowest score first.

    Invariant kept by every public method: ``current_bytes`` equals the sum of
    the entries' sizes and never exceeds ``capacity_bytes``; every entry has
    exactly one non-stale item in ``queue`` (the one matching its current
    priority and last_used).

    The same invariant as CrossHair contracts (``kvspec crosshair``):

    inv: self.current_bytes == sum(e.size_bytes for e in self.entries.values())
    inv: 0 <= self.current_bytes <= self.capacity_bytes
    inv: all(self.queue.count((e.priority, e.last_used, e.prefix)) >= 1 for e in self.entries.values())
    """

    def __init__(self, capacity_bytes: int = 1024) -> None:
        """An empty cache of ``capacity_bytes`` bytes.

        The bound below only keeps CrossHair's symbolic caches small; any size works.

        pre: capacity_bytes <= 64
        raises: ValueError
        """
        if capacity_bytes <= 0:
            raise ValueError("capacity_bytes must be positive")
        self.capacity_bytes = capacity_bytes
        self.current_bytes = 0
        self.time = 0
        self.entries: dict[str, Entry] = {}
        self.queue: list[QueueItem] = []
        self.log: list[str] = []
        # Evicted prefixes in order, drained by adapters.
        self.evictions: list[str] = []

    def score(self, hits: int, size: int, last_used: int) -> float:
        """Retention score: reuse bonus + recency bonus - size penalty.

        More hits or a more recent access never lower it; more bytes never raise it.
        Defined for the values an entry can have (a count, a size, a past access):

        pre: 0 <= hits < 2 ** 53 and 0 <= size < 2 ** 53
        pre: 0 <= last_used <= self.time
        post: __return__ <= self.score(hits + 1, size, last_used)
        post: __return__ <= self.score(hits, size, last_used + 1)
        post: __return__ >= self.score(hits, size + 1, last_used)
        """
        # Kept term for term in this order so results are bit-identical to the spec's score.
        return (
            float(hits)
            + 0.5 * (1.0 / (1.0 + max(self.time - last_used, 0)))
            - 0.25 * (size / max(self.capacity_bytes, 1))
        )

    # -- the heap -------------------------------------------------------------
    def _refresh(self, entry: Entry) -> None:
        """Rescore ``entry`` and push its new heap item; its older items become stale."""
        entry.priority = self.score(entry.hits, entry.size_bytes, entry.last_used)
        heapq.heappush(self.queue, (entry.priority, entry.last_used, entry.prefix))

    def _is_stale(self, item: QueueItem, entry: Entry | None) -> bool:
        """A heap item is stale once its entry is gone or has been rescored since."""
        if entry is None:
            return True
        priority, last_used, _ = item
        return (priority, last_used) != (entry.priority, entry.last_used)

    def _pop_victim(self) -> Entry:
        """The entry with the lowest (priority, last_used), found by popping past stale items."""
        while self.queue:
            item = heapq.heappop(self.queue)
            entry = self.entries.get(item[2])
            if not self._is_stale(item, entry):
                assert entry is not None
                return entry
        # Unreachable while the heap invariant holds; fall back to a scan rather than fail.
        if not self.entries:
            raise RuntimeError("nothing left to evict")
        return min(self.entries.values(), key=lambda e: (e.priority, e.last_used))

    def _evict_until_fit(self, needed: int) -> None:
        while self.current_bytes + needed > self.capacity_bytes:
            victim = self._pop_victim()
            del self.entries[victim.prefix]
            self.current_bytes -= victim.size_bytes
            self.evictions.append(victim.prefix)
            self.log.append(f"evict {victim.prefix} bytes={victim.size_bytes}")

    # -- access ---------------------------------------------------------------
    def touch(self, prefix: str, bytes_: int) -> Entry:
        """Access ``prefix``: a hit bumps its reuse count and recency; a miss
        admits a new entry of ``bytes_`` bytes, evicting until it fits.

        ``bytes_`` is only used for a miss; a hit keeps the entry's size.

        raises: ValueError
        post: self.entries[prefix] is __return__
        post: prefix in __old__.self.entries or __return__.size_bytes == bytes_
        post: __return__.hits >= 1 and __return__.last_used == self.time
        """
        if not isinstance(prefix, str) or not prefix:
            raise ValueError("prefix must be a non-empty string")
        if bytes_ <= 0:
            raise ValueError("bytes_ must be positive")
        if bytes_ > self.capacity_bytes:
            raise ValueError(f"an entry of {bytes_} bytes exceeds the capacity of {self.capacity_bytes}")
        self.time += 1
        entry = self.entries.get(prefix)
        if entry is not None:
            entry.hits += 1
            entry.last_used = self.time
            self._refresh(entry)
            self.log.append(f"reuse {prefix} hits={entry.hits}")
            return entry
        self._evict_until_fit(bytes_)
        entry = Entry(prefix, bytes_, hits=1, last_used=self.time)
        self.entries[prefix] = entry
        self.current_bytes += bytes_
        self._refresh(entry)
        self.log.append(f"add {prefix} bytes={bytes_}")
        return entry

    def schedule(self, requests: Iterable[tuple[str, int]]) -> list[str]:
        """Touch each (prefix, bytes) in order; return a copy of the whole event log.

        raises: ValueError
        post: len(__return__) >= len(__old__.self.log)
        """
        for prefix, size in requests:
            self.touch(prefix, size)
        return list(self.log)

    def snapshot(self) -> list[tuple[str, int, float, int]]:
        """(prefix, bytes, priority, hits) of every entry, most worth keeping first.

        post: len(__return__) == len(self.entries)
        post: all(__return__[i][2] >= __return__[i + 1][2] for i in range(len(__return__) - 1))
        """
        ordered = sorted(self.entries.values(), key=lambda e: (-e.priority, e.last_used, e.prefix))
        return [(e.prefix, e.size_bytes, e.priority, e.hits) for e in ordered]
