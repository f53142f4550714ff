"""The ledgers at record and entry granularity: objects keyed by their prompt, sized in blocks or bytes.

A record is a shared prefix that requests reference (admit, append, release);
an entry is a cached response that nothing references and that admit alone
creates or refreshes. Both evict unreferenced objects in the declared order
until a new one fits, all or nothing.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

from ..observation import ObjectView
from ..ops import Config, Op, Outcome, Semantics, size_of
from ..policies import retention_score
from .base import CacheObject, Content, LedgerModel, Operation, Request


class KeyedLedger(LedgerModel):
    """Objects keyed by their prompt; each cached one is its own index entry, and free = capacity - held."""

    def __init__(self, config: Config, semantics: Semantics) -> None:
        super().__init__(config, semantics)
        self.records: dict[Content, CacheObject] = {}
        self.index: dict[Content, Content] = {}

    @property
    def free(self) -> int:
        return self.config.capacity - sum(r.size for r in self.records.values())

    def _objects(self) -> dict[object, ObjectView]:
        return {
            key: ObjectView(key, rec.size, rec.tokens, rec.ref_count, key, rec.hits, rec.last_used)
            for key, rec in self.records.items()
        }

    def _index(self) -> dict[Hashable, tuple[object, ...]]:
        return {key: (oid,) for key, oid in self.index.items()}

    def _eviction_order(self) -> list[Content]:
        """The unreferenced objects, first to evict first: lowest (priority, last_used) under score,
        else lowest (hits, last_used, -size)."""
        candidates = [k for k, r in self.records.items() if r.ref_count == 0]
        if self.semantics.eviction == "score":
            return sorted(candidates, key=lambda k: (self.records[k].priority, self.records[k].last_used))
        return sorted(
            candidates,
            key=lambda k: (self.records[k].hits, self.records[k].last_used, -self.records[k].size),
        )

    def _make_room(self, size: int) -> bool:
        """Evict unreferenced objects in policy order until ``size`` fits; all or nothing.

        False, with nothing evicted, when even every unreferenced object would not make room.
        """
        order = self._eviction_order()
        if size > self.free + sum(self.records[k].size for k in order):
            return False
        for key in order:
            if self.free >= size:
                break
            del self.records[key]
            self.index.pop(key, None)
            self._evicted.append(key)
        return True


class RecordLedger(KeyedLedger, granularity="record"):
    """Shared prefix records: requests reference the record of their prompt, which grows as they append."""

    def _operations(self) -> Mapping[str, Operation]:
        return {"admit": self._admit, "append": self._append, "release": self._release}

    def _admit(self, op: Op) -> Outcome:
        """Reference the cached record of the prompt (a hit), or make room for a new one; refused, nothing changes."""
        assert op.req is not None
        key = op.tokens
        rec = self.records.get(key)
        if rec is not None:
            rec.ref_count += 1
            rec.hits += 1
            rec.last_used = self.clock
            self.requests[op.req] = Request(op.tokens, len(op.tokens), [key])
            return Outcome.ok(len(op.tokens))
        size = size_of(len(key), self.config, "record")
        if not self._make_room(size):
            return Outcome.refused("not enough free or evictable blocks")
        self.records[key] = CacheObject(key, len(key), size, 1, 1, self.clock)
        self.index[key] = key
        self.requests[op.req] = Request(op.tokens, len(op.tokens), [key])
        return Outcome.ok(0)

    def _append(self, op: Op) -> Outcome:
        """Grow the request's record by the new tokens, making room for the blocks it adds; refused, nothing changes."""
        assert op.req is not None
        request = self.requests[op.req]
        rec = self.records[request.objects[0]]  # type: ignore[index]
        target = rec.tokens + len(op.tokens)
        added = size_of(target, self.config, "record") - rec.size
        if added > 0 and not self._make_room(added):
            return Outcome.refused("not enough free or evictable blocks")
        rec.tokens, rec.size, rec.last_used = target, rec.size + added, self.clock
        request.tokens = request.tokens + op.tokens
        return Outcome.ok()

    def _release(self, op: Op) -> Outcome:
        """Drop the request's reference; the last one reclaims the record unless ``keep``."""
        assert op.req is not None
        request = self.requests.pop(op.req)
        key = request.objects[0]
        rec = self.records[key]  # type: ignore[index]
        rec.ref_count -= 1
        if rec.ref_count == 0 and not op.keep:
            assert isinstance(key, tuple)
            del self.records[key]
            self.index.pop(key, None)
            self._reclaimed.append(key)
        else:
            rec.last_used = self.clock
        return Outcome.ok()


class EntryLedger(KeyedLedger, granularity="entry"):
    """Byte-sized entries with a retention score: admit creates or refreshes one; nothing references it."""

    def _operations(self) -> Mapping[str, Operation]:
        return {"admit": self._admit}

    def _admit(self, op: Op) -> Outcome:
        """Refresh the cached entry of the prompt (a hit), or make room for a new one; refused, nothing changes."""
        key, cap = op.tokens, self.config.capacity
        ent = self.records.get(key)
        if ent is not None:
            ent.hits += 1
            ent.last_used = self.clock
            ent.priority = retention_score(ent.hits, ent.size, 0, cap)
            return Outcome.ok(len(key))
        size = size_of(len(key), self.config, "entry")
        if not self._make_room(size):
            return Outcome.refused("entry does not fit")
        self.records[key] = CacheObject(key, len(key), size, 0, 1, self.clock, retention_score(1, size, 0, cap))
        self.index[key] = key
        return Outcome.ok(0)
