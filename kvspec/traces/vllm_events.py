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

from collections.abc import Callable, Mapping
from typing import Any

from kvspec.spec.stream import STREAM_INVARIANTS

from . import values
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
    for kind in ("gap", "reset", "config", "request", "metrics"):
        if kind in data:
            return kind
    return "batch" if "seq" in data and "events" in data else None


def _optional(read: Callable[..., object], name: str, value: object, **limits: Any) -> None:
    if value is not None:
        read(name, value, **limits)


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
        _optional(values.block_hash, f"{name}.parent_block_hash", event.get("parent_block_hash"))
        _optional(values.integer, f"{name}.block_size", event.get("block_size"), minimum=1)


def _batch(data: dict[str, Any]) -> None:
    values.integer("seq", data.get("seq"))
    values.number("ts", data.get("ts"))
    for i, event in enumerate(values.array("events", data.get("events"))):
        _event(f"events[{i}]", event)


def _request(data: dict[str, Any]) -> None:
    r = values.mapping("request", data["request"])
    values.string("request.id", r.get("id"))
    _integers("request.prompt_token_ids", r.get("prompt_token_ids"))
    if r.get("output_token_ids") is not None:
        _integers("request.output_token_ids", r["output_token_ids"])
    _optional(values.integer, "request.cached_tokens", r.get("cached_tokens"), minimum=0)
    values.number("request.started", r.get("started"))
    values.number("request.finished", r.get("finished"))
    _optional(values.string, "request.mode", r.get("mode"))
    _optional(values.boolean, "request.preempted", r.get("preempted"))


def _metrics(data: dict[str, Any]) -> None:
    m = values.mapping("metrics", data["metrics"])
    values.number("metrics.ts", m.get("ts"))
    _optional(values.boolean, "metrics.idle", m.get("idle"))
    _optional(values.number, "metrics.kv_cache_usage_perc", m.get("kv_cache_usage_perc"))
    _optional(values.number, "metrics.num_preemptions_total", m.get("num_preemptions_total"))


def _reset(data: dict[str, Any]) -> None:
    r = values.mapping("reset", data["reset"])
    values.number("reset.ts", r.get("ts"))
    _optional(values.boolean, "reset.success", r.get("success"))


def _gap(data: dict[str, Any]) -> None:
    g = values.mapping("gap", data["gap"])
    values.integer("gap.from", g.get("from"))
    values.integer("gap.to", g.get("to"))


def _config(data: dict[str, Any]) -> None:
    c = values.mapping("config", data["config"])
    _optional(values.integer, "config.block_size", c.get("block_size"), minimum=1)
    _optional(values.blocks, "config.num_gpu_blocks", c.get("num_gpu_blocks"))
    for name in ("hash_algo", "none_hash_seed", "events", "vllm"):
        _optional(values.string, f"config.{name}", c.get(name))
    _optional(values.choice, "config.initial_cache", c.get("initial_cache"), allowed=("empty", "unknown"))
    _optional(values.boolean, "config.hashes_recomputable", c.get("hashes_recomputable"))


_RECORDS: dict[str, Callable[[dict[str, Any]], None]] = {
    "batch": _batch,
    "request": _request,
    "metrics": _metrics,
    "reset": _reset,
    "gap": _gap,
    "config": _config,
}


def validate(line: Line) -> str | None:
    """Check one record's shape and types as the checker will read them; its kind (None: a note, skipped)."""
    kind = kind_of(line.data)
    if kind is not None:
        try:
            _RECORDS[kind](line.data)
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
