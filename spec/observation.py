"""What an adapter shows of its implementation: the ledger of cache objects.

An observation is a projection; it must be taken from the implementation's own
state (ref counts, hash map, block tables), never recomputed by the adapter.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

Oid = Hashable
RequestState = Literal["running", "preempted"]


class ObjectView(msgspec.Struct, frozen=True, gc=False):
    """One cache object that occupies capacity: a block, a shared record or an entry.

    ``key`` is the implementation's cache key (a block hash, a prefix), None while
    the object is not cached. ``tokens`` is how many tokens it holds.
    """

    oid: Oid
    size: int
    tokens: int
    ref_count: int
    key: Hashable | None = None
    hits: int | None = None
    last_used: int | None = None


class RequestView(msgspec.Struct, frozen=True, gc=False):
    """A live request: its tokens (prompt first) and the objects it references, in order.

    At block granularity ``objects`` is the block table. A preempted request keeps
    its tokens and references nothing.
    """

    req: str
    tokens: tuple[int, ...]
    prompt_len: int
    objects: tuple[Oid, ...]
    state: RequestState = "running"


@dataclass(frozen=True)
class Observation:
    """The whole ledger at one instant.

    ``free`` is the capacity that no object holds: at block granularity the blocks
    that no request references *and* that carry no cache key. A cached block with
    ref_count 0 is an object (in ``objects``, with its key), not free, even where
    the implementation keeps it in its free list: ``free + sum(object sizes) ==
    capacity`` (capacity_conservation says when a projection counts those blocks
    twice). ``index`` is the cache index (key -> objects found under it), None when
    the implementation does not expose one.
    """

    capacity: int
    free: int
    objects: Mapping[Any, ObjectView]  # keyed by oid; oids are the implementation's own
    requests: Mapping[str, RequestView]
    index: Mapping[Any, tuple[Any, ...]] | None = None
    extra: Mapping[str, object] = field(default_factory=dict, compare=False)

    def referencing(self) -> dict[Oid, int]:
        """Number of live references to each object, counted from the request tables."""
        counts: dict[Oid, int] = {}
        for request in self.requests.values():
            for oid in request.objects:
                counts[oid] = counts.get(oid, 0) + 1
        return counts

    def to_json(self) -> dict[str, object]:
        return {
            "capacity": self.capacity,
            "free": self.free,
            "objects": [
                {
                    "oid": repr(o.oid),
                    "size": o.size,
                    "tokens": o.tokens,
                    "ref_count": o.ref_count,
                    "key": None if o.key is None else repr(o.key),
                    "hits": o.hits,
                    "last_used": o.last_used,
                }
                for o in self.objects.values()
            ],
            "requests": [
                {
                    "req": r.req,
                    "state": r.state,
                    "tokens": len(r.tokens),
                    "objects": [repr(oid) for oid in r.objects],
                }
                for r in self.requests.values()
            ],
        }
