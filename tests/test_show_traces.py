"""``kvspec trace check --html`` and a live run's page: traces drawn as block timelines, checked by what they show.

The traces are the real fixtures (tests/data/kvfabric/: logs the KVFabric overlay wrote; tests/data/traces/: traces
and side tables the kit recorded; tests/data/vllm_live_cpu.jsonl: a live vLLM run's recorded events) and corrupted
copies of them made as tests/test_kvfabric_traces.py and tests/test_stream_checks.py make theirs. A failing
trace's page must name the invariant and the line, and mark the violating line's column, on the row of the block
the problem names; a holding trace is drawn whole, or as an overview of every line and its last window.
"""

from __future__ import annotations

import copy
import json
import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from test_kvfabric_traces import CORRUPTIONS, LRU_HEAD, REAL, load, write

from kvspec import jsonio
from kvspec.cli import main
from kvspec.cli.check import write_html
from kvspec.report import ExitCode, report_problems
from kvspec.show import trace_run as trace
from kvspec.show.timeline import timelines
from kvspec.stateful_tests.live import LiveResult
from kvspec.traces import check_trace

DATA = Path(__file__).parent / "data"
LIVE = DATA / "vllm_live_cpu.jsonl"
FIXTURES = [*REAL, *sorted((DATA / "traces").glob("*.jsonl")), LIVE]
FORGET = DATA / "show" / "forget-decrement.json"


class Marks(HTMLParser):
    """Every element id of a page (SVG marks included), and the page's text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.classes: list[str] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.add(str(found["id"]))
        if tag == "figure":
            self.classes.append(str(found.get("class")))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def has(self, words: str) -> bool:
        return words in " ".join(self.text)


def page(tmp_path: Path, trace_path: Path, *extra: str, code: int = ExitCode.HELD) -> tuple[Marks, dict[str, Any]]:
    html, report = tmp_path / "trace.html", tmp_path / "trace.json"
    got = main(["trace", "check", str(trace_path), "--html", str(html), "--report", str(report), *extra])
    assert got == code
    data = jsonio.load(report)
    assert report_problems(data) == []
    return Marks(html.read_text()), data


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_every_real_trace_renders_its_timeline(tmp_path: Path, path: Path) -> None:
    marks, data = page(tmp_path, path)
    traced = trace.check(path, "auto")
    (grid,) = timelines(trace.runs(traced)[0])[-1:]
    start, stop = trace.runs(traced)[2]
    assert stop == traced.total  # a holding trace is drawn to its end
    assert (stop - start) == (traced.total if traced.total <= trace.MAX_COLUMNS else trace.WINDOW)
    panel = 1 if data["trace"]["format"] == "kvspec" else 0  # a kvspec trace of exact semantics: the spec above
    assert f"c0p{panel}-cell-0-{stop - start - 1}" in marks.ids and f"c0p{panel}-cell-0-{stop - start}" not in marks.ids
    assert grid.rows and not any("violation" in i for i in marks.ids)
    assert marks.classes.count("timeline") == 1
    assert ("overview" in marks.classes) is (traced.total > trace.MAX_COLUMNS)
    assert marks.has("every invariant held") and marks.has(data["trace"]["format"])


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_a_corrupted_kvfabric_log_marks_the_violating_line_and_block(tmp_path: Path, name: str) -> None:
    corrupt, invariant = CORRUPTIONS[name]
    path = write(tmp_path, corrupt(load(LRU_HEAD)))
    marks, data = page(tmp_path, path, code=ExitCode.VIOLATED)
    line = data["trace"]["violated_line"]
    assert data["trace"]["violated"] == invariant
    assert marks.has(f"VIOLATED at line {line}") and marks.has(invariant)
    traced = trace.check(path, "auto")
    runs, labels, (start, stop) = trace.runs(traced)
    (grid,) = timelines(runs)
    col = stop - start - 1
    assert labels[col].startswith(f"L{line}")  # the last column drawn is the violating line
    assert grid.broken is not None and (grid.broken.step, grid.broken.invariant) == (col, invariant)
    problem = traced.result.violation.failures[invariant][0] if traced.result.violation else ""
    named = [oid for oid in grid.rows if re.search(rf"\bblock {oid}\b", problem)]
    if named:  # the problem names a block: its cell is framed, on the violating line
        assert [grid.rows[r] for r in grid.hot_rows] == named
        assert f"c0p0-violation-{grid.hot_rows[0]}-{col}" in marks.ids
    else:
        assert f"c0p0-violation-col-{col}" in marks.ids or f"c0p0-violation-free-{col}" in marks.ids
    assert not any(m.startswith("c0p0-violation-") and not m.endswith(f"-{col}") for m in marks.ids)


def _without_a_store_that_is_removed_later(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The live log with the first BlockStored of a hash removed later taken out; that hash."""
    records = copy.deepcopy(records)
    removed = {
        h for r in records for e in r.get("events", ()) if e["type"] == "BlockRemoved" for h in e["block_hashes"]
    }
    for record in records:
        for event in record.get("events", ()):
            if event["type"] == "BlockStored" and set(event["block_hashes"]) & removed:
                record["events"].remove(event)
                return records, min(set(event["block_hashes"]) & removed, key=event["block_hashes"].index)
    raise AssertionError("the live log removes no stored block")


def test_a_corrupted_live_log_marks_the_removed_hash(tmp_path: Path) -> None:
    records, key = _without_a_store_that_is_removed_later([json.loads(s) for s in LIVE.read_text().splitlines()])
    path = tmp_path / "live.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    marks, data = page(tmp_path, path, code=ExitCode.VIOLATED)
    assert data["trace"]["violated"] == "removed_was_cached"
    assert marks.has(f"VIOLATED at line {data['trace']['violated_line']}") and marks.has("removed_was_cached")
    traced = trace.check(path, "auto")
    runs, labels, (start, stop) = trace.runs(traced)
    (grid,) = timelines(runs)
    assert stop - start == trace.WINDOW and labels[-1].startswith(f"L{data['trace']['violated_line']}")
    row = grid.rows.index(key)
    assert grid.hot_rows == (row,) and grid.cells[row][-1] is not None and grid.cells[row][-1].left == "evict"
    assert f"c0p0-violation-{row}-{stop - start - 1}" in marks.ids
    assert "c0overview-violation" in marks.ids and "c0overview-window" in marks.ids


def test_a_kvspec_trace_of_a_seeded_bug_is_drawn_under_the_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    recorded = tmp_path / "forget.jsonl"
    argv = ["trace", "record", "--adapter", "seeded_bugs:forget_decrement", "--ops", str(FORGET)]
    assert main([*argv, "--out", str(recorded)]) == ExitCode.HELD
    marks, data = page(tmp_path, recorded, code=ExitCode.VIOLATED)
    assert data["trace"]["violated"] == "ref_count_matches_references"
    # The spec's replay of the ops (p0) above the trace (p1): block 0's ref count differs where the release forgot it.
    assert {"c0p0-differs-0-2", "c0p1-differs-0-2", "c0p1-violation-0-2"} <= marks.ids
    assert not any(i.startswith("c0p0-violation") for i in marks.ids)


def test_a_kvspec_trace_without_observations_draws_the_spec_replay_of_its_ops(tmp_path: Path) -> None:
    recorded = tmp_path / "ops.jsonl"
    argv = ["trace", "record", "--ops", str(FORGET), "--no-observations", "--out", str(recorded)]
    assert main(argv) == ExitCode.HELD
    marks, _ = page(tmp_path, recorded)
    assert "c0p0-cell-0-2" in marks.ids and not any(i.startswith("c0p1-") for i in marks.ids)
    assert marks.has("every invariant held")


def test_a_malformed_trace_is_exit_2_in_one_line_and_its_page_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = LRU_HEAD.read_text().splitlines()
    lines[4] = lines[4].replace('"ref_count": 1', '"ref_count": 1.0')
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    marks, data = page(tmp_path, bad, code=ExitCode.COULD_NOT_RUN)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"kvspec: {bad}:5: ")
    assert data["status"] == "error" and "timeline" not in marks.classes and marks.has("could not be checked")


def test_trace_check_html_that_cannot_be_written_is_exit_2_before_the_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["trace", "check", str(LRU_HEAD), "--html", str(tmp_path)])  # a folder
    assert code == ExitCode.COULD_NOT_RUN
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write the page" in err


def test_trace_check_html_without_matplotlib_is_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["trace", "check", str(LRU_HEAD), "--html", str(tmp_path / "t.html")]) == ExitCode.COULD_NOT_RUN
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "kvspec[show]" in err and not (tmp_path / "t.html").exists()


def _live_options(record: Path | None) -> Any:
    """The options ``kvspec check --adapter vllm-live --record FILE`` hands to the page writer."""
    from kvspec.stateful_tests import LiveTarget, Options

    return Options(refine=True, step_timeout=30.0, live=LiveTarget(record=record))


def test_a_live_run_page_draws_its_saved_log_and_its_recording(tmp_path: Path) -> None:
    """The live runner's report (LiveResult.report, as ``kvspec check`` on vllm-live builds it) through the same
    page writer the CLI calls: the saved log of the violation and the run's ``--record`` log are both drawn."""
    records, _ = _without_a_store_that_is_removed_later([json.loads(s) for s in LIVE.read_text().splitlines()])
    saved = tmp_path / "vllm-live-removed_was_cached-0.jsonl"
    saved.write_text("".join(json.dumps(r) + "\n" for r in records))
    stream = check_trace(saved, "vllm-events")
    result = LiveResult("vllm-live", "ci", 0, "both", "2026-01-01T00:00:00Z", "0.32.0", status="violated")
    result.cases.append(str(saved))
    report = result.report()
    assert "live" in report.sections and stream.violation is not None
    write_html(tmp_path / "live.html", _live_options(LIVE), report, None)
    marks = Marks((tmp_path / "live.html").read_text())
    assert marks.classes.count("timeline") == 2  # the saved log, then the whole recorded run
    assert any(i.startswith("c0p0-violation-") for i in marks.ids)
    assert not any(i.startswith("c1p0-violation-") for i in marks.ids)
    assert {"case-0-overview", "case-1-overview"} <= marks.ids
    assert marks.has(f"VIOLATED at line {stream.violation.line}") and marks.has("removed_was_cached")
