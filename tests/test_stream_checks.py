"""The stream checks of spec/stream.py on a recorded live run, and each one shown to bite.

tests/data/vllm_live_cpu.jsonl was recorded from the kit's tiny vLLM 0.32 CPU server (30 exact-mode
requests, a shared-prefix burst and a pressure burst that preempted): every invariant holds on it
as recorded. Each test corrupts one thing - an event removed, duplicated or reordered, a sequence
gap, a wrong cached_tokens, a BlockRemoved of an in-flight block, a non-zero idle usage - and
asserts the invariant that names it. No vLLM needed.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvspec.adapters.vllm_live.hashing import BlockHasher
from kvspec.adapters.vllm_live.recorded import check_recorded, load_log
from kvspec.spec.stream import (
    STREAM_INVARIANT_NAMES,
    MetricSnapshot,
    RequestRecord,
    StreamCheck,
    StreamResult,
    check_stream,
)
from kvspec.stateful_tests.live import stream_rows

LOG = Path(__file__).parent / "data" / "vllm_live_cpu.jsonl"
BS = 32

Records = list[dict[str, Any]]


@pytest.fixture(scope="module")
def recorded() -> Records:
    return load_log(LOG)


@pytest.fixture
def records(recorded: Records) -> Records:
    return copy.deepcopy(recorded)


def batches(records: Records) -> Iterator[tuple[int, dict[str, Any]]]:
    return ((i, r) for i, r in enumerate(records) if "seq" in r and "events" in r)


def requests(records: Records, mode: str) -> list[dict[str, Any]]:
    return [r["request"] for r in records if "request" in r and r["request"].get("mode") == mode]


def rows_of(result: StreamResult) -> list[dict[str, Any]]:
    """The result's rows as a report writes them."""
    return [row.to_json() for row in stream_rows(result)]


def assert_violated(result: StreamResult, name: str) -> None:
    assert name in result.violated, (name, result.violated, result.violations[:3])
    row = next(r for r in rows_of(result) if r["name"] == name)
    assert row["verdict"] == "violated" and row["first_violation"]["problems"]


def test_the_recorded_run_holds_every_invariant_and_exercises_each(records: Records) -> None:
    result = check_recorded(records)
    assert result.held, result.violations[:3]
    verdicts = {r["name"]: (r["verdict"], r["checked_steps"]) for r in rows_of(result)}
    assert set(verdicts) == set(STREAM_INVARIANT_NAMES)
    assert all(v == "held" and n > 0 for v, n in verdicts.values()), verdicts
    assert result.seen["removed"] > 0 and result.seen["cleared"] > 0  # evictions and resets were seen


def test_the_recorder_hash_recipe_matches_the_published_hashes(records: Records) -> None:
    first = next(e for _, b in batches(records) for e in b["events"] if e["type"] == "BlockStored")
    assert first["parent_block_hash"] is None
    assert BlockHasher(BS).published(first["token_ids"][:BS]) == first["block_hashes"][0]


def test_a_removed_store_event_is_a_removal_of_an_uncached_hash(records: Records) -> None:
    removed = {
        h for _, b in batches(records) for e in b["events"] if e["type"] == "BlockRemoved" for h in e["block_hashes"]
    }
    for _, batch in batches(records):
        for event in batch["events"]:
            if event["type"] == "BlockStored" and set(event["block_hashes"]) & removed:
                batch["events"].remove(event)
                assert_violated(check_recorded(records), "removed_was_cached")
                return
    pytest.fail("the log has no stored block that was later removed")


def test_a_duplicated_store_event_is_a_second_store_of_a_cached_hash(records: Records) -> None:
    _, batch = next((i, b) for i, b in batches(records) if any(e["type"] == "BlockStored" for e in b["events"]))
    event = next(e for e in batch["events"] if e["type"] == "BlockStored")
    batch["events"].insert(batch["events"].index(event) + 1, copy.deepcopy(event))
    assert_violated(check_recorded(records), "stored_once")


def test_reordered_batches_break_the_sequence(records: Records) -> None:
    (i, _), (j, _) = list(batches(records))[10:12]
    records[i], records[j] = records[j], records[i]
    assert_violated(check_recorded(records), "event_sequence_contiguous")


def test_a_removal_before_its_store_is_a_removal_of_an_uncached_hash(records: Records) -> None:
    for _, batch in batches(records):
        events = batch["events"]
        stored = next((e for e in events if e["type"] == "BlockStored"), None)
        if stored is not None:
            events.insert(events.index(stored), {"type": "BlockRemoved", "block_hashes": stored["block_hashes"][:1]})
            break
    assert_violated(check_recorded(records), "removed_was_cached")


def test_a_sequence_gap_is_reported(records: Records) -> None:
    for n, (_, batch) in enumerate(batches(records)):
        if n >= 20:
            batch["seq"] += 1  # batch 20 never arrived (and replay could not fill it)
    result = check_recorded(records)
    assert result.violated == ["event_sequence_contiguous"], result.violations[:3]


def test_a_wrong_cached_tokens_in_exact_mode_is_not_the_prediction(records: Records) -> None:
    request = next(r for r in requests(records, "exact") if r["cached_tokens"])
    request["cached_tokens"] -= BS
    assert_violated(check_recorded(records), "predicted_cached_tokens")


def test_a_cached_tokens_beyond_what_was_ever_cached_is_out_of_bounds(records: Records) -> None:
    request = requests(records, "load")[-1]
    request["cached_tokens"] = BS * ((len(request["prompt_token_ids"]) - 1) // BS)
    assert_violated(check_recorded(records), "cached_tokens_within_bounds")


def test_removing_a_block_that_an_in_flight_request_hit_is_reported(records: Records) -> None:
    hasher = BlockHasher(BS)
    for request in requests(records, "exact"):
        if not request["cached_tokens"]:
            continue
        inside = [b for _, b in batches(records) if request["started"] < b["ts"] < request["finished"]]
        if inside:
            held = hasher.published(request["prompt_token_ids"][:BS])
            inside[0]["events"].append({"type": "BlockRemoved", "block_hashes": [held]})
            result = check_recorded(records)
            assert_violated(result, "in_flight_not_removed")
            return
    pytest.fail("no exact request with a hit has a batch inside its window")


def test_a_non_zero_usage_at_idle_is_reported(records: Records) -> None:
    snapshot = next(r["metrics"] for r in records if "metrics" in r and r["metrics"]["idle"])
    snapshot["kv_cache_usage_perc"] = 0.25
    assert check_recorded(records).violated == ["idle_usage_zero"]


def test_a_token_that_does_not_hash_to_the_published_hash_breaks_the_chain(records: Records) -> None:
    _, batch = next((i, b) for i, b in batches(records) if any(e["type"] == "BlockStored" for e in b["events"]))
    event = next(e for e in batch["events"] if e["type"] == "BlockStored")
    event["token_ids"][0] = event["token_ids"][0] + 1
    assert_violated(check_recorded(records), "hash_chain_agrees")


def test_more_cached_blocks_than_the_pool_holds_is_reported(records: Records) -> None:
    config = next(r["config"] for r in records if "config" in r)
    config["num_gpu_blocks"] = 9  # the log caches far more than 8 blocks at once
    assert_violated(check_recorded(records), "cached_within_pool")


def test_without_a_block_size_the_log_cannot_be_checked() -> None:
    with pytest.raises(ValueError, match="block size"):
        check_recorded([{"request": {"id": "a", "prompt_token_ids": [5], "started": 0.0, "finished": 1.0}}])


def test_a_gap_the_subscriber_could_not_fill_is_reported(records: Records) -> None:
    records.append({"gap": {"from": 3, "to": 5}})
    result = check_recorded(records)
    assert result.violated == ["event_sequence_contiguous"]
    assert result.first_violation["event_sequence_contiguous"]["gap"] == [3, 5]


def joined_at(records: Records, seq: int, initial_cache: str) -> Records:
    """The log as a subscriber that joined at batch ``seq`` would have recorded it."""
    joined = next(b["ts"] for _, b in batches(records) if b["seq"] == seq)

    def seen(r: dict[str, Any]) -> bool:
        body = r.get("request") or r.get("reset") or r.get("metrics") or r
        when = body.get("ts", body.get("started"))
        return when is None or when >= joined

    late = copy.deepcopy([r for r in records if seen(r)])
    next(r["config"] for r in late if "config" in r)["initial_cache"] = initial_cache
    return late


def test_a_stream_joined_late_is_judged_only_where_the_index_is_known(records: Records) -> None:
    claimed_wrongly = 0
    for seq in range(5, 100, 5):
        result = check_recorded(joined_at(records, seq, "unknown"))
        assert result.held, (seq, result.violations[:3])
        claimed_wrongly += bool(check_recorded(joined_at(records, seq, "empty")).violated)
    assert claimed_wrongly > 0  # claiming a known start where blocks were cached unseen does get caught


def test_without_an_event_stream_only_the_gauges_are_judged(records: Records) -> None:
    blind = [r for r in records if not ("seq" in r and "events" in r)]
    next(r["config"] for r in blind if "config" in r)["events"] = None
    result = check_recorded(blind)
    verdicts = {r["name"]: r["verdict"] for r in rows_of(result)}
    assert verdicts.pop("idle_usage_zero") == "held"
    assert set(verdicts.values()) == {"unknown"}, verdicts


# -- in_flight_not_removed for requests that are not alone: a delayed reply is no evidence ---------------
#
# A request's window is the client's: from sending it to reading its reply. On loaded cores the reply
# reaches the client well after the server finished the request and freed its blocks, which a sibling of
# the burst may then evict. These streams are built by hand (block size 4, no hash recipe): request A
# stores blocks 0-2 of its chain (hashes 100-102) and its sibling B keeps the window from being alone.

SMALL = 4
A = RequestRecord("A", tuple(range(1, 10)), tuple(range(10, 17)), 0, started=1.0, finished=20.0)
B = RequestRecord("B", tuple(range(50, 59)), (59, 60, 61), 0, started=1.5, finished=19.0)
QUIET = [MetricSnapshot(0.5, idle=True, usage=0.0, preemptions=0.0), MetricSnapshot(21.0, True, 0.0, 0.0)]


def store(hashes: list[int], parent: int | None, tokens: range | tuple[int, ...]) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": list(tokens)}


def remove(*hashes: int) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": list(hashes)}


def delayed_batches(after_removal: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A stores blocks 0-2 of its chain and, as far as the stream shows, finishes on the server (its last
    whole block, ending on its final sampled token, is never stored); B then evicts A's blocks, last
    block first, while A's reply is still on its way; then ``after_removal``."""
    return [
        {"seq": 0, "ts": 2.0, "events": [store([100, 101], None, range(1, 9))]},
        {"seq": 1, "ts": 3.0, "events": [store([200, 201], None, range(50, 58))]},
        {"seq": 2, "ts": 4.0, "events": [store([102], 101, range(9, 13))]},
        {"seq": 3, "ts": 6.0, "events": [remove(102, 101)]},
        {"seq": 4, "ts": 7.0, "events": after_removal},
    ]


def delayed_reply(after_removal: list[dict[str, Any]]) -> StreamResult:
    return check_stream(delayed_batches(after_removal), [A, B], QUIET, block_size=SMALL)


def test_a_block_evicted_after_the_server_could_have_finished_the_request_is_no_violation() -> None:
    check = StreamCheck([A, B], QUIET, block_size=SMALL)
    for batch in delayed_batches([store([202], 201, range(58, 62))]):
        check.batch(batch)
    assert all(check.ledger.node(key) for key in (101, 102))  # kept while A's suspicion may still be proven
    result = check.close()
    assert not any(key in check.ledger.blocks for key in (101, 102))  # then forgotten with A's reply
    assert result.held, result.violations
    assert result.checked["in_flight_not_removed"] > 0  # it was judged, and held
    assert result.seen["in_flight_not_removed unproven"] == 2  # both removals stayed suspicions


def test_on_the_recorded_burst_an_eviction_while_a_reply_is_in_transit_is_no_violation(records: Records) -> None:
    """The CI flake on real events: a shared-prefix burst request (not preempted) stored its last block;
    its eviction, recorded two seconds later in the pressure burst, is moved to the next steps, before
    the client read the reply. Nothing in the stream says the request was still running then."""
    request = next(r for r in requests(records, "load") if r["cached_tokens"] == 0)
    tokens = request["prompt_token_ids"] + request["output_token_ids"]
    last = BlockHasher(BS).published(tokens[: (len(tokens) // BS) * BS])
    stored_at = next(i for i, b in batches(records) for e in b["events"] if last in e.get("block_hashes", ()))
    removal = next(
        e
        for i, b in batches(records)
        if i > stored_at
        for e in b["events"]
        if e["type"] == "BlockRemoved" and last in e["block_hashes"]
    )
    removal["block_hashes"].remove(last)
    inside = [b for i, b in batches(records) if i > stored_at and b["ts"] < request["finished"]]
    assert inside, "no batch between the request's last store and its reply"
    inside[-1]["events"].append({"type": "BlockRemoved", "block_hashes": [last]})
    result = check_recorded(records)
    assert result.held, result.violations[:3]
    assert result.seen["in_flight_not_removed unproven"] == 1


# Recorded on the tiny vLLM 0.32 CPU server (``kvspec serve-tiny``'s model, 63 blocks): the CI flake made
# to happen. A burst of 16 prompts of 200 random tokens, 24 generated each, two at a time
# (``complete_many(prompts, 24, concurrency=2)``), the client holding request load-1's reply 4 s before
# reading it (``post_json`` wrapped to sleep). No preemption; the other worker's requests fill the pool and
# evict load-1's blocks inside its window. The code before reported "request load-1 (in flight, not
# preempted) lost the last cached copy of [...]".
DELAYED = Path(__file__).parent / "data" / "vllm_live_delayed_reply.jsonl"


def slow_request(records: Records) -> tuple[list[int], list[dict[str, Any]]]:
    """load-1's tokens, and the batches inside its window that evict blocks of its chain."""
    slow = next(r["request"] for r in records if r.get("request", {}).get("id") == "load-1")
    tokens = slow["prompt_token_ids"] + slow["output_token_ids"]
    hasher = BlockHasher(BS)
    chain = {hasher.published(tokens[: (j + 1) * BS]) for j in range(len(tokens) // BS)}
    evicted = [
        b
        for _, b in batches(records)
        if slow["started"] < b["ts"] < slow["finished"]
        and any(e["type"] == "BlockRemoved" and chain & set(e["block_hashes"]) for e in b["events"])
    ]
    assert evicted  # the log holds the scenario: load-1's blocks went while its reply was on its way
    return tokens, evicted


def test_on_a_real_server_a_reply_read_late_while_siblings_evict_its_blocks_is_no_violation() -> None:
    records = load_log(DELAYED)
    slow_request(records)
    result = check_recorded(records)
    assert result.held, result.violations[:3]
    assert result.checked["in_flight_not_removed"] > 0 and result.seen["in_flight_not_removed unproven"] > 0


def test_on_a_real_server_an_eviction_while_the_request_still_decodes_is_reported() -> None:
    """Seeded: the same stream from an engine that evicted load-1's blocks while it was still decoding:
    after the evictions load-1 stores its next block (its real hash; the last whole block, which ends on
    its final sampled token, is one vLLM never stores: it is not in the log)."""
    records = load_log(DELAYED)
    tokens, evicted = slow_request(records)
    hasher, last = BlockHasher(BS), len(tokens) // BS - 1
    key = hasher.published(tokens[: (last + 1) * BS])
    assert not any(key in e.get("block_hashes", ()) for _, b in batches(records) for e in b["events"])
    store = {"block_hashes": [key], "parent_block_hash": hasher.published(tokens[: last * BS])}
    store |= {"type": "BlockStored", "token_ids": tokens[last * BS :][:BS], "block_size": BS}
    evicted[-1]["events"].append(store)
    assert_violated(check_recorded(records), "in_flight_not_removed")


def test_a_later_store_of_the_requests_own_chain_proves_it_was_running_when_its_block_went() -> None:
    result = delayed_reply([store([103], 102, range(13, 17))])  # A's block 3: A was still computing
    assert result.violated == ["in_flight_not_removed"], result.violations
    problem = result.first_violation["in_flight_not_removed"]["problems"][0]
    assert "request A" in problem and "102" in problem and "block 3" in problem, problem
    assert result.first_violation["in_flight_not_removed"]["batch"] == 4  # the batch that proves it


def test_the_trace_check_places_a_proven_loss_on_the_line_of_the_proving_store(tmp_path: Path) -> None:
    from kvspec.traces import check_trace

    def request(q: RequestRecord) -> dict[str, Any]:
        return {
            "id": q.id,
            "prompt_token_ids": list(q.prompt),
            "output_token_ids": list(q.output or ()),
            "cached_tokens": q.cached_tokens,
            "started": q.started,
            "finished": q.finished,
            "mode": "load",
        }

    lines = [
        {"config": {"block_size": SMALL, "hashes_recomputable": False, "initial_cache": "empty"}},
        *(
            {"metrics": {"ts": m.ts, "idle": True, "kv_cache_usage_perc": 0.0, "num_preemptions_total": 0.0}}
            for m in QUIET
        ),
        *delayed_batches([store([103], 102, range(13, 17))]),
        {"request": request(A)},
        {"request": request(B)},
    ]
    path = tmp_path / "delayed.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = check_trace(path, "vllm-events")
    assert result.exit_code == 1 and result.violation is not None, (result.error, result.checked)
    assert result.violation.invariant == "in_flight_not_removed"
    assert lines[result.violation.line - 1].get("seq") == 4  # the store that proves A was running


def test_a_later_store_that_a_sibling_may_have_made_is_no_proof() -> None:
    # C shares A's whole chain: the later store of block 3 may be C's, so A may have finished.
    c = RequestRecord("C", A.prompt, A.output, 2 * SMALL, started=5.0, finished=18.0)
    batches = [
        {"seq": 0, "ts": 2.0, "events": [store([100, 101], None, range(1, 9))]},
        {"seq": 1, "ts": 3.0, "events": [store([102], 101, range(9, 13))]},
        {"seq": 2, "ts": 4.5, "events": [remove(102)]},
        {"seq": 3, "ts": 6.0, "events": [store([103], 102, range(13, 17))]},
    ]
    result = check_stream(batches, [A, B, c], QUIET, block_size=SMALL)
    assert "in_flight_not_removed" not in result.violated, result.violations


def test_a_request_that_runs_alone_is_judged_at_the_removal() -> None:
    # Alone, nothing else runs on the server to evict its blocks before its reply: no proof is waited for.
    batches = [
        {"seq": 0, "ts": 2.0, "events": [store([100, 101], None, range(1, 9))]},
        {"seq": 1, "ts": 6.0, "events": [remove(101)]},
    ]
    result = check_stream(batches, [A], QUIET, block_size=SMALL)
    assert result.violated == ["in_flight_not_removed"], result.violations
    assert result.first_violation["in_flight_not_removed"]["batch"] == 1


# -- where vLLM is missing, a live check says it could not run (exit 2), never "passed" --------------


@pytest.fixture
def no_vllm() -> None:
    from kvspec.adapters.vllm_live.server import server_missing as vllm_missing

    if vllm_missing() is None:
        pytest.skip("vLLM is installed here: tests/test_vllm_live.py runs the live adapter for real")


@pytest.mark.usefixtures("no_vllm")
def test_kvspec_check_of_the_live_adapter_without_vllm_cannot_run(tmp_path: Path) -> None:
    import json

    from kvspec.cli import main

    report = tmp_path / "report.json"
    assert main(["check", "--adapter", "vllm-live", "--quiet", "--report", str(report)]) == 2
    data = json.loads(report.read_text())
    assert data["status"] == "error" and "vllm is not installed" in data["error"]
    assert {r["verdict"] for r in data["invariants"]} == {"unknown"}


@pytest.mark.usefixtures("no_vllm")
def test_the_plugin_item_of_the_live_adapter_fails_when_it_cannot_run(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest("--kvspec-adapter=vllm-live")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*ERROR: the check could not run: the server did not come up*"])
