"""The typed batch decoder (kvspec/traces/vllm_batch.py) reads a line only as the strict reader reads it.

The decoder is the fast path of ``kvspec trace check --format vllm-events``; a line it refuses takes the
strict path (parse_line, kind_of, validate). These tests hold it to its invariant on the real log
recorded from a vLLM server (tests/data/vllm_live_cpu.jsonl) and on malformed variants of its batches:
where it returns a batch, the strict reader reads a batch with the same values; where the strict
reader refuses a line, or reads it as another record kind, the decoder returns None (the lines it
leaves to the strict path although they are good -- an event type it does not know, a ``\\u`` escape --
are read there, as every line was before it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("msgspec")

from kvspec.traces.lines import TraceFormatError, parse_line
from kvspec.traces.vllm_batch import DECODE
from kvspec.traces.vllm_events import kind_of, validate

LIVE = Path(__file__).parent / "data" / "vllm_live_cpu.jsonl"
# The fields the stream ledger reads of each event type.
FIELDS = {
    "BlockStored": ("block_hashes", "token_ids", "parent_block_hash"),
    "BlockRemoved": ("block_hashes",),
    "AllBlocksCleared": (),
}
STORED = {
    "type": "BlockStored",
    "block_hashes": [11, "ab"],
    "parent_block_hash": None,
    "token_ids": [1, 2, 3, 4],
    "block_size": 2,
    "lora_id": None,
    "medium": "GPU",
}


def strict(chunk: bytes) -> dict[str, Any] | None:
    """The strict reader's batch (its data), or None when it refuses the line or reads another kind."""
    try:
        line = parse_line(1, chunk)
        if kind_of(line.data) != "batch":
            return None
        validate(line)
    except TraceFormatError:
        return None
    return line.data


def plain(value: Any) -> Any:
    return list(value) if type(value) is tuple else value


def agrees(chunk: bytes) -> bool:
    """The decoder leaves ``chunk`` to the strict reader, or reads the batch the strict reader reads."""
    assert DECODE is not None
    typed, data = DECODE(chunk), strict(chunk)
    if typed is None:
        return True  # the strict path reads it (and says what is wrong with it)
    if data is None:
        return False
    # token_ids decode as a tuple (what the ledger keeps), the strict reader's as a list: the same values
    events = [{"type": e.kind, **{k: plain(getattr(e, k)) for k in FIELDS[e.kind]}} for e in typed.events]
    wanted = [{"type": e["type"], **{k: e.get(k) for k in FIELDS[e["type"]]}} for e in data["events"]]
    return typed.seq == data["seq"] and typed.ts == float(data["ts"]) and events == wanted


def test_every_batch_of_the_real_log_decodes_as_the_strict_reader_reads_it() -> None:
    batches = [chunk for chunk in LIVE.read_bytes().splitlines() if strict(chunk) is not None]
    assert len(batches) > 50
    for chunk in batches:
        assert DECODE is not None and DECODE(chunk) is not None
        assert agrees(chunk), chunk[:200]
    others = [chunk for chunk in LIVE.read_bytes().splitlines() if chunk.strip() and strict(chunk) is None]
    assert others and all(DECODE(chunk) is None for chunk in others)  # config, requests, gauges: not batches


def batch(**fields: Any) -> bytes:
    return json.dumps(
        {"seq": 3, "ts": 1.5, "events": [STORED, {"type": "BlockRemoved", "block_hashes": [11]}], **fields}
    ).encode()


def event(**fields: Any) -> bytes:
    return json.dumps({"seq": 3, "ts": 1.5, "events": [{**STORED, **fields}]}).encode()


CASES = {
    "a good batch": batch(),
    "a cleared batch": json.dumps({"seq": 0, "ts": 2, "events": [{"type": "AllBlocksCleared"}]}).encode(),
    "seq true": batch(seq=True),
    "seq a float": batch(seq=3.0),
    "seq null": batch(seq=None),
    "ts a string": batch(ts="1.5"),
    "ts too large": b'{"seq": 3, "ts": 1e400, "events": []}',
    "ts missing": b'{"seq": 3, "events": []}',
    "events not a list": batch(events={"type": "AllBlocksCleared"}),
    "an event not an object": batch(events=[7]),
    "an unknown event type": batch(events=[{"type": "BlockMoved", "block_hashes": [1]}]),
    "an event type not a string": batch(events=[{"type": 3}]),
    "a hash true": event(block_hashes=[True]),
    "a hash a float": event(block_hashes=[1.5]),
    "a token a string": event(token_ids=[1, "2", 3, 4]),
    "a token true": event(token_ids=[1, True, 3, 4]),
    "token_ids missing": json.dumps(
        {"seq": 3, "ts": 1.5, "events": [{"type": "BlockStored", "block_hashes": [1]}]}
    ).encode(),
    "parent a list": event(parent_block_hash=[1]),
    "block_size 0": event(block_size=0),
    "a request with seq and events": batch(request={"id": "x"}),
    "a config with seq and events": batch(config={}),
    "a gap with seq and events": batch(gap={"from": 1, "to": 2}),
    "a lone surrogate in a hash": batch().replace(b'"ab"', b'"\\ud800"'),
    "an escape in a good hash": batch().replace(b'"ab"', b'"\\u0061b"'),
    "not JSON": batch()[:-3],
    "not UTF-8": batch().replace(b'"ab"', b'"a\xffb"'),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_decoder_reads_a_line_only_as_the_strict_reader_does(name: str) -> None:
    assert agrees(CASES[name])


def test_the_decoder_refuses_what_the_strict_reader_refuses() -> None:
    """Each malformed case is refused by both (the agreement above would hold if both read it wrongly)."""
    assert DECODE is not None
    read = {name for name, chunk in CASES.items() if DECODE(chunk) is not None}
    assert read == {"a good batch", "a cleared batch"}
