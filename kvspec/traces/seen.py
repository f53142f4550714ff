"""What each line of a trace leaves behind, for a picture (``kvspec trace check --html``): never a verdict.

A format's check calls its judge's ``watch`` (when one is set) with a :class:`Seen` per line it
replays, from the format's own replay (the same ledger that judges the line), so what is drawn is
what was judged. Building the whole pool costs the pool's size, so a line carries it as a function
(:attr:`Seen.pool`, to call at once or never: the replay moves on) and, cheaply, the look of the
objects it changed (:attr:`Seen.changed`: free, cached, held, leaving), which is all an overview of
a long log needs. Block-event logs (kvfabric, side tables) carry no request tables: their pool is
:func:`block_pool`, one object per block that holds a reference or a hash.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field

from kvspec.spec import Event, ObjectView, Observation, Op, Outcome

FREE, CACHED, HELD, LEAVING = 0, 1, 2, 3
"""An object's look on one line: free (no object), cached (a key, no reference), held, leaving the cache."""


def look(ref_count: int, key: Hashable | None) -> int:
    """The look of an object with this ref count and key."""
    return HELD if ref_count > 0 else CACHED if key is not None else FREE


@dataclass(frozen=True)
class Pool:
    """The pool after a line: the observation (None where the trace cannot say: a kvspec trace without
    observations), what the trace records per object beside the ledger (a kvfabric state, a block's tokens),
    and whether the pool's size is known (its ``free`` means nothing otherwise)."""

    observation: Observation | None
    notes: Mapping[Hashable, str] = field(default_factory=dict)
    capacity_known: bool = True


@dataclass(frozen=True)
class Seen:
    """One replayed line: its label, the pool after it (call :attr:`pool` now or never), the objects whose look it
    changed (None: any may have; then the pool says), what left the cache, and its op where the trace has ops."""

    line: int
    label: str
    pool: Callable[[], Pool]
    changed: Mapping[Hashable, int] | None = None
    events: tuple[Event, ...] = ()
    op: Op | None = None
    outcome: Outcome | None = None


Watch = Callable[[Seen], None]
"""Called with each replayed line's :class:`Seen`, in order, up to and including the violating line."""


def block_pool(
    blocks: Iterable[tuple[int, int, Hashable | None]], capacity: int | None, block_size: int = 0
) -> Observation:
    """The pool of a block-event log: ``(block_id, ref_count, block_hash)`` per block the replay knows.

    A block that holds a reference or a hash is an object (a cached block with no reference is one, as
    in every observation); the rest of ``capacity`` is free (0 when the size is unknown).
    """
    objects = {bid: ObjectView(bid, 1, block_size, ref, key) for bid, ref, key in blocks if ref > 0 or key is not None}
    size = capacity if capacity is not None else 0
    return Observation(size, max(size - len(objects), 0), objects, {})


def short(value: object, limit: int = 8) -> str:
    """A hash or a key, cut to ``limit`` characters for a cell."""
    text = value.hex() if isinstance(value, bytes) else str(value)
    return text if len(text) <= limit else text[:limit]


__all__ = ["CACHED", "FREE", "HELD", "LEAVING", "Pool", "Seen", "Watch", "block_pool", "look", "short"]
