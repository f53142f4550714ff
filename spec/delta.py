"""What one step changed: an observation delta, and the full observation kept up to date from deltas.

An adapter may report, beside or instead of its whole :class:`~.observation.Observation`, what a step
changed (:class:`ObservationDelta`). The protocol's one invariant: **a step's delta applied to the
observation before the step equals the observation after it** (``delta.apply(before) == after``).
The checker keeps the full observation itself (:class:`KeptObservation`, updated in place), checks the
changed part every step and the whole state every K steps and at the end of a run, where it also compares
what it kept against the adapter's own full observation: a delta that left out a change is caught there.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .observation import ObjectView, Observation, RequestView

_ABSENT: Any = object()
"""An overlay's old value for a key the mapping did not hold before the step."""


@dataclass(frozen=True)
class ObservationDelta:
    """What one step changed in an observation.

    ``objects``/``requests``/``index``: each added or changed entry with its value after the step;
    ``dropped_*``: the oids, request ids and index keys that are gone after it. ``free`` is the free
    capacity after the step; ``extra`` replaces the observation's extra when given (None: unchanged).
    A key is never both changed and dropped.
    """

    free: int
    objects: Mapping[Any, ObjectView] = field(default_factory=dict)
    dropped_objects: frozenset[Any] = frozenset()
    requests: Mapping[str, RequestView] = field(default_factory=dict)
    dropped_requests: frozenset[str] = frozenset()
    index: Mapping[Any, tuple[Any, ...]] = field(default_factory=dict)
    dropped_keys: frozenset[Any] = frozenset()
    extra: Mapping[str, object] | None = None

    @property
    def touched_objects(self) -> set[Hashable]:
        """The oids whose entry the step changed, added or dropped."""
        return {*self.objects, *self.dropped_objects}

    @property
    def touched_requests(self) -> set[str]:
        """The request ids whose entry the step changed, added or dropped."""
        return {*self.requests, *self.dropped_requests}

    def apply(self, before: Observation) -> Observation:
        """The observation after the step: ``before`` with this delta's changes (a copy; ``before`` is kept)."""
        objects = {oid: o for oid, o in before.objects.items() if oid not in self.dropped_objects}
        objects.update(self.objects)
        requests = {rid: r for rid, r in before.requests.items() if rid not in self.dropped_requests}
        requests.update(self.requests)
        index: dict[Any, tuple[Any, ...]] | None = None
        if before.index is not None or self.index:
            index = {k: v for k, v in (before.index or {}).items() if k not in self.dropped_keys}
            index.update(self.index)
        extra = before.extra if self.extra is None else self.extra
        return Observation(before.capacity, self.free, objects, requests, index, extra)


class Overlay(Mapping[Any, Any]):
    """A read-only view of a mapping that is updated in place.

    ``old``: for keys a step changed, their value before it (``_ABSENT``: not held then), so the view
    answers as the mapping was before the step. ``keys``: when given, iteration (and ``len``) covers only
    these keys, while every lookup still answers from the whole mapping: a check that iterates sees the
    part a step touched, a check that looks up sees the truth.
    """

    __slots__ = ("_base", "_keys", "_old")

    def __init__(
        self, base: Mapping[Any, Any], old: Mapping[Any, Any] | None = None, keys: Collection[Any] | None = None
    ) -> None:
        self._base, self._old, self._keys = base, old or {}, keys

    def __getitem__(self, key: Any) -> Any:
        if self._old:
            value = self._old.get(key, self)
            if value is not self:
                if value is _ABSENT:
                    raise KeyError(key)
                return value
        return self._base[key]

    def __contains__(self, key: object) -> bool:
        # As ``self[key]`` not raising, without the exception on the common path (a hot lookup of the checks).
        try:
            if self._old:
                value = self._old.get(key, self)
                if value is not self:
                    return value is not _ABSENT
            return key in self._base
        except TypeError:  # an unhashable key
            return False

    def __iter__(self) -> Iterator[Any]:
        if self._keys is not None:
            contains = self.__contains__
            return (k for k in self._keys if contains(k))
        if not self._old:
            return iter(self._base)
        return self._all()

    def _all(self) -> Iterator[Any]:
        old = self._old
        for key in self._base:
            if old.get(key, self) is not _ABSENT:
                yield key
        for key, value in old.items():
            if value is not _ABSENT and key not in self._base:
                yield key

    def whole(self) -> Overlay:
        """The same view iterating every key it holds, not only the step's part (lookups unchanged)."""
        return self if self._keys is None else Overlay(self._base, self._old)

    def __len__(self) -> int:
        if self._keys is None and not self._old:
            return len(self._base)
        return sum(1 for _ in self)


def whole(mapping: Mapping[Any, Any]) -> Mapping[Any, Any]:
    """``mapping`` iterating every key: a local part's view (Overlay) widened to the whole state; else itself."""
    return mapping.whole() if isinstance(mapping, Overlay) else mapping


@dataclass(frozen=True)
class Change:
    """One applied delta: the observation before and after it, and what the step touched."""

    before: Observation
    after: Observation
    objects: frozenset[Any]
    requests: frozenset[str]
    keys: frozenset[Any]


class KeptObservation:
    """The full observation of an adapter that reports deltas, kept up to date in place.

    Invariant: after :meth:`apply` of a step's delta, :meth:`now` equals ``delta.apply(previous now)``;
    ``readers[oid]`` is exactly the set of live requests whose table holds ``oid``. An ``Observation``
    from :meth:`now` reads the live mappings: it is the state now, not a snapshot, so a step's ``before``
    comes from :meth:`apply`, which keeps the old values of what it changed.
    """

    def __init__(self, obs: Observation) -> None:
        self.capacity, self.free, self.extra = obs.capacity, obs.free, obs.extra
        self.objects: dict[Any, ObjectView] = dict(obs.objects)
        self.requests: dict[str, RequestView] = dict(obs.requests)
        self.index: dict[Any, tuple[Any, ...]] | None = None if obs.index is None else dict(obs.index)
        self.readers: dict[Any, set[str]] = {}
        for rid, request in self.requests.items():
            for oid in request.objects:
                self.readers.setdefault(oid, set()).add(rid)

    def now(self) -> Observation:
        """The whole observation as it stands, over the live mappings."""
        return Observation(self.capacity, self.free, self.objects, self.requests, self.index, self.extra)

    def apply(self, delta: ObservationDelta) -> Change:
        """Apply one step's delta in place; the whole observation before and after it, and what it touched."""
        old_objects = _update(self.objects, delta.objects, delta.dropped_objects)
        old_requests = _update(self.requests, delta.requests, delta.dropped_requests)
        old_index: dict[Any, Any] = {}
        if self.index is None and delta.index:
            self.index = {}
        if self.index is not None:
            old_index = _update(self.index, delta.index, delta.dropped_keys)
        for rid, was in old_requests.items():
            if was is not _ABSENT:
                for oid in was.objects:
                    holders = self.readers.get(oid)
                    if holders is not None:
                        holders.discard(rid)
                        if not holders:
                            del self.readers[oid]
            now = self.requests.get(rid)
            if now is not None:
                for oid in now.objects:
                    self.readers.setdefault(oid, set()).add(rid)
        old_free, old_extra = self.free, self.extra
        self.free = delta.free
        if delta.extra is not None:
            self.extra = delta.extra
        before_index = None if self.index is None else Overlay(self.index, old_index)
        before = Observation(
            self.capacity,
            old_free,
            Overlay(self.objects, old_objects),
            Overlay(self.requests, old_requests),
            before_index,
            old_extra,
        )
        keys = set(old_index)
        for oid, was in old_objects.items():
            for obj in (was, self.objects.get(oid)):
                if obj is not None and obj is not _ABSENT and obj.key is not None:
                    keys.add(obj.key)
        return Change(before, self.now(), frozenset(old_objects), frozenset(old_requests), frozenset(keys))

    def local(self, change: Change, oids: Collection[Any], req: str | None) -> tuple[Observation, Observation]:
        """``change``'s before and after, iterating only what the step can have changed.

        The part iterated: the touched objects and ``oids`` (those the step's events name), the touched
        requests, ``req`` (the op's), and every request that reads a touched object (so that a count of an
        object's readers over the part is its whole count); the index keys the touched objects carried
        before or after. Lookups answer from the whole observation.
        """
        objects = dict.fromkeys([*change.objects, *oids])
        requests = dict.fromkeys(change.requests)
        if req is not None:
            requests[req] = None
        for oid in objects:
            for rid in sorted(self.readers.get(oid, ())):
                requests[rid] = None

        def view(obs: Observation) -> Observation:
            index = None if obs.index is None else Overlay(obs.index, None, change.keys)
            return Observation(
                obs.capacity, obs.free, Overlay(obs.objects, None, objects), Overlay(obs.requests, None, requests),
                index, obs.extra,
            )  # fmt: skip

        return view(change.before), view(change.after)


def _update(target: dict[Any, Any], changed: Mapping[Any, Any], dropped: Collection[Any]) -> dict[Any, Any]:
    """Set ``changed`` and drop ``dropped`` in ``target``; each touched key's old value (``_ABSENT``: none)."""
    old: dict[Any, Any] = {}
    for key, value in changed.items():
        old[key] = target.get(key, _ABSENT)
        target[key] = value
    for key in dropped:
        old[key] = target.pop(key, _ABSENT)
    return old


def differences(kept: Observation, full: Observation, limit: int = 5) -> list[str]:
    """Where the observation kept from deltas differs from the adapter's own full one (at most ``limit``)."""
    problems = []
    if kept.free != full.free:
        problems.append(f"free is {kept.free} by the deltas, {full.free} by the observation")
    for what, a, b in (
        ("object", kept.objects, full.objects),
        ("request", kept.requests, full.requests),
        ("index entry", kept.index or {}, full.index or {}),
    ):
        if a == b:  # the common case, compared at C speed (an object's own __eq__ per value)
            continue
        for key in dict.fromkeys([*a, *b]):
            if a.get(key) != b.get(key):
                problems.append(f"{what} {key!r} is {a.get(key)} by the deltas, {b.get(key)} by the observation")
                if len(problems) >= limit:
                    return problems
    return problems
