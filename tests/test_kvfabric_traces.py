"""`kvspec trace check --format kvfabric` on real KVFabric lifecycle logs, and corrupted copies of them.

The fixtures in tests/data/kvfabric/ are logs the KVFabric overlay wrote (origin in that folder's
README). Every real log must check with exit 0 or 1, never 2; each corruption below is a small edit
of a real log and must be reported by the invariant it breaks, by name.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvspec.cli import main
from kvspec.report import report_problems
from kvspec.traces import check_trace, detect_format
from kvspec.traces.quality import OrphanCounter

DATA = Path(__file__).parent / "data" / "kvfabric"
REAL = sorted(DATA.glob("real_*.jsonl"))
LRU_HEAD = DATA / "real_2b_cache_pressure_lru_head.jsonl"
WINDOW = DATA / "real_2b_lowkv_shared_aware_window.jsonl"
SMOKE = DATA / "real_27b_smoke_family_protect.jsonl"

Lines = list[dict[str, Any]]


def load(path: Path) -> Lines:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write(tmp_path: Path, lines: Lines, name: str = "log.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in lines))
    return path


def run(tmp_path: Path, path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict[str, Any], str]:
    report = tmp_path / "report.json"
    code = main(["trace", "check", str(path), "--report", str(report), *extra])
    captured = capsys.readouterr()
    data = json.loads(report.read_text())
    assert report_problems(data) == [], report_problems(data)
    return code, data, captured.err + captured.out


def verdict(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(row for row in report["invariants"] if row["name"] == name)


def renumber(lines: Lines, start: int = 1) -> Lines:
    for i, line in enumerate(lines):
        line["seq"] = start + i
    return lines


def test_fixtures_are_the_real_logs() -> None:
    assert len(REAL) >= 3
    assert "OSH-2026/KVFabric" in (DATA / "README.md").read_text()


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.name)
def test_every_real_log_checks_without_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], path: Path) -> None:
    assert detect_format(path) == "kvfabric"
    code, report, out = run(tmp_path, path, capsys)
    assert code in (0, 1), out
    assert code == 0, report["trace"]  # these real logs hold every invariant judged
    quality = report["trace"]["quality"]
    assert quality is not None and quality["lookups"] > 0
    assert "cache quality" in out
    assert any(f["kind"] == "trace_quality" for f in report["findings"])


def test_window_of_a_real_log_judges_what_it_can(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report, _ = run(tmp_path, WINDOW, capsys, "--policy", "shared_aware")
    assert code == 0
    assert verdict(report, "no_active_eviction")["verdict"] == "held"
    assert report["trace"]["unjudged"]["lifecycle_transitions"] > 0  # blocks first seen mid-run
    quality = report["trace"]["quality"]
    assert quality["evictions"] == 6 and quality["lookups"] == 2
    assert quality["token_hit_rate"] == round(544 / (687 + 761), 6)
    assert quality["orphans"]["known"] is False and "mid-run" in quality["orphans"]["reason"]


# -- corrupted copies of real logs ------------------------------------------------------------------


def remove_line(lines: Lines) -> Lines:
    del lines[5]
    return lines


def time_goes_back(lines: Lines) -> Lines:
    lines[6]["time_ns"] = lines[5]["time_ns"] - 1
    return lines


def negative_ref_count(lines: Lines) -> Lines:
    i = next(i for i, line in enumerate(lines) if line["event"] == "ref_count_changed")
    lines[i]["ref_count"] = -1
    return lines


def wrong_ref_count(lines: Lines) -> Lines:
    i = next(i for i, line in enumerate(lines) if line["event"] == "block_sealed")
    lines[i]["ref_count"] = 2
    return lines


def allocate_twice(lines: Lines) -> Lines:
    i = next(i for i, line in enumerate(lines) if line["event"] == "block_allocated")
    lines.insert(i + 1, copy.deepcopy(lines[i]))
    return renumber(lines)


def touch_uncached(lines: Lines) -> Lines:
    touch = {**lines[10], "event": "block_touched", "block_id": 5, "hit_count": 1, "ref_count": 2, "state": "SHARED"}
    lines.insert(11, touch)  # block 5 was allocated at line 11 and never sealed
    return renumber(lines)


def evict_referenced(lines: Lines) -> Lines:
    i = next(i for i, line in enumerate(lines) if line["event"] == "block_sealed")
    evicted = {**lines[i], "event": "block_evicted", "state": "EVICTED"}
    lines.insert(i + 1, evicted)  # the block is still held by its request
    return renumber(lines)


def wrong_hit_count(lines: Lines) -> Lines:
    i = next(i for i, line in enumerate(lines) if line["event"] == "ref_count_changed" and line["block_hash"])
    lines[i]["hit_count"] = 3
    return lines


def wrong_state(lines: Lines) -> Lines:
    i = next(i for i, line in enumerate(lines) if line["event"] == "ref_count_changed")
    lines[i]["state"] = "ACTIVE"  # released to 0: the writer says COOLING_* or CANDIDATE
    return lines


def rank_in_lru_run(lines: Lines) -> Lines:
    ranking = {"event": "eviction_candidates_ranked", "policy": "lru", "time_ns": lines[-1]["time_ns"] + 1}
    ranking["candidates"] = [{"block_id": 1, "has_hash": True, "protected": False, "retain_score": 0.0, "ref_count": 0}]
    return renumber([*lines, ranking])


CORRUPTIONS: dict[str, tuple[Callable[[Lines], Lines], str]] = {
    "remove_line": (remove_line, "trace_order"),
    "time_goes_back": (time_goes_back, "trace_order"),
    "negative_ref_count": (negative_ref_count, "non_negative_ref_counts"),
    "wrong_ref_count": (wrong_ref_count, "non_negative_ref_counts"),
    "allocate_twice": (allocate_twice, "allocated_once_within_pool"),
    "touch_uncached": (touch_uncached, "cache_index_consistency"),
    "evict_referenced": (evict_referenced, "no_active_eviction"),
    "wrong_hit_count": (wrong_hit_count, "hit_count_consistency"),
    "wrong_state": (wrong_state, "lifecycle_transitions"),
    "rank_in_lru_run": (rank_in_lru_run, "policy_conformance"),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_corrupted_real_log_names_the_broken_invariant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    corrupt, invariant = CORRUPTIONS[name]
    path = write(tmp_path, corrupt(load(LRU_HEAD)))
    code, report, out = run(tmp_path, path, capsys)
    assert code == 1, out
    assert invariant in report["trace"]["violated"] or verdict(report, invariant)["verdict"] == "violated"
    assert report["trace"]["violated"] == invariant, report["trace"]
    assert verdict(report, invariant)["first_violation"]["line"] == report["trace"]["violated_line"]


def _ranking(lines: Lines, candidates: list[dict[str, Any]]) -> Lines:
    """The window fixture with a ranking (as rank_eviction_candidates logs it) before line 14's eviction."""
    ranking = {"event": "eviction_candidates_ranked", "policy": "shared_aware", "time_ns": lines[12]["time_ns"] + 1}
    ranking["candidates"] = candidates
    return renumber([*lines[:13], ranking, *lines[13:]], start=lines[0]["seq"])


def _candidate(block_id: int, score: float, ref: int = 0) -> dict[str, Any]:
    return {"block_id": block_id, "has_hash": True, "protected": False, "retain_score": score, "ref_count": ref}


def test_ranking_taken_in_order_holds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = _ranking(load(WINDOW), [_candidate(105, 0.0), _candidate(106, 0.0), _candidate(107, 0.0)])
    code, report, _ = run(tmp_path, write(tmp_path, lines), capsys, "--policy", "shared_aware")
    assert code == 0
    assert verdict(report, "policy_conformance")["verdict"] == "held"
    assert verdict(report, "candidates_unreferenced")["verdict"] == "held"


@pytest.mark.parametrize(
    ("candidates", "invariant"),
    [
        ([_candidate(106, 0.0), _candidate(105, 0.0)], "policy_conformance"),  # 105 taken where 106 was next
        ([_candidate(105, 5.0), _candidate(106, 0.0)], "policy_conformance"),  # not the lowest score first
        ([_candidate(105, 0.0), _candidate(1, 0.0, ref=1)], "candidates_unreferenced"),  # block 1 is held
    ],
)
def test_bad_ranking_names_the_broken_invariant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], candidates: list[dict[str, Any]], invariant: str
) -> None:
    lines = _ranking(load(WINDOW), candidates)
    code, report, out = run(tmp_path, write(tmp_path, lines), capsys, "--policy", "shared_aware")
    assert code == 1, out
    assert report["trace"]["violated"] == invariant


def test_capacity_from_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report, _ = run(tmp_path, LRU_HEAD, capsys, "--capacity", "3")
    assert code == 1 and report["trace"]["violated"] == "allocated_once_within_pool"
    code, report, _ = run(tmp_path, LRU_HEAD, capsys, "--capacity", "64")
    assert code == 0 and "allocated_once_within_pool" not in report["trace"]["unjudged"]
    code, report, _ = run(tmp_path, LRU_HEAD, capsys)
    assert code == 0 and report["trace"]["unjudged"]["allocated_once_within_pool"] == 8


def test_policy_that_disagrees_with_the_log_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report, out = run(tmp_path, LRU_HEAD, capsys, "--policy", "shared_aware")
    assert code == 2 and "disagrees with --policy" in out and report["status"] == "error"


def test_unknown_events_are_counted_not_fatal(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = load(LRU_HEAD)
    lines.insert(3, {"event": "a_future_event", "time_ns": lines[2]["time_ns"], "whatever": [1]})
    code, report, out = run(tmp_path, write(tmp_path, renumber(lines)), capsys)
    assert code == 0, out
    assert report["trace"]["unknown_events"] == {"a_future_event": 1}
    assert any(f["kind"] == "unknown_events" and f["events"] == {"a_future_event": 1} for f in report["findings"])


def test_absent_optional_fields_make_their_checks_unknown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = [{k: v for k, v in line.items() if k not in ("hit_count", "seq", "time_ns")} for line in load(SMOKE)]
    code, report, _ = run(tmp_path, write(tmp_path, lines), capsys, "--format", "kvfabric")
    assert code == 0
    for name in ("hit_count_consistency", "trace_order"):
        row = verdict(report, name)
        assert row["verdict"] == "unknown" and row["reason"], row


def test_a_value_of_the_wrong_type_is_exit_2_with_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = load(LRU_HEAD)
    lines[4]["block_id"] = "3"
    code, _, out = run(tmp_path, write(tmp_path, lines), capsys)
    assert code == 2
    assert f"{tmp_path / 'log.jsonl'}:5: field 'block_id' must be an integer" in out
    assert "Traceback" not in out


def test_a_second_tracker_run_starts_a_new_pool(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = load(LRU_HEAD)
    code, report, _ = run(tmp_path, write(tmp_path, lines + copy.deepcopy(lines)), capsys)
    assert code == 0  # block 1 allocated again in the second run is a new pool's block, not a double allocation
    assert report["trace"]["quality"]["lookups"] == 4


# -- quality figures ------------------------------------------------------------------------------


def _block(event: str, block_id: int, **fields: Any) -> dict[str, Any]:
    return {"event": event, "block_id": block_id, "block_hash": None, "hit_count": 0, **fields}


def quality_log() -> Lines:
    """A small log in the writer's shape: two chained blocks, a hit, the parent evicted (orphaning its child),
    the parent recomputed (an eviction regretted)."""
    lines: Lines = [{"event": "tracker_initialized", "policy": "lru"}]
    lines.append({"event": "prefix_lookup", "prompt_tokens": 33, "hit_tokens": 0, "hit": False})
    for b in (1, 2):
        lines.append(_block("block_allocated", b, ref_count=1, state="ACTIVE"))
    lines.append(_block("block_sealed", 1, block_hash="a", prefix_depth=1, parent_hash=None, ref_count=1))
    lines.append(_block("block_sealed", 2, block_hash="b", prefix_depth=2, parent_hash="a", ref_count=1))
    lines.append(_block("ref_count_changed", 2, block_hash="b", ref_count=0, state="COOLING_WARM"))
    lines.append(_block("ref_count_changed", 1, block_hash="a", ref_count=0, state="COOLING_WARM"))
    lines.append({"event": "prefix_lookup", "prompt_tokens": 33, "hit_tokens": 16, "hit": True})
    lines.append(_block("block_touched", 1, block_hash="a", ref_count=1, hit_count=1, state="ACTIVE"))
    lines.append(_block("ref_count_changed", 1, block_hash="a", ref_count=0, hit_count=1, state="COOLING_HOT"))
    lines.append(_block("block_evicted", 1, block_hash="a", ref_count=0, hit_count=1, state="EVICTED"))
    lines.append(_block("block_allocated", 1, ref_count=1, state="ACTIVE"))
    lines.append(_block("block_sealed", 1, block_hash="a", prefix_depth=1, ref_count=1, state="SEALED"))
    for i, line in enumerate(lines):
        line.update(seq=i + 1, time_ns=1000 + i)
    return lines


def test_quality_figures_of_a_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report, out = run(tmp_path, write(tmp_path, quality_log()), capsys)
    assert code == 0, out
    q = report["trace"]["quality"]
    assert q["lookups"] == 2 and q["lookup_hit_rate"] == 0.5 and q["token_hit_rate"] == round(16 / 66, 6)
    assert q["evictions"] == 1 and q["regret"] == 1 and q["regret_rate"] == 1.0
    assert q["evictions_by_state"] == {"COOLING_HOT": 1.0} and q["evictions_of_hit_blocks"] == 1
    orphans = q["orphans"]
    assert orphans["known"] and orphans["max"] == 1 and orphans["final"] == 0
    assert [point[1] for point in orphans["series"]] == [0, 0, 1, 0]  # sealed a, sealed b, evicted a, a again
    finding = next(f for f in report["findings"] if f["kind"] == "trace_quality")
    assert finding["regret"] == 1 and finding["format"] == "kvfabric"


def test_orphan_counter_follows_parents() -> None:
    counter = OrphanCounter()
    counter.add("b", "a")  # a child cached before its parent: an orphan
    assert counter.orphans == 1
    counter.add("a", None)
    assert counter.orphans == 0
    counter.add("a", None)  # a duplicate of the parent
    counter.remove("a", None)
    assert counter.orphans == 0  # one copy of the parent is still cached
    counter.remove("a", None)
    assert (counter.orphans, counter.blocks) == (1, 1)


@pytest.mark.parametrize(
    ("trace", "fmt"),
    [
        (Path(__file__).parent / "data" / "traces" / "reference_kvspec.jsonl", "kvspec"),
        (Path(__file__).parent / "data" / "traces" / "reference_side_table.jsonl", "side-table"),
    ],
)
def test_quality_figures_of_other_formats(trace: Path, fmt: str) -> None:
    result = check_trace(trace, fmt)
    assert result.exit_code == 0 and result.quality is not None
    q = result.quality.to_json()
    assert q["lookups"] > 0 and q["evictions"] > 0
    assert 0 <= q["regret"] <= q["evictions"]
    assert q["token_hit_rate"] is not None


# -- convert ------------------------------------------------------------------------------------


def test_convert_to_side_table_reads_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "side.jsonl"
    assert main(["trace", "convert", str(LRU_HEAD), "--to", "side-table", "--out", str(out)]) == 0
    capsys.readouterr()
    assert detect_format(out) == "side-table"
    code, report, _ = run(tmp_path, out, capsys)
    assert code == 0
    assert report["trace"]["format"] == "side-table"


def test_convert_quality_log_keeps_regret_and_orphans(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "side.jsonl"
    assert main(["trace", "convert", str(write(tmp_path, quality_log())), "--to", "side-table", "--out", str(out)]) == 0
    capsys.readouterr()
    code, report, _ = run(tmp_path, out, capsys)
    assert code == 0
    q = report["trace"]["quality"]
    assert q["regret"] == 1 and q["orphans"]["max"] == 1


@pytest.mark.parametrize(
    ("source", "target", "message"),
    [(LRU_HEAD, "kvspec", "token ids"), (WINDOW, "side-table", "starts mid-run")],
)
def test_convert_that_cannot_be_done_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], source: Path, target: str, message: str
) -> None:
    code = main(["trace", "convert", str(source), "--to", target, "--out", str(tmp_path / "x.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "x.jsonl").exists()
