"""`kvspec trace check` on good and corrupted logs of each format, and `kvspec trace record`.

Every corruption is a small edit of a good log (a line removed, repeated, moved,
a field changed) and must be reported by the invariant it breaks, by name; a
malformed line must end the check with exit code 2 and its line number.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvspec.cli import main
from kvspec.report import REPORT_KEYS
from kvspec.spec import INVARIANTS as SPEC_INVARIANTS
from kvspec.spec.invariants import VIEW_INVARIANTS
from kvspec.traces import check_trace
from kvspec.traces.codec import decode, encode, observation_from_json, observation_to_json

DATA = Path(__file__).parent / "data" / "traces"
RADIX_NAMES = {inv.name for inv in VIEW_INVARIANTS}  # a radix tree's and a hybrid cache's view
KVSPEC_GOOD = DATA / "reference_kvspec.jsonl"
SIDE_GOOD = DATA / "reference_side_table.jsonl"
SHARED_AWARE = DATA / "shared_aware_side_table.jsonl"
VLLM_SIDE = DATA / "vllm_inprocess_side_table.jsonl"  # derived from vLLM 0.32's own KVCacheManager
VLLM_GOOD = Path(__file__).parent / "data" / "vllm_live_cpu.jsonl"  # recorded by the live adapter

Lines = list[dict[str, Any]]


def load(path: Path) -> Lines:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write(tmp_path: Path, lines: Lines, name: str = "trace.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def run(tmp_path: Path, path: Path, fmt: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any], str]:
    """Run the CLI handler; return the exit code, the JSON report and stderr."""
    report = tmp_path / "report.json"
    code = main(["trace", "check", str(path), "--format", fmt, "--report", str(report)])
    err = capsys.readouterr().err
    return code, json.loads(report.read_text()), err


def verdicts(report: dict[str, Any]) -> dict[str, str]:
    return {row["name"]: row["verdict"] for row in report["invariants"]}


def assert_passed(code: int, report: dict[str, Any]) -> None:
    assert code == 0, report["trace"]
    assert report["status"] == "passed"
    for row in report["invariants"]:
        assert row["verdict"] in ("held", "unknown"), row
        if row["verdict"] == "unknown":
            assert row["reason"], row
        else:
            assert row["checked_steps"] > 0


def assert_violated(code: int, report: dict[str, Any], invariant: str, *, first: bool = True) -> None:
    """``invariant`` is violated, and (``first``) is the violation the check reports first."""
    assert code == 1, report["trace"]
    assert report["status"] == "violated"
    if first:
        assert report["trace"]["violated"] == invariant, report["trace"]
    row = next(r for r in report["invariants"] if r["name"] == invariant)
    assert row["verdict"] == "violated" and row["first_violation"]["problems"]


# -- kvspec's own trace ------------------------------------------------------------------------


def test_kvspec_good_trace_holds_every_invariant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report, _ = run(tmp_path, KVSPEC_GOOD, "kvspec", capsys)
    assert_passed(code, report)
    held = {name for name, verdict in verdicts(report).items() if verdict == "held"}
    # The recorded pool is exercised enough that every safety and refinement check of the spec ran.
    assert {inv.name for inv in SPEC_INVARIANTS if inv.kind in ("safety", "refinement")} - RADIX_NAMES <= held
    assert report["adapter"] == "reference" and report["steps"] == len(load(KVSPEC_GOOD)) - 1
    assert report["coverage"]["evict"] > 0 and report["coverage"]["reclaim"] > 0


def _steps(lines: Lines) -> list[tuple[int, dict[str, Any]]]:
    return list(enumerate(lines))[1:]


def _renumber(lines: Lines) -> Lines:
    for i, line in enumerate(lines[1:]):
        line["step"] = i
    return lines


def _before(lines: Lines, i: int) -> dict[str, Any]:
    return lines[i - 1]["observation"] if i > 1 else lines[0]["observation"]


def remove_step(lines: Lines) -> Lines:
    del lines[5]
    return lines


def duplicate_step(lines: Lines) -> Lines:
    lines.insert(6, copy.deepcopy(lines[5]))
    return lines


def swap_steps(lines: Lines) -> Lines:
    lines[5], lines[6] = lines[6], lines[5]
    return lines


def remove_release_and_renumber(lines: Lines) -> Lines:
    """Lose a release and hide the gap: the next step's ledger shows the request gone under another op."""
    for i, line in _steps(lines[:-1]):
        nxt = lines[i + 1]
        if (
            line["op"]["op"] == "release"
            and nxt["outcome"]["status"] == "ok"
            and nxt["op"].get("req") != line["op"]["req"]
            and nxt["op"]["op"] != "reset_cache"
        ):
            del lines[i]
            return _renumber(lines)
    raise AssertionError("the good trace has no release followed by an unrelated ok step")


def negative_ref_count(lines: Lines) -> Lines:
    for _, line in _steps(lines):
        held = [o for o in line["observation"]["objects"] if o["ref_count"] > 0]
        if line["outcome"]["status"] == "ok" and held:
            held[0]["ref_count"] = -1
            return lines
    raise AssertionError("no referenced block in the good trace")


def evict_referenced_block(lines: Lines) -> Lines:
    """An admission that reports evicting a block another running request reads."""
    for i, line in _steps(lines):
        before = _before(lines, i)
        others = [r for r in before["requests"] if r["objects"] and r["req"] != line["op"].get("req")]
        if line["op"]["op"] == "admit" and line["outcome"]["status"] == "ok" and others:
            oid = others[0]["objects"][0]
            key = next(o["key"] for o in before["objects"] if o["oid"] == oid)
            line["events"].append({"kind": "evict", "oid": oid, "key": key})
            return lines
    raise AssertionError("no admission next to a running request in the good trace")


def evict_out_of_order(lines: Lines) -> Lines:
    """Report another unreferenced cached block as the one evicted than the free queue's head."""
    for i, line in _steps(lines):
        evicts = [e for e in line["events"] if e["kind"] == "evict"]
        if len(evicts) != 1:
            continue
        mine = {oid for r in line["observation"]["requests"] for oid in r["objects"]}
        others = [
            o
            for o in _before(lines, i)["objects"]
            if o["ref_count"] == 0 and o["key"] is not None and o["oid"] != evicts[0]["oid"] and o["oid"] not in mine
        ]
        if others:
            evicts[0]["oid"], evicts[0]["key"] = others[0]["oid"], others[0]["key"]
            return lines
    raise AssertionError("no eviction with a choice in the good trace")


def wrong_hit_count(lines: Lines) -> Lines:
    for _, line in _steps(lines):
        if line["op"]["op"] == "admit" and (line["outcome"]["hit_tokens"] or 0) > 0:
            line["outcome"]["hit_tokens"] += lines[0]["config"]["block_size"]
            return lines
    raise AssertionError("no prefix hit in the good trace")


KVSPEC_CORRUPTIONS: list[tuple[Callable[[Lines], Lines], str]] = [
    (remove_step, "trace_order"),
    (duplicate_step, "trace_order"),
    (swap_steps, "trace_order"),
    (remove_release_and_renumber, "no_active_eviction"),
    (negative_ref_count, "non_negative_ref_counts"),
    (evict_referenced_block, "no_active_eviction"),
    (evict_out_of_order, "predicted_eviction"),
    (wrong_hit_count, "predicted_prefix_hits"),
]


@pytest.mark.parametrize(("corrupt", "invariant"), KVSPEC_CORRUPTIONS, ids=[c.__name__ for c, _ in KVSPEC_CORRUPTIONS])
def test_kvspec_corrupted_trace_names_the_broken_invariant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], corrupt: Callable[[Lines], Lines], invariant: str
) -> None:
    path = write(tmp_path, corrupt(load(KVSPEC_GOOD)))
    code, report, _ = run(tmp_path, path, "kvspec", capsys)
    assert_violated(code, report, invariant)


def test_kvspec_violation_shows_line_event_and_context(tmp_path: Path) -> None:
    lines = wrong_hit_count(load(KVSPEC_GOOD))
    result = check_trace(write(tmp_path, lines), "kvspec", context=2)
    v = result.violation
    assert v is not None and v.invariant == "predicted_prefix_hits"
    assert v.event == lines[v.line - 1]  # no blank lines: line n is lines[n - 1]
    assert [n for n, _ in v.context] == [v.line - 2, v.line - 1]
    table = result.report().table()
    assert f"VIOLATED predicted_prefix_hits at line {v.line}" in table and "FAILED" in table


def test_kvspec_trace_without_observations(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Only ops and outcomes: the refinement checks that need no ledger still run; the rest say why not."""
    lines = load(KVSPEC_GOOD)
    for line in lines:
        line.pop("observation", None)
    code, report, _ = run(tmp_path, write(tmp_path, lines), "kvspec", capsys)
    assert_passed(code, report)
    rows = {row["name"]: row for row in report["invariants"]}
    assert rows["predicted_prefix_hits"]["verdict"] == "held"
    assert rows["no_active_eviction"]["verdict"] == "unknown"
    assert "no observation" in rows["no_active_eviction"]["reason"]
    code, report, _ = run(tmp_path, write(tmp_path, wrong_hit_count(lines), "bad.jsonl"), "kvspec", capsys)
    assert_violated(code, report, "predicted_prefix_hits")


@pytest.mark.parametrize("adapter", ["reference", "lifecycle-sim", "scheduler-sim"])
def test_recorded_traces_of_each_adapter_hold(tmp_path: Path, capsys: pytest.CaptureFixture[str], adapter: str) -> None:
    out = tmp_path / f"{adapter}.jsonl"
    assert main(["trace", "record", "--adapter", adapter, "--out", str(out), "--seed", "7", "--steps", "60"]) == 0
    code, report, _ = run(tmp_path, out, "auto", capsys)
    assert_passed(code, report)
    assert report["trace"]["format"] == "kvspec" and report["steps"] == 60


def test_record_from_a_case_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ops = [
        {"op": "admit", "req": "a", "tokens": [1, 2, 3, 4, 5]},
        {"op": "release", "req": "a"},
        {"op": "admit", "req": "b", "tokens": [1, 2, 3, 4, 9]},
    ]
    case = tmp_path / "case.json"
    case.write_text(json.dumps({"kvspec_case": 1, "config": {"capacity": 4, "block_size": 2}, "ops": ops}))
    out = tmp_path / "case.jsonl"
    assert main(["trace", "record", "--ops", str(case), "--out", str(out)]) == 0
    lines = load(out)
    assert lines[0]["config"]["capacity"] == 4 and [line["op"] for line in lines[1:]] == [
        {**op, "keep": True} if op["op"] == "release" else op for op in ops
    ]
    assert lines[3]["outcome"]["hit_tokens"] == 4  # b reuses a's two full blocks
    code, report, _ = run(tmp_path, out, "kvspec", capsys)
    assert_passed(code, report)


def test_codec_round_trips_oids_keys_and_observations() -> None:
    from kvspec.spec import Config, Op, Semantics
    from kvspec.spec.ledger import LedgerModel

    for value in (None, 3, "x", b"\x00\xff", (1, (2, 3)), 1.5, True):
        assert decode(json.loads(json.dumps(encode(value)))) == value
    model = LedgerModel(Config(capacity=6, block_size=2), Semantics())
    model.step(Op("admit", "r", (1, 2, 3, 4, 5)))
    obs = model.observe()
    assert observation_from_json(json.loads(json.dumps(observation_to_json(obs)))) == obs


# -- the side table ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", [SIDE_GOOD, VLLM_SIDE, SHARED_AWARE], ids=["reference-lru", "vllm-lru", "hand-written-shared-aware"]
)
def test_side_table_good_log_holds(tmp_path: Path, capsys: pytest.CaptureFixture[str], path: Path) -> None:
    code, report, _ = run(tmp_path, path, "side-table", capsys)
    assert_passed(code, report)
    v = verdicts(report)
    assert v["policy_conformance"] == "held" and v["no_active_eviction"] == "held"
    assert all(verdict == "held" for verdict in v.values())


def _find(lines: Lines, **fields: Any) -> int:
    return next(i for i, line in enumerate(lines) if all(line.get(k) == v for k, v in fields.items()))


def _strip_order(lines: Lines) -> Lines:
    for line in lines:
        line.pop("seq", None)
        line.pop("ts", None)
    return lines


def side_remove_line(lines: Lines) -> Lines:
    del lines[_find(lines, event="ref_count_changed")]
    return lines


def side_remove_line_renumbered(lines: Lines) -> Lines:
    """Lose block 0's release (seq 9) and renumber: its next touch finds one reference more than recorded."""
    del lines[_find(lines, seq=9)]
    for i, line in enumerate(lines[1:], start=1):
        line["seq"] = i
    return lines


def side_duplicate_line(lines: Lines) -> Lines:
    at = _find(lines, event="block_allocated")
    lines.insert(at + 1, copy.deepcopy(lines[at]))
    return lines


def side_duplicate_line_unnumbered(lines: Lines) -> Lines:
    return side_duplicate_line(_strip_order(lines))


def side_swap_lines(lines: Lines) -> Lines:
    at = _find(lines, event="block_sealed")
    lines[at - 1], lines[at] = lines[at], lines[at - 1]
    return lines


def side_swap_lines_unnumbered(lines: Lines) -> Lines:
    """Seal block 2 before it is allocated: without seq/ts the state machine catches it."""
    lines = _strip_order(lines)
    at = _find(lines, event="block_sealed", block_id=2)
    alloc = max(i for i in range(at) if lines[i].get("event") == "block_allocated" and lines[i]["block_id"] == 2)
    lines[alloc], lines[at] = lines[at], lines[alloc]
    return lines


def side_negative_ref_count(lines: Lines) -> Lines:
    at = _find(lines, event="ref_count_changed")
    lines[at]["delta"], lines[at]["ref_count"] = -2, -1
    return lines


def side_evict_referenced(lines: Lines) -> Lines:
    """Block 0 is evicted while r2 holds it (between its touch and r2's release)."""
    at = _find(lines, event="block_touched")
    lines.insert(at + 1, {"event": "block_evicted", "block_id": 0, "block_hash": "h1", "reason": "evict"})
    return _strip_order(lines)


def side_evict_out_of_order(lines: Lines) -> Lines:
    """shared_aware evicts the lowest retain score (block 2, 0.6) first; this log evicts block 1 (0.7) first."""
    first, second = _find(lines, event="block_evicted", block_id=2), _find(lines, event="block_evicted", block_id=1)
    for i, (block, h, score) in ((first, (1, "h2", 0.7)), (second, (2, "h3", 0.6))):
        lines[i].update(block_id=block, block_hash=h, retain_score=score)
    lines[first + 1]["block_id"], lines[second + 1]["block_id"] = 1, 2
    sealed = _find(lines, event="block_sealed", block_hash="h5")
    lines[sealed]["block_id"] = 1
    return lines


def side_wrong_hit_count(lines: Lines) -> Lines:
    at = _find(lines, event="block_touched")
    lines[at]["hit_count"] += 1
    return lines


def side_wrong_hit_tokens(lines: Lines) -> Lines:
    at = next(i for i, line in enumerate(lines) if line.get("event") == "prefix_lookup" and line["hit_blocks"])
    lines[at]["hit_tokens"] += 2
    return lines


def side_hit_on_uncached_block(lines: Lines) -> Lines:
    at = next(i for i, line in enumerate(lines) if line.get("event") == "prefix_lookup" and line["hit_blocks"])
    lines[at]["hit_blocks"] = [3]
    return lines


def side_duplicate_hash(lines: Lines) -> Lines:
    at = _find(lines, event="block_sealed", block_hash="h3")
    lines[at]["block_hash"] = "h1"
    return lines


def side_rank_referenced_block(lines: Lines) -> Lines:
    """Rank block 3, which r3 has just allocated, among the eviction candidates."""
    at = _find(lines, event="eviction_candidates_ranked")
    lines[at]["candidates"].append({"block_id": 3, "retain_score": 9.0})
    return lines


def side_block_outside_pool(lines: Lines) -> Lines:
    """r2 gets block 7 instead of block 3: when r3 later takes block 3, a fifth block id shows in a pool of 4."""
    for line in lines:
        if line.get("block_id") == 3 and line.get("seq", 99) <= 17:
            line["block_id"] = 7
    return lines


SIDE_CORRUPTIONS: list[tuple[Callable[[Lines], Lines], str]] = [
    (side_remove_line, "trace_order"),
    (side_remove_line_renumbered, "non_negative_ref_counts"),
    (side_duplicate_line, "trace_order"),
    (side_duplicate_line_unnumbered, "allocated_once_within_pool"),
    (side_swap_lines, "trace_order"),
    (side_swap_lines_unnumbered, "lifecycle_transitions"),
    (side_negative_ref_count, "non_negative_ref_counts"),
    (side_evict_referenced, "no_active_eviction"),
    (side_evict_out_of_order, "policy_conformance"),
    (side_wrong_hit_count, "hit_count_consistency"),
    (side_wrong_hit_tokens, "predicted_prefix_hits"),
    (side_hit_on_uncached_block, "cache_index_consistency"),
    (side_duplicate_hash, "share_without_duplication"),
    (side_rank_referenced_block, "candidates_unreferenced"),
    (side_block_outside_pool, "allocated_once_within_pool"),
]


@pytest.mark.parametrize(("corrupt", "invariant"), SIDE_CORRUPTIONS, ids=[c.__name__ for c, _ in SIDE_CORRUPTIONS])
def test_side_table_corrupted_log_names_the_broken_invariant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], corrupt: Callable[[Lines], Lines], invariant: str
) -> None:
    path = write(tmp_path, corrupt(load(SHARED_AWARE)))
    code, report, _ = run(tmp_path, path, "side-table", capsys)
    assert_violated(code, report, invariant)


@pytest.mark.parametrize("path", [SIDE_GOOD, VLLM_SIDE], ids=["reference-lru", "vllm-lru"])
def test_side_table_recorded_lru_ranking_out_of_order(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], path: Path
) -> None:
    """In a recorded LRU log, reversing a ranking of two or more candidates makes its eviction out of order."""
    lines = load(path)
    at = next(
        i
        for i, line in enumerate(lines)
        if line.get("event") == "eviction_candidates_ranked" and len(line["candidates"]) > 1
    )
    lines[at]["candidates"].reverse()
    code, report, _ = run(tmp_path, write(tmp_path, lines), "side-table", capsys)
    assert_violated(code, report, "policy_conformance")


def test_side_table_without_header_leaves_pool_checks_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = load(SHARED_AWARE)[1:]
    code, report, _ = run(tmp_path, write(tmp_path, lines), "side-table", capsys)
    assert_passed(code, report)
    rows = {row["name"]: row for row in report["invariants"]}
    assert rows["policy_conformance"]["verdict"] == "unknown" and "policy" in rows["policy_conformance"]["reason"]
    assert rows["lifecycle_transitions"]["verdict"] == "held"
    assert rows["candidates_unreferenced"]["verdict"] == "held"


def test_record_side_table_from_vllm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM's own KVCacheManager, driven in process: its derived side table holds every invariant."""
    pytest.importorskip("vllm", reason="recording from vLLM needs the vllm extra (docs/vllm.md)")
    out = tmp_path / "vllm.jsonl"
    argv = ["trace", "record", "--adapter", "vllm", "--format", "side-table", "--out", str(out), "--seed", "5"]
    assert main([*argv, "--capacity", "6", "--block-size", "2", "--steps", "40"]) == 0
    code, report, _ = run(tmp_path, out, "side-table", capsys)
    assert_passed(code, report)
    assert verdicts(report)["policy_conformance"] == "held"


def test_record_side_table_needs_block_granularity(tmp_path: Path) -> None:
    out = tmp_path / "s.jsonl"
    assert main(["trace", "record", "--adapter", "lifecycle-sim", "--format", "side-table", "--out", str(out)]) == 2
    assert main(["trace", "record", "--adapter", "reference", "--format", "side-table", "--out", str(out)]) == 0
    assert check_trace(out, "side-table").exit_code == 0


# -- vLLM KV cache events, as the live adapter records them ---------------------------------------


def test_vllm_events_good_log_holds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report, _ = run(tmp_path, VLLM_GOOD, "vllm-events", capsys)
    assert_passed(code, report)
    assert all(verdict == "held" for verdict in verdicts(report).values())
    assert report["adapter"] == "vllm-live" and report["coverage"]["removed"] > 0


def _batch_lines(lines: Lines) -> list[int]:
    return [i for i, line in enumerate(lines) if "seq" in line and "events" in line]


def _request(lines: Lines, rid: str) -> dict[str, Any]:
    return next(line["request"] for line in lines if line.get("request", {}).get("id") == rid)


def vllm_remove_batch(lines: Lines) -> Lines:
    del lines[_batch_lines(lines)[3]]
    return lines


def vllm_duplicate_batch(lines: Lines) -> Lines:
    at = _batch_lines(lines)[3]
    lines.insert(at + 1, copy.deepcopy(lines[at]))
    return lines


def vllm_swap_batches(lines: Lines) -> Lines:
    a, b = _batch_lines(lines)[3:5]
    lines[a], lines[b] = lines[b], lines[a]
    return lines


def vllm_wrong_cached_tokens(lines: Lines) -> Lines:
    """A request sent alone reports one block fewer from cache than the index held at its admission."""
    request = next(line["request"] for line in lines if line.get("request", {}).get("cached_tokens", 0) > 0)
    assert request["mode"] == "exact"
    request["cached_tokens"] -= next(line["config"]["block_size"] for line in lines if "config" in line)
    return lines


def vllm_remove_block_in_use(lines: Lines) -> Lines:
    """The first request's freshly stored block is removed while the request is still in flight."""
    at = _batch_lines(lines)[0]
    stored = next(e for e in lines[at]["events"] if e["type"] == "BlockStored")
    lines[at]["events"].append({"type": "BlockRemoved", "block_hashes": stored["block_hashes"][-1:], "medium": "GPU"})
    return lines


def vllm_remove_uncached_hash(lines: Lines) -> Lines:
    """A removal of a hash with no cached copy: the copy count would go below zero."""
    at = _batch_lines(lines)[1]
    lines[at]["events"].append({"type": "BlockRemoved", "block_hashes": [12345], "medium": "GPU"})
    return lines


def vllm_store_twice(lines: Lines) -> Lines:
    """The same block stored again out of nowhere, in the batch after it was first stored."""
    first, second = _batch_lines(lines)[0:2]
    stored = next(e for e in lines[first]["events"] if e["type"] == "BlockStored")
    again = {
        **stored,
        "block_hashes": stored["block_hashes"][:1],
        "token_ids": stored["token_ids"][: stored["block_size"]],
    }
    lines[second]["events"].append(again)
    return lines


# A lost or moved batch also changes what the requests around it could hit; which of the two the stream
# ledger meets first depends on the requests' times, so for those the name must be among the violated ones.
VLLM_CORRUPTIONS: list[tuple[Callable[[Lines], Lines], str]] = [
    (vllm_remove_batch, "event_sequence_contiguous"),
    (vllm_duplicate_batch, "event_sequence_contiguous"),
    (vllm_swap_batches, "event_sequence_contiguous"),
    (vllm_wrong_cached_tokens, "predicted_cached_tokens"),
    (vllm_remove_block_in_use, "in_flight_not_removed"),
    (vllm_remove_uncached_hash, "removed_was_cached"),
    (vllm_store_twice, "stored_once"),
]


@pytest.mark.parametrize(("corrupt", "invariant"), VLLM_CORRUPTIONS, ids=[c.__name__ for c, _ in VLLM_CORRUPTIONS])
def test_vllm_events_corrupted_log_names_the_broken_invariant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], corrupt: Callable[[Lines], Lines], invariant: str
) -> None:
    lines = corrupt(load(VLLM_GOOD))
    code, report, _ = run(tmp_path, write(tmp_path, lines), "vllm-events", capsys)
    assert_violated(code, report, invariant, first=invariant != "event_sequence_contiguous")
    # The reported line is the record the finding is about.
    line = lines[report["trace"]["violated_line"] - 1]
    assert "seq" in line or "request" in line or "metrics" in line


# -- what every format shares: unknown fields, malformed lines, unreadable files ---------------------


def _add_unknown_fields(lines: Lines) -> Lines:
    for line in lines:
        line["vendor_extension"] = {"engine": "x", "numbers": [1, 2]}
        for obj in line.get("observation", {}).get("objects", []):
            obj["vendor_extension"] = True
        for cand in line.get("candidates", []):
            cand["vendor_extension"] = "kept"
        for event in line.get("events", []):
            event["vendor_extension"] = 1
    return lines


@pytest.mark.parametrize(
    ("path", "fmt"), [(KVSPEC_GOOD, "kvspec"), (SIDE_GOOD, "side-table"), (VLLM_GOOD, "vllm-events")]
)
def test_unknown_fields_are_ignored(tmp_path: Path, capsys: pytest.CaptureFixture[str], path: Path, fmt: str) -> None:
    lines = _add_unknown_fields(load(path))
    if fmt == "vllm-events":
        lines.insert(2, {"note": "records of no known shape are notes, skipped"})
    code, report, _ = run(tmp_path, write(tmp_path, lines), fmt, capsys)
    assert_passed(code, report)


MALFORMED: list[tuple[Path, str, Callable[[list[str]], None]]] = [
    (KVSPEC_GOOD, "kvspec", lambda text: text.__setitem__(4, text[4][:-7])),
    (KVSPEC_GOOD, "kvspec", lambda text: text.__setitem__(4, json.dumps({"step": 3, "outcome": {"status": "ok"}}))),
    (KVSPEC_GOOD, "kvspec", lambda text: text.__setitem__(4, "[1, 2]")),
    (SIDE_GOOD, "side-table", lambda text: text.__setitem__(4, text[4].replace('"block_id"', '"blk"'))),
    (SIDE_GOOD, "side-table", lambda text: text.__setitem__(4, json.dumps({"event": "block_teleported", "seq": 4}))),
    (SIDE_GOOD, "side-table", lambda text: text.__setitem__(4, "{not json")),
    (VLLM_GOOD, "vllm-events", lambda text: text.__setitem__(4, text[4][:-3])),
    (VLLM_GOOD, "vllm-events", lambda text: text.__setitem__(4, json.dumps({"seq": 121, "ts": 1.0, "events": 7}))),
    (VLLM_GOOD, "vllm-events", lambda text: text.__setitem__(4, json.dumps({"request": {"id": "x"}}))),
]


@pytest.mark.parametrize(("path", "fmt", "corrupt"), MALFORMED)
def test_malformed_line_exits_2_with_its_line_number(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    path: Path,
    fmt: str,
    corrupt: Callable[[list[str]], None],
) -> None:
    text = path.read_text().splitlines()
    corrupt(text)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(text) + "\n")
    code, report, err = run(tmp_path, bad, fmt, capsys)
    assert code == 2 and report["status"] == "error"
    assert report["trace"]["error_line"] == 5
    assert f"{bad}:5:" in err


HUGE_INTS = st.sampled_from([2**63, -(2**63) - 1, 2**64, 10**30, -(10**30), 10**400])
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | HUGE_INTS
    | st.floats(allow_nan=False)
    | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=5,
)
COMMITTED = [
    (KVSPEC_GOOD, "kvspec"),
    (SIDE_GOOD, "side-table"),
    (SHARED_AWARE, "side-table"),
    (VLLM_SIDE, "side-table"),
    (VLLM_GOOD, "vllm-events"),
]


def _slots(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every position inside a JSON value, as a path of keys and indexes."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    out = []
    for key, inner in items:
        out.append((*path, key))
        out += _slots(inner, (*path, key))
    return out


def _replace(line: dict[str, Any], slot: tuple[Any, ...], value: Any) -> None:
    parent: Any = line
    for key in slot[:-1]:
        parent = parent[key]
    parent[slot[-1]] = value


def check_cli(tmp_path: Path, path: Path, fmt: str) -> tuple[int, dict[str, Any], str]:
    """``kvspec trace check`` in process, outside pytest's capture (Hypothesis reuses the test's fixtures)."""
    report = tmp_path / "report.json"
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["trace", "check", str(path), "--format", fmt, "--report", str(report)])
    assert "Traceback" not in err.getvalue() and err.getvalue().count("\n") <= 1, err.getvalue()
    return code, json.loads(report.read_text()), err.getvalue()


@pytest.mark.parametrize(("path", "fmt"), COMMITTED, ids=[p.stem for p, _ in COMMITTED])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_changed_value_is_judged_never_a_crash(tmp_path: Path, path: Path, fmt: str, data: st.DataObject) -> None:
    """Replace any one value anywhere in a good log: the check answers 0, 1 or 2 (with a line), never raises."""
    lines = load(path)
    at = data.draw(st.integers(0, len(lines) - 1), label="line")
    slot = data.draw(st.sampled_from(_slots(lines[at])), label="slot")
    _replace(lines[at], slot, data.draw(JSON_VALUES, label="value"))
    result = check_trace(write(tmp_path, lines), fmt)
    assert result.exit_code in (0, 1, 2)
    if result.exit_code == 2 and fmt != "vllm-events":
        assert result.error_line is not None, result.error
    code, report, _ = check_cli(tmp_path, tmp_path / "trace.jsonl", fmt)
    assert code == result.exit_code and report["status"] == result.status


def test_a_hit_longer_than_its_prompt_is_a_violation_and_the_rates_stay_rates(tmp_path: Path) -> None:
    """Found by the property above: a side-table lookup said 6 hit tokens of a 5-token prompt and the
    report's token_hit_rate came out 1.2, which the report schema refuses."""
    lines = load(SHARED_AWARE)
    assert lines[1]["event"] == "prefix_lookup" and lines[1]["prompt_tokens"] == 5
    lines[1]["hit_tokens"] = 6
    code, report, _ = check_cli(tmp_path, write(tmp_path, lines), "side-table")
    assert code == 1
    assert verdicts(report)["cache_index_consistency"] == "violated"
    assert "6 tokens of a 5-token prompt" in json.dumps(report)
    quality = report["trace"]["quality"]
    assert 0 <= quality["token_hit_rate"] <= 1


# The JSON types of every field a format reads, by its place in a line (a list position is "[]");
# "null" where the field may be null (absent). Fields a format keeps for the reader are not listed.
NUMBER, OPTIONAL_INT = frozenset({"int", "float"}), frozenset({"int", "null"})
OBSERVATION_TYPES: dict[str, frozenset[str]] = {
    "observation": frozenset({"dict"}),
    **{f"observation.{name}": frozenset({"int"}) for name in ("capacity", "free")},
    **{f"observation.{name}": frozenset({"list"}) for name in ("objects", "requests")},
    "observation.objects[]": frozenset({"dict"}),
    **{f"observation.objects[].{name}": frozenset({"int"}) for name in ("size", "tokens", "ref_count")},
    **{f"observation.objects[].{name}": OPTIONAL_INT for name in ("hits", "last_used")},
    "observation.objects[].key.bytes": frozenset({"str"}),
    "observation.requests[]": frozenset({"dict"}),
    **{f"observation.requests[].{name}": frozenset({"str"}) for name in ("req", "state")},
    **{f"observation.requests[].{name}": frozenset({"list"}) for name in ("tokens", "objects")},
    **{f"observation.requests[].{name}": frozenset({"int"}) for name in ("tokens[]", "prompt_len")},
    "observation.index": frozenset({"list", "null"}),
    "observation.index[]": frozenset({"list"}),
    "observation.index[][].bytes": frozenset({"str"}),
}
KVSPEC_HEADER_TYPES: dict[str, frozenset[str]] = {
    "kvspec_trace": frozenset({"int"}),
    **{name: frozenset({"str", "null"}) for name in ("adapter", "adapter_version")},
    **{name: frozenset({"dict"}) for name in ("config", "semantics")},
    **{f"config.{name}": frozenset({"int"}) for name in ("capacity", "block_size", "bytes_per_token")},
    **{f"semantics.{name}": frozenset({"str"}) for name in ("granularity", "eviction", "duplicate_keys")},
    **{f"semantics.{name}": frozenset({"bool"}) for name in ("hit_cap", "reset_requires_idle", "exact")},
    "semantics.free_uncached": frozenset({"str"}),
    "semantics.protect_min_hits": frozenset({"int"}),
    "semantics.admission_anchor_blocks": OPTIONAL_INT,
    **OBSERVATION_TYPES,
}
KVSPEC_STEP_TYPES: dict[str, frozenset[str]] = {
    "step": frozenset({"int"}),
    **{name: frozenset({"dict"}) for name in ("op", "outcome", "events[]")},
    **{name: frozenset({"str"}) for name in ("op.op", "op.mode", "outcome.status", "outcome.message")},
    "op.req": frozenset({"str", "null"}),
    **{name: frozenset({"list"}) for name in ("op.tokens", "events")},
    "op.tokens[]": frozenset({"int"}),
    "op.keep": frozenset({"bool"}),
    "outcome.hit_tokens": OPTIONAL_INT,
    **{name: frozenset({"str"}) for name in ("events[].kind", "events[].key.bytes")},
    **OBSERVATION_TYPES,
}
SIDE_HEADER_TYPES: dict[str, frozenset[str]] = {
    "kvspec_side_table": frozenset({"int"}),
    **{name: frozenset({"str", "null"}) for name in ("source", "policy")},
    **{name: OPTIONAL_INT for name in ("num_blocks", "block_size")},
    **{name: frozenset({"bool", "null"}) for name in ("hit_cap", "duplicate_hashes")},
}
HASH = frozenset({"str", "int"})
SIDE_EVENT_TYPES: dict[str, frozenset[str]] = {
    "event": frozenset({"str"}),
    "ts": NUMBER | {"null"},
    **{name: OPTIONAL_INT for name in ("seq", "ref_count", "hit_count", "delta", "prompt_tokens", "hit_tokens")},
    "block_id": frozenset({"int"}),
    **{name: HASH | {"null"} for name in ("block_hash", "candidates[].block_hash")},
    **{name: frozenset({"str", "null"}) for name in ("state", "reason", "request_id")},
    **{name: frozenset({"list"}) for name in ("block_hashes", "hit_blocks", "candidates")},
    "block_hashes[]": HASH,
    **{name: frozenset({"int"}) for name in ("hit_blocks[]", "candidates[].block_id")},
    "candidates[]": frozenset({"dict"}),
    "candidates[].retain_score": NUMBER | {"null"},
    "candidates[].protected": frozenset({"bool", "null"}),
}
VLLM_TYPES: dict[str, frozenset[str]] = {
    **{name: frozenset({"dict"}) for name in ("config", "request", "metrics", "reset", "events[]")},
    **{f"config.{name}": OPTIONAL_INT for name in ("block_size", "num_gpu_blocks")},
    **{f"config.{name}": frozenset({"str", "null"}) for name in ("hash_algo", "none_hash_seed", "events", "vllm")},
    "seq": frozenset({"int"}),
    **{name: NUMBER for name in ("ts", "request.started", "request.finished", "metrics.ts", "reset.ts")},
    **{name: frozenset({"list"}) for name in ("events", "events[].block_hashes", "events[].token_ids")},
    "events[].type": frozenset({"str"}),
    "events[].block_hashes[]": HASH,
    "events[].parent_block_hash": HASH | {"null"},
    **{name: frozenset({"int"}) for name in ("events[].token_ids[]", "request.prompt_token_ids[]")},
    **{name: OPTIONAL_INT for name in ("events[].block_size", "request.cached_tokens")},
    "request.id": frozenset({"str"}),
    "request.prompt_token_ids": frozenset({"list"}),
    "request.output_token_ids": frozenset({"list", "null"}),
    "request.output_token_ids[]": frozenset({"int"}),
    "request.mode": frozenset({"str", "null"}),
    **{name: frozenset({"bool", "null"}) for name in ("request.preempted", "metrics.idle", "reset.success")},
    **{f"metrics.{name}": NUMBER | {"null"} for name in ("kv_cache_usage_perc", "num_preemptions_total")},
}
VALUES_OF_KIND: dict[str, st.SearchStrategy[Any]] = {
    "null": st.none(),
    "bool": st.booleans(),
    "int": st.integers(-(2**70), 2**70) | HUGE_INTS,
    "float": st.floats(allow_nan=False, allow_infinity=False),
    "str": st.text(max_size=4),
    "list": st.lists(st.integers(0, 9), max_size=3),
    "dict": st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=2),
}


def field_types(fmt: str, line: dict[str, Any]) -> dict[str, frozenset[str]]:
    """The typed fields of one line of ``fmt``."""
    if fmt == "kvspec":
        return KVSPEC_HEADER_TYPES if "kvspec_trace" in line else KVSPEC_STEP_TYPES
    if fmt == "side-table":
        return SIDE_HEADER_TYPES if "kvspec_side_table" in line else SIDE_EVENT_TYPES
    return VLLM_TYPES


def _field(slot: tuple[Any, ...]) -> str:
    return "".join("[]" if isinstance(key, int) else f".{key}" for key in slot).lstrip(".")


def _kind(value: Any) -> str:
    names = {type(None): "null", bool: "bool", int: "int", float: "float"}
    return names.get(type(value), type(value).__name__)


@pytest.mark.parametrize(("path", "fmt"), COMMITTED, ids=[p.stem for p, _ in COMMITTED])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
@pytest.mark.slow
def test_a_value_of_the_wrong_type_is_exit_2_with_its_line(
    tmp_path: Path, path: Path, fmt: str, data: st.DataObject
) -> None:
    """Give any field a format reads a value of another JSON type: exit 2 naming that line, never a verdict."""
    lines = load(path)
    by_field: dict[str, list[tuple[int, tuple[Any, ...]]]] = {}
    for at, line in enumerate(lines):
        types = field_types(fmt, line)
        for slot in _slots(line):
            if _field(slot) in types:
                by_field.setdefault(_field(slot), []).append((at, slot))
    name = data.draw(st.sampled_from(sorted(by_field)), label="field")
    at, slot = data.draw(st.sampled_from(by_field[name]), label="where")
    wrong = sorted(set(VALUES_OF_KIND) - field_types(fmt, lines[at])[name])
    value = data.draw(st.sampled_from(wrong).flatmap(VALUES_OF_KIND.__getitem__), label="value")
    assert _kind(value) in wrong
    _replace(lines[at], slot, value)
    code, report, err = check_cli(tmp_path, write(tmp_path, lines), fmt)
    assert code == 2 and report["status"] == "error", (report["status"], report["trace"])
    assert report["trace"]["error_line"] == at + 1 and f":{at + 1}: " in err, err


def test_unreadable_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report, err = run(tmp_path, tmp_path / "missing.jsonl", "kvspec", capsys)
    assert code == 2 and report["status"] == "error" and "cannot read" in err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert main(["trace", "check", str(empty)]) == 2


def test_report_has_the_shape_of_kvspec_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, report, _ = run(tmp_path, SHARED_AWARE, "side-table", capsys)
    assert set(report) >= REPORT_KEYS
    for row in report["invariants"]:
        assert set(row) >= {"name", "verdict", "checked_steps", "first_violation"}


# A trace format's invariant that shares a name with the spec's makes the same claim as the spec's invariant of
# that name; a different claim gets a name of its own (the spec's capacity_conservation is free + sizes ==
# capacity, the logs' pool check is that a block is never allocated twice: allocated_once_within_pool).
SAME_CLAIM_AS_THE_SPEC = {
    "no_active_eviction",
    "non_negative_ref_counts",
    "share_without_duplication",
    "cache_index_consistency",
    "predicted_prefix_hits",
    "predicted_admission",
    "candidates_unreferenced",
    "policy_conformance",
}


def test_a_trace_invariant_named_as_the_spec_s_makes_the_spec_s_claim() -> None:
    from kvspec.spec import INVARIANT_NAMES
    from kvspec.traces import FORMATS

    for fmt, module in FORMATS.items():
        if fmt == "kvspec":  # the kit's own format judges the spec's invariants themselves (check_transition)
            continue
        own = {inv.name for inv in getattr(module, "INVARIANTS", ())}
        shared = own & set(INVARIANT_NAMES)
        assert shared <= SAME_CLAIM_AS_THE_SPEC, (fmt, sorted(shared - SAME_CLAIM_AS_THE_SPEC))
        assert "capacity_conservation" not in own, fmt
