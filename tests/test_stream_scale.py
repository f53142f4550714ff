"""The vLLM event checker at scale: the synthetic stream, the streaming read, memory that follows the live index.

The stream of kvspec.bench.vllm_stream must hold every stream invariant as generated; each test
then breaks one thing in it (a token, a store, a seq, the pool) and asserts that the streaming
``kvspec trace check`` names the invariant and the line. Memory is measured by what the ledger
retains (index entries), never by timing.
"""

from __future__ import annotations

import gc
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kvspec.adapters.vllm_live.hashing import BlockHasher
from kvspec.bench.vllm_stream import Engine, StreamShape, generate
from kvspec.spec.stream import StreamLedger
from kvspec.traces import check_trace
from kvspec.traces.lines import MAX_DEPTH, TraceFormatError, nesting, parse_line

SHAPE = StreamShape(blocks=64, events=4_000, reset_every=1_500, preempt_every=10)


@pytest.fixture(scope="module")
def stream(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    path = tmp_path_factory.mktemp("stream") / "events.jsonl"
    made = generate(path, SHAPE)
    return [json.loads(line) for line in path.read_text().splitlines()], made


def write(tmp_path: Path, records: list[dict[str, Any]]) -> Path:
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def stored_events(records: list[dict[str, Any]]) -> list[tuple[int, dict[str, Any]]]:
    return [(i, e) for i, r in enumerate(records) if "events" in r for e in r["events"] if e["type"] == "BlockStored"]


def test_the_generated_stream_holds_and_exercises_stores_evictions_preemptions_and_resets(
    stream: tuple[list[dict[str, Any]], dict[str, Any]], tmp_path: Path
) -> None:
    records, made = stream
    assert made["events"] == SHAPE.events and made["preempted"] > 0 and made["cleared"] > 0 and made["removed"] > 0
    result = check_trace(write(tmp_path, records), "vllm-events")
    assert result.exit_code == 0, (result.error, result.violation)
    for name in ("cached_within_pool", "removed_was_cached", "stored_once", "hash_chain_agrees"):
        assert result.checked[name] > 1_000, (name, result.checked)
    assert result.coverage["events"] == SHAPE.events and result.coverage["cleared"] == made["cleared"]


@pytest.mark.parametrize(
    ("corrupt", "invariant"),
    [
        ("token", "hash_chain_agrees"),
        ("drop_store", "removed_was_cached"),
        ("duplicate_store", "stored_once"),
        ("small_pool", "cached_within_pool"),
        ("seq_gap", "event_sequence_contiguous"),
    ],
)
def test_a_broken_stream_is_caught_on_its_line(
    stream: tuple[list[dict[str, Any]], dict[str, Any]], tmp_path: Path, corrupt: str, invariant: str
) -> None:
    records = json.loads(json.dumps(stream[0]))
    at = len(records) // 2  # well after the pool is full: the index is live
    index, event = next((i, e) for i, e in stored_events(records) if i >= at)
    if corrupt == "token":
        event["token_ids"][-1] += 1
    elif corrupt == "drop_store":
        removed = {
            h
            for r in records[index:]
            for e in r.get("events", [])
            if e["type"] == "BlockRemoved"
            for h in e["block_hashes"]
        }
        index, event = next((i, e) for i, e in stored_events(records) if i >= at and set(e["block_hashes"]) & removed)
        records[index]["events"].remove(event)
    elif corrupt == "duplicate_store":
        records[index]["events"].append(json.loads(json.dumps(event)))
    elif corrupt == "small_pool":
        records[0]["config"]["num_gpu_blocks"] = SHAPE.blocks // 2
    else:
        for r in records[index:]:
            r["seq"] += 1
    result = check_trace(write(tmp_path, records), "vllm-events")
    assert result.exit_code == 1 and result.violation is not None, (result.error, result.checked)
    names = {result.violation.invariant, *result.later_violations}
    assert invariant in names, (invariant, names)
    if corrupt in ("token", "duplicate_store", "seq_gap"):  # the line of the broken batch (1-based, config first)
        assert result.violation.invariant == invariant and result.violation.line == index + 1


def test_the_streaming_read_and_the_whole_file_read_agree(tmp_path: Path) -> None:
    """The picture path reads the log whole; the plain check streams it: same verdict, same line."""
    data = Path(__file__).parent / "data" / "vllm_live_cpu.jsonl"
    records = [json.loads(line) for line in data.read_text().splitlines() if line.strip()]
    stored = next(e for r in records[40:] for e in r.get("events", []) if e["type"] == "BlockStored")
    stored["token_ids"][0] += 1
    path = write(tmp_path, records)
    streamed = check_trace(path, "vllm-events")
    whole = check_trace(path, "vllm-events", watch=lambda seen: None)
    assert streamed.violation is not None and whole.violation is not None
    assert (streamed.violation.invariant, streamed.violation.line, streamed.violation.step) == (
        whole.violation.invariant,
        whole.violation.line,
        whole.violation.step,
    )
    assert streamed.violation.context == whole.violation.context and streamed.checked == whole.checked


def test_a_malformed_batch_deep_in_a_stream_cannot_be_checked_with_its_line(
    stream: tuple[list[dict[str, Any]], dict[str, Any]], tmp_path: Path
) -> None:
    records = json.loads(json.dumps(stream[0]))
    index, event = stored_events(records)[-3]
    event["block_hashes"][0] = 1.5
    result = check_trace(write(tmp_path, records), "vllm-events")
    assert result.exit_code == 2 and result.error_line == index + 1, (result.error, result.error_line)
    assert "block_hashes[0]" in result.error


def test_retained_state_follows_the_live_index_not_the_stream_length() -> None:
    """Index entries the ledger holds at their peak: the same for a stream 4x as long, and a few per block."""

    def peak(events: int) -> int:
        ledger = StreamLedger(16, 128, BlockHasher(16))
        most = 0
        for i, batch in enumerate(Engine(StreamShape(blocks=128, events=events, reset_every=10**9)).run()):
            ledger.apply_batch(i, i, batch)
            most = max(most, len(ledger.blocks) + len(ledger.child))
        assert ledger.result.held and ledger.result.checked["removed_was_cached"] > events // 4
        return most

    short, long = peak(5_000), peak(20_000)
    assert long <= short * 1.25 and long <= 3 * 128, (short, long)


def test_without_a_recipe_a_hash_reused_for_another_prefix_is_caught_after_it_was_forgotten() -> None:
    """The one memory kept per hash ever stored: a removed hash stored again for other tokens is caught."""
    ledger = StreamLedger(2, None, None)
    store = {"type": "BlockStored", "block_hashes": [7], "parent_block_hash": None, "token_ids": [1, 2]}
    ledger.apply_batch(0, 0, [store, {"type": "BlockRemoved", "block_hashes": [7]}])
    assert not ledger.blocks and ledger.result.held  # forgotten from the index
    ledger.apply_batch(1, 1, [{**store, "token_ids": [3, 4]}])
    assert ledger.result.violated == ["hash_chain_agrees"]


def test_the_fast_depth_bound_agrees_with_the_walk() -> None:
    deep = b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)
    with pytest.raises(TraceFormatError, match="nested more than"):
        parse_line(1, b'{"a": ' + deep + b"}")
    brackets = b'{"a": "' + b"[" * 100 + b'", "b": [' + b"[1]," * 80 + b"[2]]}"
    assert 3 <= (nesting(brackets) or 0) <= 6 and parse_line(1, brackets).data["a"] == "[" * 100
    assert (nesting(deep) or 0) >= MAX_DEPTH + 1
    assert nesting(b'{"a": "\\\\"}') is None  # a backslash: left to the walk


def test_an_events_chain_is_each_block_hashed_after_the_one_before() -> None:
    """BlockHasher.chain (one call per event) agrees with child() block by block and with published(prefix),
    which runs vLLM's recipe (sha256 over pickle) on each whole prefix: tokens of every pickle int width."""
    hasher = BlockHasher(4)
    tokens = (0, 255, 256, 65_535, 65_536, 2**31 - 1, 2**31, 7, 1, 2, 3, 2**40, 5, 6, 8, 9)
    blocks = [tokens[i : i + 4] for i in range(0, len(tokens), 4)]
    state, one_by_one = hasher.root(), []
    for block in blocks:
        published, state = hasher.child(state, block)
        one_by_one.append((published, state))
    assert hasher.chain(hasher.root(), blocks) == one_by_one
    assert [p for p, _ in one_by_one] == [hasher.published(tokens[: i + 4]) for i in range(0, len(tokens), 4)]
    assert hasher.chain(one_by_one[1][1], blocks[2:]) == one_by_one[2:]  # from a block's state, the rest


def test_a_block_after_a_broken_identity_is_hashed_from_the_state_the_index_keeps() -> None:
    """The event's chain is hashed ahead from its parent; when a block's state is not the one it ran on (its hash
    stood for another prefix before), the next block is judged from the state the index keeps for that hash."""
    hasher = BlockHasher(2)
    k1, s1 = hasher.child(hasher.root(), (1, 2))
    k2, _ = hasher.child(s1, (3, 4))  # the right hash after k1 as the index knows it
    ledger = StreamLedger(2, None, hasher, requests=False)
    ledger.apply_batch(
        0, 0, [{"type": "BlockStored", "block_hashes": [k1], "parent_block_hash": None, "token_ids": [1, 2]}]
    )
    # k1 now claims tokens 5, 6 (a broken identity); k2 follows it with tokens 3, 4
    stored = {"type": "BlockStored", "block_hashes": [k1, k2], "parent_block_hash": None, "token_ids": [5, 6, 3, 4]}
    ledger.apply_batch(1, 1, [stored])
    chain_problems = [v for v in ledger.result.violations if v["invariant"] == "hash_chain_agrees"]
    assert len(chain_problems) == 1 and "did not stand for before" in chain_problems[0]["problems"][0], chain_problems
    assert ledger.result.checked["hash_chain_agrees"] == 3  # k1, k1's identity, k2 recomputed from k1's kept state


def index_problems(ledger: StreamLedger) -> list[str]:
    """What breaks StreamLedger's documented index invariants (no request in flight): [] when they hold."""
    blocks, problems = ledger.blocks, []
    kids = Counter(entry.parent for entry in blocks.values() if entry.tokens is not None)
    if ledger.total != sum(entry.copies for entry in blocks.values()):
        problems.append(f"total {ledger.total} is not the sum of the copies")
    for key, entry in blocks.items():
        copies, parent, tokens, count, state = entry.copies, entry.parent, entry.tokens, entry.kids, entry.state
        if tokens is None and (parent is not None or count or state is not None or copies <= 0):
            problems.append(f"{key}: no node, yet {entry}")
        if tokens is not None and (count != kids[key] or (copies <= 0 and count <= 0)):
            problems.append(f"{key}: kids {count}, {kids[key]} nodes name it; {copies} copies")
        if tokens is not None and parent is not None and getattr(blocks.get(parent), "tokens", None) is None:
            problems.append(f"{key}: its parent {parent} has no node")
    return problems


@pytest.mark.parametrize("short_way", [True, False])
@pytest.mark.parametrize("requests", [False, True])
def test_the_index_keeps_its_invariants_batch_by_batch(requests: bool, short_way: bool) -> None:
    """One entry per hash: copies, node, kids and chain state stay consistent through stores, evictions,
    preemptions and clears (the short way for new hashes and the general one keep the same index)."""
    ledger = StreamLedger(16, 64, BlockHasher(16), requests=requests)
    ledger.short_way = short_way
    for i, batch in enumerate(Engine(SHAPE).run()):
        ledger.apply_batch(i, i, batch)
        assert not index_problems(ledger), (i, index_problems(ledger)[:3])
    assert ledger.result.held and ledger.result.seen["cleared"] > 0
    assert ledger.result.checked["hash_chain_agrees"] == ledger.result.seen["stored"]  # every block recomputed


@pytest.mark.parametrize("corrupt", ["none", "token", "small_pool", "duplicate_store"])
def test_the_short_way_for_new_hashes_judges_as_the_general_one(corrupt: str) -> None:
    """A ledger joined late (initial_known=False) keeps the set of hashes seen stored, so it stores every block
    the general way; on a stream that starts empty and is never cleared its verdicts are the same. So each
    finding, count and message of the short way (a plain ledger) is the general way's. (A removal of a hash never
    stored is judged only by the plain ledger: those corruptions are left to the other tests.)"""
    batches = list(Engine(StreamShape(blocks=64, events=3_000, reset_every=10**9, preempt_every=10)).run())
    stores = [e for batch in batches[len(batches) // 2 :] for e in batch if e["type"] == "BlockStored"]
    if corrupt == "token":
        stores[0]["token_ids"][-1] += 1
    elif corrupt == "duplicate_store":  # the second store of a cached hash takes the general way in both
        next(batch for batch in batches if stores[2] in batch).append(dict(stores[2]))
    results = []
    for initial_known in (True, False):
        ledger = StreamLedger(16, 40 if corrupt == "small_pool" else 64, BlockHasher(16), initial_known=initial_known)
        for i, batch in enumerate(batches):
            ledger.apply_batch(i, i, batch)
        assert (ledger.ever is None) is initial_known  # the late ledger never saw a clear: the general way
        results.append((dict(ledger.result.checked), ledger.result.violations, dict(ledger.result.seen)))
    assert results[0] == results[1]
    assert bool(results[0][1]) is (corrupt != "none"), results[0][1][:1]


def test_a_ledger_without_requests_keeps_no_prefix_lookup() -> None:
    """requests=False (a log without request records): the node -> hash map is not kept, and a lookup says so."""
    kept = {}
    for requests in (True, False):
        ledger = StreamLedger(16, 128, BlockHasher(16), requests=requests)
        for i, batch in enumerate(Engine(StreamShape(blocks=128, events=2_000, reset_every=10**9)).run()):
            ledger.apply_batch(i, i, batch)
        assert ledger.result.held
        kept[requests] = (len(ledger.child), dict(ledger.result.checked))
    assert kept[True][0] > 0 and kept[False][0] == 0 and kept[True][1] == kept[False][1], kept
    with pytest.raises(ValueError, match="requests=False"):
        ledger.cached_prefix_blocks(list(range(48)))


def test_the_garbage_collector_is_restored_after_a_check(tmp_path: Path, stream: Any) -> None:
    """The streaming check pauses the cyclic collector while it feeds batches; it is on again after, even when
    a malformed line stops the check."""
    records = [dict(r) for r in stream[0]]
    assert gc.isenabled()
    assert check_trace(write(tmp_path, records), "vllm-events").exit_code == 0 and gc.isenabled()
    records[len(records) // 2] = {"seq": records[len(records) // 2]["seq"], "ts": 1.0, "events": [{"type": 5}]}
    result = check_trace(write(tmp_path, records), "vllm-events")
    assert result.exit_code == 2 and gc.isenabled(), result.error
