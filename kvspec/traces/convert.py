"""Convert a KVFabric lifecycle log into a side table, so that the kit's other tools read it too.

What carries over (docs/traces.md, "Converting"): block allocations, seals (hash, prefix depth,
parent hash), touches, releases and evictions, with ``seq`` renumbered and ``ts`` in seconds
from ``time_ns``; a ``lifecycle_reset`` becomes a ``block_evicted`` (reason ``reset``) of every
cached block. What does not: ``prefix_lookup`` (KVFabric logs token counts, a side-table lookup
needs the prompt's block hashes and the blocks hit), rankings (KVFabric lists only the selected
victims, uncached free blocks among them; a side-table ranking is every candidate), hit counts
(counted since the block's record began, not since it was sealed), and request events.

A kvspec trace needs every op's token ids, which no KVFabric log holds: that conversion is
refused with the reason. So are logs that the side table's model cannot start from: a window
cut from a longer log, or a file with more than one tracker run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvspec import jsonio

from . import kvfabric, values
from .lines import Line, TraceFormatError, read_lines
from .side_table import SIDE_TABLE_SCHEMA

TARGETS = ("side-table", "kvspec")


class ConversionError(ValueError):
    """The log cannot be converted to the target: the message says why (exit 2)."""


def _side_table_events(lines: list[Line]) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    cached: dict[int, tuple[str, int]] = {}  # block id -> (hash, ref count) while cached

    def emit(line: Line, event: str, **fields: Any) -> None:
        time_ns = line.opt_int("time_ns")
        stamp = {} if time_ns is None else {"ts": time_ns / 1e9}
        events.append({"event": event, "seq": len(events) + 1, **stamp, **fields})

    for i, line in enumerate(lines):
        name = line.typed(values.string, "event", line.need("event"))
        seq = line.opt_int("seq")
        if i == 0 and name != "tracker_initialized" and seq != 1:
            raise ConversionError(
                f"line {line.number}: the log starts mid-run (seq {seq}); a side table starts from an empty pool"
            )
        if i > 0 and name == "tracker_initialized":
            raise ConversionError(f"line {line.number}: a second tracker run in the file; convert each run separately")
        if name not in kvfabric.BLOCK_EVENTS and name not in ("lifecycle_reset", "cache_admission_limited"):
            continue
        if name == "lifecycle_reset":
            for block_id, (block_hash, _) in sorted(cached.items()):
                emit(line, "block_evicted", block_id=block_id, block_hash=block_hash, reason="reset")
            cached.clear()
            continue
        if name == "cache_admission_limited":
            emit(line, "cache_admission_limited", request_id=line.opt(values.string, "request_id"))
            continue
        block_id = line.need_int("block_id", minimum=0)
        ref = line.opt_int("ref_count")
        if name == "block_allocated":
            emit(line, name, block_id=block_id, ref_count=1)
        elif name == "block_sealed":
            block_hash = line.typed(values.string, "block_hash", line.need("block_hash"))
            fields: dict[str, Any] = {"block_hash": block_hash}
            for key in ("prefix_depth", "parent_hash"):
                if line.data.get(key) is not None:
                    fields[key] = line.data[key]
            emit(line, name, block_id=block_id, **fields)
            cached[block_id] = (block_hash, ref or 0)
        elif name == "block_touched":
            emit(line, name, block_id=block_id, **({} if ref is None else {"ref_count": ref}))
        elif name == "ref_count_changed":
            emit(line, name, block_id=block_id, ref_count=line.need_int("ref_count"))
        elif name == "block_evicted":
            emit(line, name, block_id=block_id, block_hash=line.opt(values.string, "block_hash"), reason="evict")
            cached.pop(block_id, None)
    return events


def convert(source: Path, target: str, out: Path, *, capacity: int | None = None) -> int:
    """Write ``source`` (a KVFabric log) as ``target`` to ``out``; returns the events written.

    Raises TraceFormatError (the log cannot be read), ConversionError (it cannot be converted).
    """
    if target not in TARGETS:
        raise ConversionError(f"unknown target format {target!r}; known: {', '.join(TARGETS)}")
    lines = read_lines(source)
    if not any(kvfabric.recognizes(line.data) for line in lines):
        raise TraceFormatError(None, "nothing in this file is a kvfabric record")
    if target == "kvspec":
        raise ConversionError(
            "a kvspec trace replays ops with their token ids; a KVFabric log records token counts and block "
            "hashes only, so the ops cannot be rebuilt (convert to side-table instead)"
        )
    header: dict[str, Any] = {"kvspec_side_table": SIDE_TABLE_SCHEMA, "source": "kvfabric", "duplicate_hashes": True}
    if capacity is not None:
        header["num_blocks"] = capacity
    events = _side_table_events(lines)
    text = "".join(json.dumps(record, allow_nan=False) + "\n" for record in [header, *events])
    jsonio.write_text(out, text)
    return len(events)
