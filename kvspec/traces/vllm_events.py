"""vLLM's KV cache events as the live adapter records them: a thin reader over its offline checker.

The log (docs/traces.md, and adapters/vllm_live/recorded.py, which owns the
schema) holds, one record a line: ``{"config": {...}}`` (block size, pool size,
hash recipe), ZMQ batches ``{"seq", "ts", "events": [BlockStored |
BlockRemoved | AllBlocksCleared ...]}``, completed requests ``{"request":
{...}}``, gauge snapshots ``{"metrics": {...}}`` and prefix-cache resets
``{"reset": {...}}``; lines of other shapes are notes and are skipped. This
module checks each record's shape with its line number, hands the records to
``check_recorded`` (the stream ledger of spec/stream.py) and maps its verdicts
and first violation back to lines.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvspec.spec.stream import STREAM_INVARIANTS, MetricSnapshot, RequestRecord

from .lines import Line, TraceFormatError
from .result import Judge, TraceInvariant, TraceViolation

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
    for kind in ("reset", "config", "request", "metrics"):
        if kind in data:
            return kind
    return "batch" if "seq" in data and "events" in data else None


def _number(line: Line, data: Mapping[str, Any], name: str) -> None:
    value = data.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TraceFormatError(line.number, f"{name} must be a number, not {value!r}")


def _validate_batch(line: Line) -> None:
    line.need_int("seq")
    _number(line, line.data, "ts")
    for i, event in enumerate(line.need_list("events")):
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            raise TraceFormatError(line.number, f"event {i} is not a map tagged by 'type': {event!r}")
        if event["type"] in ("BlockStored", "BlockRemoved") and not isinstance(event.get("block_hashes"), list):
            raise TraceFormatError(line.number, f"event {i} ({event['type']}) has no block_hashes list")
        if event["type"] == "BlockStored" and not isinstance(event.get("token_ids"), list):
            raise TraceFormatError(line.number, f"event {i} (BlockStored) has no token_ids list")
        hashes = [
            *event.get("block_hashes", []),
            *([event["parent_block_hash"]] if event.get("parent_block_hash") else []),
        ]
        if any(isinstance(h, list | dict) for h in hashes):
            raise TraceFormatError(line.number, f"event {i} ({event['type']}) has a block hash that is not a scalar")
        if any(isinstance(t, bool) or not isinstance(t, int) for t in event.get("token_ids", [])):
            raise TraceFormatError(line.number, f"event {i} ({event['type']}) has token_ids that are not integers")


def validate(line: Line) -> str | None:
    """Check one record's shape as the checker will read it; returns its kind (None: a note, skipped)."""
    kind = kind_of(line.data)
    try:
        if kind == "batch":
            _validate_batch(line)
        elif kind == "request":
            RequestRecord.from_json(line.data["request"])
        elif kind == "metrics":
            MetricSnapshot.from_json(line.data["metrics"])
        elif kind == "reset":
            _number(line, line.data["reset"], "ts")
        elif kind == "config":
            config = line.data["config"]
            if not isinstance(config, dict):
                raise TraceFormatError(line.number, "config must be an object")
            for name in ("block_size", "num_gpu_blocks"):
                value = config.get(name)
                if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                    raise TraceFormatError(line.number, f"config {name} must be a positive integer, not {value!r}")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TraceFormatError(line.number, f"malformed {kind} record: {type(exc).__name__}: {exc}") from exc
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
    if not stream.violations:
        return
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


def _where(finding: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in finding.items() if k not in ("invariant", "problems")}
