"""An observation as the change from the one before: what a version-2 kvspec trace records between snapshots.

A delta is computed on the JSON an observation is written as (codec.observation_to_json): the
scalar fields that changed, and for each keyed collection (``objects`` by ``oid``, ``requests``
by ``req``, ``index`` entries by their key) the items that are new or changed (``put``) and the
identities of those that left (``drop``). Applying the delta to the observation before gives the
observation after, exactly: :func:`diff` then :meth:`Base.apply` round-trips. The base holds one
observation, so reading a trace keeps the live state, never the trace.
"""

from __future__ import annotations

import json
from typing import Any

from .lines import TraceFormatError

SCALARS = ("capacity", "free")
COLLECTIONS = ("objects", "requests", "index")


def _identity(name: str, item: Any) -> str:
    """An item's identity in its collection, as a string: its oid, its req, or an index entry's key."""
    if name == "objects":
        return json.dumps(item["oid"], sort_keys=True)
    if name == "requests":
        return json.dumps(item["req"])
    return json.dumps(item[0], sort_keys=True)


def _keyed(name: str, items: list[Any] | None) -> dict[str, Any] | None:
    return None if items is None else {_identity(name, item): item for item in items}


def diff(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The delta that turns observation JSON ``before`` into ``after``."""
    delta: dict[str, Any] = {name: after[name] for name in SCALARS if after[name] != before[name]}
    for name in COLLECTIONS:
        old, new = _keyed(name, before.get(name)), _keyed(name, after.get(name))
        if old is None or new is None:
            if old != new:
                delta[name] = {"all": after.get(name)}
            continue
        put = [item for key, item in new.items() if old.get(key) != item]
        drop = [json.loads(key) for key in old if key not in new]
        if put or drop:
            delta[name] = {"put": put, "drop": drop}
    return delta


class Base:
    """The observation JSON the next delta applies to (keyed by identity, in the order items arrived)."""

    def __init__(self, observation: dict[str, Any]) -> None:
        self.reset(observation)

    def reset(self, observation: dict[str, Any]) -> None:
        """A full snapshot: the base from now on."""
        if not isinstance(observation, dict):
            raise TraceFormatError(None, "observation must be an object")
        self.scalars = {name: observation.get(name) for name in SCALARS}
        try:
            self.collections = {name: _keyed(name, observation.get(name)) for name in COLLECTIONS}
        except (KeyError, IndexError, TypeError) as exc:
            raise TraceFormatError(None, f"malformed observation: {type(exc).__name__}: {exc}") from None

    def observation(self) -> dict[str, Any]:
        """The observation JSON the base stands for now."""
        out: dict[str, Any] = dict(self.scalars)
        for name, items in self.collections.items():
            out[name] = None if items is None else list(items.values())
        return out

    def apply(self, delta: Any, line: int) -> dict[str, Any]:
        """The base after ``delta`` (which it becomes); a delta that does not fit is a format error on ``line``."""
        if not isinstance(delta, dict):
            raise TraceFormatError(line, "malformed delta: must be an object")
        unknown = sorted(set(delta) - set(SCALARS) - set(COLLECTIONS))
        if unknown:
            raise TraceFormatError(line, f"malformed delta: unknown field {unknown[0]!r}")
        for name in SCALARS:
            if name in delta:
                self.scalars[name] = delta[name]
        for name in COLLECTIONS:
            if name in delta:
                self._collection(name, delta[name], line)
        return self.observation()

    def _collection(self, name: str, change: Any, line: int) -> None:
        if not isinstance(change, dict):
            raise TraceFormatError(line, f"malformed delta: {name} must be an object")
        if "all" in change:
            try:
                self.collections[name] = _keyed(name, change["all"])
            except (KeyError, IndexError, TypeError) as exc:
                raise TraceFormatError(line, f"malformed delta: {name}.all: {type(exc).__name__}: {exc}") from None
            return
        items = self.collections[name]
        if items is None:
            raise TraceFormatError(line, f"malformed delta: changes {name}, which the observation before lacks")
        put, drop = change.get("put", []), change.get("drop", [])
        if not isinstance(put, list) or not isinstance(drop, list):
            raise TraceFormatError(line, f"malformed delta: {name}.put and {name}.drop must be arrays")
        for ident in drop:
            key = json.dumps(ident, sort_keys=True)
            if key not in items:
                raise TraceFormatError(line, f"malformed delta: drops {name} {key}, which the observation before lacks")
            del items[key]
        for i, item in enumerate(put):
            try:
                items[_identity(name, item)] = item
            except (KeyError, IndexError, TypeError) as exc:
                raise TraceFormatError(
                    line, f"malformed delta: {name}.put[{i}] has no identity: {type(exc).__name__}: {exc}"
                ) from None
