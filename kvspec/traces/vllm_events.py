"""vLLM's KV cache events as the live adapter records them: a thin reader over its offline checker.

The log (docs/traces.md, and adapters/vllm_live/recorded.py, which owns the
schema) holds, one record a line: ``{"config": {...}}`` (block size, pool size,
hash recipe), ZMQ batches ``{"seq", "ts", "events": [BlockStored |
BlockRemoved | AllBlocksCleared ...]}``, completed requests ``{"request":
{...}}``, gauge snapshots ``{"metrics": {...}}``, prefix-cache resets
``{"reset": {...}}`` and lost batches ``{"gap": {...}}``; lines of other shapes
are notes and are skipped. This module checks each record's shape and the type
of every field the checker reads with its line number, hands the records to
``check_recorded`` (the stream ledger of spec/stream.py) and maps its verdicts
and first violation back to lines.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kvspec.spec import Event, ObjectView, Observation
from kvspec.spec.stream import STREAM_INVARIANTS, StreamResult

from . import values
from .lines import Line, TraceFormatError
from .result import Judge, TraceInvariant, TraceViolation
from .seen import CACHED, FREE, LEAVING, Pool, Seen, Watch, short

INVARIANTS: tuple[TraceInvariant, ...] = tuple(
    TraceInvariant(name, kind, "see kvspec.spec.stream") for name, kind in STREAM_INVARIANTS
)
EVENT_TYPES = ("BlockStored", "BlockRemoved", "AllBlocksCleared")


DESCRIPTION = "vLLM KV cache events as the live adapter records them"


def recognizes(first: Mapping[str, Any]) -> bool:
    """A recorded live run starts with one of its record kinds."""
    return kind_of(first) is not None


def kind_of(data: Mapping[str, Any]) -> str | None:
    """The record kind, in the order check_recorded tells them apart; None for a note."""
    for kind in ("gap", "reset", "config", "request", "metrics"):
        if kind in data:
            return kind
    return "batch" if "seq" in data and "events" in data else None


def _positive(name: str, value: object) -> int:
    return values.integer(name, value, minimum=1)


def _count(name: str, value: object) -> int:
    return values.integer(name, value, minimum=0)


def _integers(name: str, value: object) -> None:
    for i, item in enumerate(values.array(name, value)):
        values.integer(f"{name}[{i}]", item)


def _event(name: str, found: object) -> None:
    event = values.mapping(name, found)
    kind = values.string(f"{name}.type", event.get("type"))
    if kind in ("BlockStored", "BlockRemoved"):
        for i, key in enumerate(values.array(f"{name}.block_hashes", event.get("block_hashes"))):
            values.block_hash(f"{name}.block_hashes[{i}]", key)
    if kind == "BlockStored":
        _integers(f"{name}.token_ids", event.get("token_ids"))
        if event.get("parent_block_hash") is not None:
            values.block_hash(f"{name}.parent_block_hash", event["parent_block_hash"])
        if event.get("block_size") is not None:
            _positive(f"{name}.block_size", event["block_size"])


def _batch(data: dict[str, Any]) -> None:
    values.integer("seq", data.get("seq"))
    values.number("ts", data.get("ts"))
    for i, event in enumerate(values.array("events", data.get("events"))):
        _event(f"events[{i}]", event)


# The fields of each record kind the checker reads: name -> (reader of values.py, required). An optional
# field may be absent or null. The batch, which nests its events, is read by _batch.
Reader = Callable[[str, object], object]
_FIELDS: dict[str, dict[str, tuple[Reader, bool]]] = {
    "request": {
        "id": (values.string, True),
        "prompt_token_ids": (_integers, True),
        "output_token_ids": (_integers, False),
        "cached_tokens": (_count, False),
        "started": (values.number, True),
        "finished": (values.number, True),
        "mode": (values.string, False),
        "preempted": (values.boolean, False),
    },
    "metrics": {
        "ts": (values.number, True),
        "idle": (values.boolean, False),
        "kv_cache_usage_perc": (values.number, False),
        "num_preemptions_total": (values.number, False),
    },
    "reset": {"ts": (values.number, True), "success": (values.boolean, False)},
    "gap": {"from": (values.integer, True), "to": (values.integer, True)},
    "config": {
        "block_size": (_positive, False),
        "num_gpu_blocks": (values.blocks, False),
        "hash_algo": (values.string, False),
        "none_hash_seed": (values.string, False),
        "events": (values.string, False),
        "vllm": (values.string, False),
        "initial_cache": (lambda name, value: values.choice(name, value, ("empty", "unknown")), False),
        "hashes_recomputable": (values.boolean, False),
    },
}


def _record(kind: str, data: dict[str, Any]) -> None:
    body = values.mapping(kind, data[kind])
    for name, (read, required) in _FIELDS[kind].items():
        if required or body.get(name) is not None:
            read(f"{kind}.{name}", body.get(name))


def validate(line: Line) -> str | None:
    """Check one record's shape and types as the checker will read them; its kind (None: a note, skipped)."""
    kind = kind_of(line.data)
    if kind is not None:
        try:
            if kind == "batch":
                _batch(line.data)
            else:
                _record(kind, line.data)
        except ValueError as exc:
            raise TraceFormatError(line.number, f"malformed {kind} record: {exc}") from None
    return kind


def _line_of(where: Mapping[str, Any], lines: list[Line], kinds: list[str | None]) -> Line:
    """The line a stream finding points at: the n-th batch, a request by id, a snapshot by time."""
    if "batch" in where:
        batches = [line for line, kind in zip(lines, kinds, strict=True) if kind == "batch"]
        return batches[int(where["batch"])]
    if "request" in where:
        return next(
            (
                line
                for line, kind in zip(lines, kinds, strict=True)
                if kind == "request" and str(line.data["request"].get("id")) == str(where["request"])
            ),
            lines[-1],
        )
    if "metrics" in where:
        return next(
            (
                line
                for line, kind in zip(lines, kinds, strict=True)
                if kind == "metrics" and float(line.data["metrics"]["ts"]) == float(where["metrics"])
            ),
            lines[-1],
        )
    return lines[-1]


def check(lines: list[Line], judge: Judge) -> None:
    """Check a recorded vLLM event log with the stream ledger; the first finding is the reported violation."""
    try:
        from kvspec.adapters.vllm_live.recorded import check_recorded
    except ImportError as exc:
        raise TraceFormatError(None, f"the vLLM event checker is not available: {exc}") from exc
    kinds = []
    for line in lines:
        judge.at(line)
        kinds.append(validate(line))
    judge.current = None  # the stream ledger reads the records as a whole, in time order
    try:
        stream = check_recorded([line.data for line in lines])
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        raise TraceFormatError(None, f"the log cannot be checked: {type(exc).__name__}: {exc}") from exc
    result = judge.result
    config: dict[str, Any] = next(
        (line.data["config"] for line, kind in zip(lines, kinds, strict=True) if kind == "config"), {}
    )
    result.adapter = "vllm-live"
    result.adapter_version = str(config.get("vllm", ""))
    result.steps = sum(1 for kind in kinds if kind in ("batch", "request"))
    result.checked.update(stream.checked)
    result.coverage.update(stream.seen)
    if "published_hash" not in config and not config.get("hashes_recomputable", True):
        judge.unknown("hash_chain_agrees", "the log says its hashes cannot be recomputed")
    if stream.violations:
        _violations(stream, lines, kinds, judge)
    if judge.watch is not None:  # up to and including the first violation's line, as every format
        upto = len(lines) if result.violation is None else lines.index(_line_by_number(lines, result.violation.line))
        _watch(lines[: upto + 1], kinds[: upto + 1], config, judge.watch)


def _line_by_number(lines: list[Line], number: int) -> Line:
    return next(line for line in lines if line.number == number)


def _violations(stream: StreamResult, lines: list[Line], kinds: list[str | None], judge: Judge) -> None:
    """The stream's first finding as the trace's violation (with its line); the others' first lines."""
    result = judge.result
    first = stream.violations[0]
    where = _where(first)
    line = _line_of(where, lines, kinds)
    at = lines.index(line)
    same = {n: v for n, v in stream.first_violation.items() if _where(v) == where}
    result.violation = TraceViolation(
        str(first["invariant"]),
        line.number,
        at,
        line.data,
        list(first["problems"]),
        [(b.number, b.text) for b in lines[max(0, at - judge.context) : at]],
        {n: list(same[n]["problems"]) for n in stream.violated if n in same},
    )
    for name in stream.violated:
        if name not in same:
            found = stream.first_violation[name]
            later = _line_of(_where(found), lines, kinds)
            result.later_violations[name] = {
                "line": later.number,
                "step": lines.index(later),
                "event": later.data,
                "problems": list(found["problems"])[:5],
                "context": [],
            }


def _watch(lines: list[Line], kinds: list[str | None], config: Mapping[str, Any], watch: Watch) -> None:
    """Each record as a picture's column, over the cache index the batches leave (hash -> cached copies).

    The index is the stream ledger's own view (spec/stream.py): a BlockStored adds a copy of each hash, a
    BlockRemoved takes one away, AllBlocksCleared empties it; nothing says which block id holds a hash or who
    references it. Notes hold each hash's tokens. The pool is vLLM's usable blocks (num_gpu_blocks - 1).
    """
    blocks = config.get("num_gpu_blocks")
    usable = int(blocks) - 1 if blocks else None
    copies: dict[Any, int] = {}
    tokens: dict[Any, str] = {}
    for line, kind in zip(lines, kinds, strict=True):
        if kind in (None, "config"):
            continue
        data = line.data
        left: list[Event] = []
        touched: set[Any] = set()
        cleared = False
        if kind == "batch":
            stored = removed = 0
            for event in data["events"]:
                if event.get("type") == "AllBlocksCleared":
                    left += [Event("reclaim", key, key) for key in copies]
                    copies.clear()
                    cleared = True
                for i, key in enumerate(event.get("block_hashes") or ()):
                    touched.add(key)
                    if event.get("type") == "BlockStored":
                        stored += 1
                        copies[key] = copies.get(key, 0) + 1
                        size = int(event.get("block_size") or config.get("block_size") or 0)
                        own = (event.get("token_ids") or [])[i * size : (i + 1) * size] if size else []
                        tokens[key] = "[" + " ".join(str(t) for t in own[:3]) + (" ...]" if len(own) > 3 else "]")
                    elif event.get("type") == "BlockRemoved":  # of an uncached hash too: drawn where it happened
                        removed += 1
                        left.append(Event("evict", key, key))
                        copies[key] = copies.get(key, 0) - 1
                        if copies[key] <= 0:
                            del copies[key]
            label = f"L{line.number} batch {data['seq']}\n+{stored} -{removed}"
        elif kind == "request":
            request = data["request"]
            cached = request.get("cached_tokens")
            label = f"L{line.number} request\n{short(request['id'], 10)} {cached}/{len(request['prompt_token_ids'])}"
        elif kind == "metrics":
            label = f"L{line.number} metrics\nusage {data['metrics'].get('kv_cache_usage_perc')}"
        else:
            label = f"L{line.number} {kind}"

        def pool() -> Pool:  # the index as it is now: called at once or never
            objects = {key: ObjectView(key, n, 0, 0, key) for key, n in copies.items()}
            size = usable or 0
            observation = Observation(size, max(size - sum(copies.values()), 0), objects, {})
            return Pool(observation, {key: tokens.get(key, "") for key in copies}, usable is not None)

        changed = None if cleared else {key: CACHED if key in copies else FREE for key in touched}
        changed = None if changed is None else {**changed, **{e.oid: LEAVING for e in left}}
        watch(Seen(line.number, label, pool, changed, tuple(left)))


def _where(finding: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in finding.items() if k not in ("invariant", "problems")}
