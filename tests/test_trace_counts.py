"""`kvspec trace check` judges the whole log: every violating line is counted, per invariant, to the end.

Each violated row of the report carries ``violations`` (the lines that broke it), ``first_line`` and ``lines``
(the first ten); the table lists them. ``--first`` stops at the first violating line with the check and the
report of kits before the counts. Every count below is measured on a real log or on a trace the kit's own
writers recorded, with violations seeded at known lines, and checked against a reading of the log made here
(the seeded lines, or a small independent replay of the format), so that a count that is off fails.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from kvspec.cli import main
from kvspec.report import SAMPLE_LINES

TESTS = Path(__file__).resolve().parent
KVFABRIC = TESTS / "data" / "kvfabric"
SMOKE = KVFABRIC / "real_27b_smoke_family_protect.jsonl"  # also /work/shared/data/kvfabric (its README)
SHARED = TESTS.parent.parent / "shared" / "data" / "kvfabric" / "real_27b_prefix_reuse_smoke_family_protect.jsonl"
VLLM_LOG = TESTS / "data" / "vllm_live_cpu.jsonl"  # recorded by the live adapter from vLLM 0.32 on CPU
SIDE_LOG = TESTS / "data" / "traces" / "reference_side_table.jsonl"  # recorded by `kvspec trace record`

Lines = list[dict[str, Any]]


def load(path: Path) -> Lines:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write(tmp_path: Path, lines: Lines, name: str = "log.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def check(
    tmp_path: Path, path: Path, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, dict[str, Any], str]:
    """`kvspec trace check PATH --report ...`: the exit code, the report and what it printed."""
    report = tmp_path / "report.json"
    code = main(["trace", "check", str(path), "--report", str(report), *extra])
    out = capsys.readouterr().out
    return code, json.loads(report.read_text()), out


def row(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in report["invariants"] if r["name"] == name)


def assert_counted(report: dict[str, Any], name: str, lines: list[int]) -> None:
    """``name`` is violated on exactly ``lines`` (in order): its count, first line and sample say so."""
    got = row(report, name)
    assert got["verdict"] == "violated", got
    assert got["violations"] == len(lines), (got["violations"], lines)
    assert got["first_line"] == lines[0] == got["first_violation"]["line"]
    assert got["lines"] == lines[:SAMPLE_LINES]


# -- a real KVFabric log: a policy that evicts blocks a request still holds ----------------------------------


def evict_held_blocks(lines: Lines) -> tuple[Lines, list[int]]:
    """After every block allocation of the log, the block's eviction (its record, EVICTED) while the request
    that was just given it still holds it: the log of a policy that picks referenced victims. The log is
    renumbered as its writer numbers it; returns it and the 1-based numbers of the inserted lines."""
    out: Lines = []
    inserted = []
    for line in lines:
        out.append(line)
        if line["event"] == "block_allocated":
            out.append({**copy.deepcopy(line), "event": "block_evicted", "state": "EVICTED"})
            inserted.append(len(out))
    for seq, line in enumerate(out, start=1):
        line["seq"] = seq
    return out, inserted


def held_evictions(lines: Lines) -> list[int]:
    """The lines of a KVFabric log that evict a block with references, read here from the log alone: a block
    holds 1 after its allocation, one more per touch, what ``ref_count_changed`` says, and keeps its references
    through an eviction; an eviction also counts when its own record shows references."""
    refs: dict[int, int] = {}
    found = []
    for number, line in enumerate(lines, start=1):
        event, block = line.get("event"), line.get("block_id")
        if event in ("block_allocated", "block_touched"):
            refs[block] = refs.get(block, 0) + 1
        elif event == "ref_count_changed":
            refs[block] = line["ref_count"]
        elif event == "block_evicted" and max(refs.get(block, 0), line.get("ref_count") or 0) > 0:
            found.append(number)
    return found


def test_the_real_logs_evict_no_held_block(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Measured on every real KVFabric log here (the 27B smoke run is also the one in /work/shared): 0."""
    if SHARED.exists():
        assert SHARED.read_bytes() == SMOKE.read_bytes()
    for path in sorted(KVFABRIC.glob("real_*.jsonl")):
        assert held_evictions(load(path)) == [], path
        code, report, _ = check(tmp_path, path, capsys)
        assert code == 0 and row(report, "no_active_eviction")["verdict"] in ("held", "unknown"), path


def test_every_eviction_of_a_held_block_is_counted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines, inserted = evict_held_blocks(load(SMOKE))
    assert held_evictions(lines) == inserted and len(inserted) == 12 > SAMPLE_LINES
    code, report, out = check(tmp_path, write(tmp_path, lines), capsys)
    assert code == 1 and report["status"] == "violated"
    assert_counted(report, "no_active_eviction", inserted)
    assert report["trace"]["violated_line"] == inserted[0]  # (an uncached block: lifecycle_transitions names it)
    assert report["trace"]["lines"] == len(lines)
    # The text says it too: the count, the first line and the first ten lines, and that there are more.
    listed = next(text for text in out.splitlines() if text.startswith("  no_active_eviction ") and "line(s)" in text)
    assert f"{len(inserted)} line(s), first line {inserted[0]}" in listed and listed.endswith(" ...")
    assert ", ".join(map(str, inserted[:SAMPLE_LINES])) in listed


def test_first_stops_at_the_first_eviction_of_a_held_block(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines, inserted = evict_held_blocks(load(SMOKE))
    path = write(tmp_path, lines)
    code, report, out = check(tmp_path, path, capsys, "--first")
    assert code == 1 and report["trace"]["violated_line"] == inserted[0]
    assert row(report, "no_active_eviction")["first_violation"]["line"] == inserted[0]
    violated = [r for r in report["invariants"] if r["verdict"] == "violated"]
    assert all("violations" not in r and "lines" not in r for r in report["invariants"])  # the report of before
    assert {r["first_violation"]["line"] for r in violated} == {inserted[0]}  # one line: the first
    assert out.count("VIOLATED") == 1 and "violations to the end" not in out


def test_a_malformed_line_after_the_violations_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The whole log is read, so a malformed last line is exit 2 with its one line; --first never reads it."""
    lines, inserted = evict_held_blocks(load(SMOKE))
    path = write(tmp_path, lines)
    with path.open("a") as log:
        bad = {"event": "block_allocated", "block_id": 1.5, "seq": len(lines) + 1, "time_ns": lines[-1]["time_ns"]}
        log.write(json.dumps(bad) + "\n")
    report = tmp_path / "report.json"
    assert main(["trace", "check", str(path), "--report", str(report)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"kvspec: {path}:{len(lines) + 1}: field 'block_id' must be an integer, not 1.5"]
    data = json.loads(report.read_text())
    assert data["status"] == "error" and data["trace"]["error_line"] == len(lines) + 1
    assert row(data, "no_active_eviction")["violations"] == len(inserted)  # what was judged before it stays
    assert main(["trace", "check", str(path), "--first"]) == 1


# -- kvspec's own trace, recorded by `kvspec trace record` ----------------------------------------------------


def record(tmp_path: Path, *extra: str) -> Lines:
    out = tmp_path / "recorded.jsonl"
    argv = ["trace", "record", "--adapter", "reference", "--capacity", "6", "--block-size", "2"]
    assert main([*argv, "--seed", "21", "--steps", "240", "--out", str(out), *extra]) == 0
    return load(out)


def _spaced(candidates: list[int], count: int, gap: int = 4) -> list[int]:
    """Up to ``count`` of ``candidates`` (ascending), each at least ``gap`` after the one before."""
    picked: list[int] = []
    for i in candidates:
        if not picked or i - picked[-1] >= gap:
            picked.append(i)
    return picked[:count]


def test_kvspec_trace_counts_each_seeded_violation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Negative ref counts in four observations (safety) and a hit over-reported on three admissions
    (refinement): each is counted on its own line, and nothing else is broken."""
    lines = record(tmp_path, "--snapshot-every", "1")  # a full observation every step
    steps = list(range(1, len(lines)))  # index i is line i + 1
    held = [i for i in steps if any(o["ref_count"] > 0 for o in lines[i]["observation"]["objects"])]
    negative = _spaced(held, 4)
    hits = [i for i in steps if lines[i]["op"]["op"] == "admit" and (lines[i]["outcome"]["hit_tokens"] or 0) > 0]
    wrong = _spaced([i for i in hits if all(abs(i - j) > 2 for j in negative)], 3)
    assert len(negative) == 4 and len(wrong) == 3
    for i in negative:
        next(o for o in lines[i]["observation"]["objects"] if o["ref_count"] > 0)["ref_count"] = -1
    for i in wrong:
        lines[i]["outcome"]["hit_tokens"] += 2
    code, report, _ = check(tmp_path, write(tmp_path, lines), capsys)
    assert code == 1
    assert_counted(report, "non_negative_ref_counts", [i + 1 for i in negative])
    assert_counted(report, "predicted_prefix_hits", [i + 1 for i in wrong])
    seeded = {i + 1 for i in negative + wrong}
    for r in report["invariants"]:
        assert r["verdict"] != "violated" or set(r["lines"]) <= seeded, r  # no line that was not seeded
    assert report["trace"]["lines"] == len(lines) and report["steps"] == len(lines) - 1


def test_kvspec_trace_with_deltas_counts_past_the_sample(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A version 2 trace (deltas between snapshots), read as a stream: twelve over-reported hits, all counted,
    ten listed; with --first the stream stops at the first and the report has no counts."""
    lines = record(tmp_path)
    assert lines[0]["kvspec_trace"] == 2 and any("delta" in line for line in lines)
    hits = [i for i in range(1, len(lines)) if lines[i]["op"]["op"] == "admit" and lines[i]["outcome"]["hit_tokens"]]
    wrong = hits[:12]
    assert len(wrong) == 12
    for i in wrong:
        lines[i]["outcome"]["hit_tokens"] += 2
    path = write(tmp_path, lines)
    code, report, out = check(tmp_path, path, capsys)
    assert code == 1
    assert_counted(report, "predicted_prefix_hits", [i + 1 for i in wrong])
    assert "predicted_prefix_hits" in out and f"{len(wrong)} line(s)" in out
    code, first, _ = check(tmp_path, path, capsys, "--first")
    assert code == 1 and "violations" not in row(first, "predicted_prefix_hits")
    assert first["trace"]["violated_line"] == wrong[0] + 1 == first["trace"]["lines"]  # read up to there


# -- vLLM's KV cache events, as the live adapter records them -----------------------------------------------


def removals_of_uncached(lines: Lines) -> list[int]:
    """The batch lines of a vLLM event log that remove a hash with no cached copy, read here: copies counted
    from BlockStored and BlockRemoved, all dropped by AllBlocksCleared."""
    copies: dict[Any, int] = {}
    found = []
    for number, line in enumerate(lines, start=1):
        if "seq" not in line or "events" not in line:
            continue
        bad = False
        for event in line["events"]:
            if event["type"] == "AllBlocksCleared":
                copies.clear()
            for key in event.get("block_hashes") or ():
                if event["type"] == "BlockStored":
                    copies[key] = copies.get(key, 0) + 1
                elif event["type"] == "BlockRemoved":
                    bad = bad or copies.get(key, 0) <= 0
                    copies[key] = max(copies.get(key, 0) - 1, 0)
        if bad:
            found.append(number)
    return found


def test_vllm_events_count_each_seeded_violation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Removals of a hash never stored in 25 batches (more than the stream ledger keeps problems of) and one
    block less from cache on three requests sent alone: each line counted, the first ten listed."""
    lines = load(VLLM_LOG)
    assert removals_of_uncached(lines) == []
    batches = [i for i, line in enumerate(lines) if "seq" in line and "events" in line]
    seeded = batches[1::4][:25]
    assert len(seeded) == 25
    for n, i in enumerate(seeded):
        lines[i]["events"].append({"type": "BlockRemoved", "block_hashes": [10**9 + n], "medium": "GPU"})
    block_size = next(line["config"]["block_size"] for line in lines if "config" in line)
    exact = [
        i
        for i, line in enumerate(lines)
        if line.get("request", {}).get("mode") == "exact" and (line["request"].get("cached_tokens") or 0) > 0
    ]
    for i in exact[:3]:
        lines[i]["request"]["cached_tokens"] -= block_size
    assert removals_of_uncached(lines) == [i + 1 for i in seeded]
    code, report, out = check(tmp_path, write(tmp_path, lines), capsys, "--format", "vllm-events")
    assert code == 1
    assert_counted(report, "removed_was_cached", [i + 1 for i in seeded])
    got = row(report, "predicted_cached_tokens")
    assert got["violations"] == 3 and got["lines"] == [i + 1 for i in exact[:3]]
    assert "removed_was_cached" in out and "25 line(s)" in out
    code, first, out = check(tmp_path, write(tmp_path, lines), capsys, "--format", "vllm-events", "--first")
    assert code == 1 and all("violations" not in r for r in first["invariants"])
    assert "violations to the end" not in out


# -- a side table --------------------------------------------------------------------------------------------


def test_side_table_goes_on_from_each_lines_own_order(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Five events stamped before the one before them: five lines, each counted once (the next line is read
    against the stamp of the line before it, as the log gives it)."""
    lines = load(SIDE_LOG)
    assert all("seq" in line for line in lines[1:])
    late = _spaced(list(range(11, len(lines) - 1)), 5, gap=7)
    for i in late:
        lines[i]["seq"] -= 3
    assert len(late) == 5
    code, report, _ = check(tmp_path, write(tmp_path, lines), capsys)
    assert code == 1
    got = row(report, "trace_order")
    # A line out of order breaks the order where it stands and where the next one follows it.
    expected = sorted({i + 1 for i in late} | {i + 2 for i in late})
    assert got["violations"] == len(expected) and got["lines"] == expected[:SAMPLE_LINES]
