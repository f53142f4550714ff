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


def _int(data: dict[str, Any], name: str, line: int | None, optional: bool = False) -> Any:
    value = data.get(name)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraceFormatError(line, f"observation field {name!r} must be an integer, not {value!r}")
    return value


def observation_from_json(data: Any, line: int | None = None) -> Observation:
    """The Observation ``observation_to_json`` wrote; a malformed one is a format error on ``line``."""
    if not isinstance(data, dict):
        raise TraceFormatError(line, "observation must be an object")
    try:
        objects: dict[Any, ObjectView] = {}
        for o in data["objects"]:
            oid = decode(o["oid"], line)
            objects[oid] = ObjectView(
                oid,
                _int(o, "size", line),
                _int(o, "tokens", line),
                _int(o, "ref_count", line),
                decode(o.get("key"), line),
                _int(o, "hits", line, optional=True),
                _int(o, "last_used", line, optional=True),
            )
        requests: dict[str, RequestView] = {}
        for r in data["requests"]:
            state = r.get("state", "running")
            if state not in ("running", "preempted"):
                raise TraceFormatError(line, f"request state {state!r} is neither running nor preempted")
            requests[str(r["req"])] = RequestView(
                str(r["req"]),
                tuple(int(t) for t in r["tokens"]),
                _int(r, "prompt_len", line),
                tuple(decode(oid, line) for oid in r["objects"]),
                state,
            )
        raw_index = data.get("index")
        index = (
            None if raw_index is None else {decode(k, line): tuple(decode(o, line) for o in v) for k, v in raw_index}
        )
        return Observation(_int(data, "capacity", line), _int(data, "free", line), objects, requests, index)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TraceFormatError(line, f"malformed observation: {type(exc).__name__}: {exc}") from exc


def event_to_json(event: Event) -> dict[str, Any]:
    return {"kind": event.kind, "oid": encode(event.oid), "key": encode(event.key)}


def event_from_json(data: Any, line: int | None = None) -> Event:
    if not isinstance(data, dict) or data.get("kind") not in ("evict", "reclaim") or "oid" not in data:
        raise TraceFormatError(line, f"malformed event {data!r}: needs kind evict|reclaim and oid")
    return Event(data["kind"], decode(data["oid"], line), decode(data.get("key"), line))
