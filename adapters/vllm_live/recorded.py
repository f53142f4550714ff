"""The recorded-log schema of a live run, and :func:`check_recorded`, its offline checker.

A recorded log is JSON lines, one record a line, in the order the client saw them:

- ``{"config": {"block_size", "num_gpu_blocks", "hash_algo", "none_hash_seed", "url", ...}}``: the
  server's cache shape (from ``vllm:cache_config_info``); usually first;
- ``{"seq", "ts", "events", "dp_rank"}``: one ZMQ batch as published (``events`` as vLLM encodes them:
  maps tagged by ``"type"``);
- ``{"request": {"id", "prompt_token_ids", "output_token_ids"?, "cached_tokens", "started", "finished",
  "mode"?, "preempted"?}}``: one completed request (times on the server's clock: ``time.time()`` on
  the same host);
- ``{"metrics": {"ts", "idle", "kv_cache_usage_perc"?, "num_preemptions_total"?, ...}}``: a gauge
  snapshot;
- ``{"reset": {"ts", "success"}}``: the client reset the prefix cache (POST /reset_prefix_cache) and
  the call returned at ``ts``;
- ``{"gap": {"from", "to"}}``: batches with seq in [from, to) were lost and the replay socket could
  not supply them.

The config's ``initial_cache`` is ``"empty"`` when the stream was followed from the server's start
(the kit's own server), else ``"unknown"``: removals of hashes never seen stored are then not judged
until a reset or AllBlocksCleared.

Lines of other shapes are ignored, so a log can carry notes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvspec.adapter import MetricSnapshot, RequestRecord, StreamCheck, StreamResult

from .hashing import SUPPORTED_ALGOS, BlockHasher


@dataclass
class Log:
    """A recorded log split by record kind."""

    config: dict[str, Any] = field(default_factory=dict)
    batches: list[Mapping[str, Any]] = field(default_factory=list)
    requests: list[RequestRecord] = field(default_factory=list)
    snapshots: list[MetricSnapshot] = field(default_factory=list)
    resets: list[float] = field(default_factory=list)
    gaps: list[tuple[int, int]] = field(default_factory=list)


def split_records(records: Iterable[Mapping[str, Any]]) -> Log:
    """The records of a log by kind; lines of unknown shape are skipped."""
    log = Log()
    config, batches, requests, snapshots = log.config, log.batches, log.requests, log.snapshots
    for record in records:
        if "gap" in record:
            log.gaps.append((int(record["gap"]["from"]), int(record["gap"]["to"])))
        elif "reset" in record:
            if record["reset"].get("success", True):
                log.resets.append(float(record["reset"]["ts"]))
        elif "config" in record:
            config.update(record["config"])
        elif "request" in record:
            requests.append(RequestRecord.from_json(record["request"]))
        elif "metrics" in record:
            snapshots.append(MetricSnapshot.from_json(record["metrics"]))
        elif "seq" in record and "events" in record:
            batches.append(record)
    return log


def check_recorded(records: Iterable[Mapping[str, Any]]) -> StreamResult:
    """Check a recorded live run offline: every stream invariant of :mod:`kvspec.spec.stream`.

    ``records`` are the decoded JSON lines of a log (see the module docstring for the schema).
    The block size comes from the config record, else from the first BlockStored event; the usable
    pool is ``num_gpu_blocks - 1`` (vLLM reserves a null block); block hashes are recomputed with
    vLLM's recipe for the config's ``hash_algo`` (sha256 unless said otherwise). Returns the
    :class:`~kvspec.spec.stream.StreamResult`: ``.verdicts()`` rows shaped like a report's
    ``invariants``, ``.violated`` the names that broke, ``.violations`` the first problems found.
    """
    log = split_records(records)
    check = stream_checker(log, first_block_size(log.batches))
    for batch in log.batches:
        check.batch(batch)
    return check.close()


def first_block_size(batches: Iterable[Mapping[str, Any]]) -> int | None:
    """The ``block_size`` of the first BlockStored event (a log without a config record names it there)."""
    stored = (e for b in batches for e in b.get("events", []) if e.get("type") == "BlockStored")
    return next((e.get("block_size") for e in stored), None)


def stream_checker(log: Log, block_size_hint: int | None = None) -> StreamCheck:
    """The stream check of a log's records other than its batches, which are then fed one by one.

    ``block_size_hint``: the first BlockStored's block size, used when the config names none.
    """
    config = log.config
    block_size = config.get("block_size") or block_size_hint
    if not block_size:
        raise ValueError("the log names no block size (no config record and no BlockStored event)")
    blocks = config.get("num_gpu_blocks")
    usable = int(blocks) - 1 if blocks else None
    algo = str(config.get("hash_algo") or "sha256")
    hasher = None
    if algo in SUPPORTED_ALGOS and config.get("hashes_recomputable", True):
        seed = config.get("none_hash_seed")
        hasher = BlockHasher(int(block_size), algo=algo, **({"none_hash_seed": seed} if seed else {}))
    # No event stream (a server attached without --events): the index is never known, so only the
    # gauges are judged, and a reset cannot make an empty ledger look like the server's cache.
    streamed = "events" not in config or config["events"] is not None
    return StreamCheck(
        log.requests,
        log.snapshots,
        block_size=int(block_size),
        usable_blocks=usable,
        published_hash=hasher,
        resets=log.resets if streamed else (),
        gaps=log.gaps,
        initial_known=streamed and config.get("initial_cache", "empty") == "empty",
    )


def load_log(path: Path) -> list[dict[str, Any]]:
    """The records of a JSONL log (blank lines skipped)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
