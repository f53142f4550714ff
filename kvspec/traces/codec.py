"""An exact JSON form of observations and events, so a recorded ledger reads back equal.

Observation.to_json is for people (it prints oids with repr). A trace needs the
values back: the invariants compare oids and cache keys for equality and look
keys up in dicts, and the spec's record and entry keys must come back as the
same tuples. The encoding keeps JSON scalars as they are, turns tuples (and
lists) into JSON arrays that read back as tuples (a spec BlockKey into the array
of its prefix, which reads back as the tuple it equals), bytes into {"bytes": hex},
and anything else into {"repr": text}, which reads back as an Opaque value equal
to every other Opaque of the same text.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from kvspec.spec import BlockKey, Event, ObjectView, Observation, RequestView

from . import values
from .lines import TraceFormatError


@dataclass(frozen=True)
class Opaque:
    """A value recorded by its repr only: equal to another exactly when the texts are equal."""

    text: str

    def __repr__(self) -> str:
        return self.text


def encode(value: object) -> Any:
    """JSON for an oid or a cache key; ``decode(encode(v)) == v`` for None, bool, int, float, str, bytes, tuples."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, tuple | list | BlockKey):
        return [encode(v) for v in value]
    if isinstance(value, bytes):
        return {"bytes": value.hex()}
    if isinstance(value, Opaque):
        return {"repr": value.text}
    return {"repr": repr(value)}


def decode(data: Any, line: int | None = None) -> Hashable:
    """The value ``encode`` wrote; arrays come back as tuples so they can be keys."""
    if data is None or isinstance(data, bool | int | float | str):
        return data
    if isinstance(data, list):
        return tuple(decode(v, line) for v in data)
    if isinstance(data, dict) and len(data) == 1:
        if isinstance(data.get("bytes"), str):
            try:
                return bytes.fromhex(data["bytes"])
            except ValueError as exc:
                raise TraceFormatError(line, f"bad bytes value {data['bytes']!r}") from exc
        if isinstance(data.get("repr"), str):
            return Opaque(data["repr"])
    raise TraceFormatError(line, f"cannot decode value {data!r}")


def observation_to_json(obs: Observation) -> dict[str, Any]:
    """The whole ledger, exactly: request tokens in full, oids and keys encoded."""
    return {
        "capacity": obs.capacity,
        "free": obs.free,
        "objects": [
            {
                "oid": encode(o.oid),
                "size": o.size,
                "tokens": o.tokens,
                "ref_count": o.ref_count,
                "key": encode(o.key),
                "hits": o.hits,
                "last_used": o.last_used,
            }
            for o in obs.objects.values()
        ],
        "requests": [
            {
                "req": r.req,
                "tokens": list(r.tokens),
                "prompt_len": r.prompt_len,
                "objects": [encode(oid) for oid in r.objects],
                "state": r.state,
            }
            for r in obs.requests.values()
        ],
        "index": None if obs.index is None else [[encode(k), [encode(o) for o in v]] for k, v in obs.index.items()],
    }


def _objects(data: dict[str, Any], line: int | None) -> dict[Any, ObjectView]:
    objects: dict[Any, ObjectView] = {}
    for i, found in enumerate(values.array("objects", data.get("objects"))):
        where = f"objects[{i}]"
        o = values.mapping(where, found)
        hits, last_used = o.get("hits"), o.get("last_used")
        oid = decode(o.get("oid"), line)
        objects[oid] = ObjectView(
            oid,
            values.integer(f"{where}.size", o.get("size")),
            values.integer(f"{where}.tokens", o.get("tokens")),
            values.integer(f"{where}.ref_count", o.get("ref_count")),
            decode(o.get("key"), line),
            None if hits is None else values.integer(f"{where}.hits", hits),
            None if last_used is None else values.integer(f"{where}.last_used", last_used),
        )
    return objects


def _requests(data: dict[str, Any], line: int | None) -> dict[str, RequestView]:
    requests: dict[str, RequestView] = {}
    for i, found in enumerate(values.array("requests", data.get("requests"))):
        where = f"requests[{i}]"
        r = values.mapping(where, found)
        req = values.string(f"{where}.req", r.get("req"))
        tokens = values.array(f"{where}.tokens", r.get("tokens"))
        requests[req] = RequestView(
            req,
            tuple(values.integer(f"{where}.tokens[{j}]", t) for j, t in enumerate(tokens)),
            values.integer(f"{where}.prompt_len", r.get("prompt_len")),
            tuple(decode(oid, line) for oid in values.array(f"{where}.objects", r.get("objects"))),
            values.choice(f"{where}.state", r.get("state", "running"), ("running", "preempted")),
        )
    return requests


def _index(data: dict[str, Any], line: int | None) -> dict[Any, tuple[Any, ...]] | None:
    raw = data.get("index")
    if raw is None:
        return None
    index: dict[Any, tuple[Any, ...]] = {}
    for i, pair in enumerate(values.array("index", raw)):
        entry = values.array(f"index[{i}]", pair)
        if len(entry) != 2:
            raise ValueError(f"field 'index[{i}]' must be a [key, [oids]] pair, not {len(entry)} values")
        index[decode(entry[0], line)] = tuple(decode(o, line) for o in values.array(f"index[{i}][1]", entry[1]))
    return index


def observation_from_json(data: Any, line: int | None = None) -> Observation:
    """The Observation ``observation_to_json`` wrote; a malformed one is a format error on ``line``."""
    if not isinstance(data, dict):
        raise TraceFormatError(line, "observation must be an object")
    try:
        return Observation(
            values.integer("capacity", data.get("capacity")),
            values.integer("free", data.get("free")),
            _objects(data, line),
            _requests(data, line),
            _index(data, line),
        )
    except ValueError as exc:
        raise TraceFormatError(line, f"malformed observation: {exc}") from None


def event_to_json(event: Event) -> dict[str, Any]:
    return {"kind": event.kind, "oid": encode(event.oid), "key": encode(event.key)}


def event_from_json(data: Any, line: int | None = None) -> Event:
    if not isinstance(data, dict) or data.get("kind") not in ("evict", "reclaim") or "oid" not in data:
        raise TraceFormatError(line, f"malformed event {data!r}: needs kind evict|reclaim and oid")
    return Event(data["kind"], decode(data["oid"], line), decode(data.get("key"), line))
