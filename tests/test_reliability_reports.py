"""Class 5 (the report is always written): on a load failure, on SIGINT or SIGTERM at any moment (while
the command line is parsed, while searching, while shrinking), atomically; a second signal still ends
with exit 2."""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import pytest
from clirun import kvspec

from kvspec.report import Report, Row, report_problems


def _report(path: Path) -> dict:  # type: ignore[type-arg]
    data = json.loads(path.read_text())
    assert report_problems(data) == []
    return data  # type: ignore[no-any-return]


def test_an_adapter_that_does_not_load_still_gets_its_report(tmp_path: Path) -> None:
    report, junit = tmp_path / "r.json", tmp_path / "j.xml"
    run = kvspec("check", "--adapter", "no_such_module:Factory", "--report", str(report), "--junit", str(junit))
    assert run.code == 2 and run.err.count("\n") == 1, run.err
    data = _report(report)
    assert data["status"] == "error" and "no_such_module" in data["error"] and junit.exists()


def test_an_interrupt_while_the_command_starts_writes_an_interrupted_report(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    run = kvspec("check", "--adapter", "reference", "--report", str(report), interrupt_after=0.0, from_held=True)
    assert run.code == 2, (run.code, run.err[-300:])
    assert "Traceback" not in run.err
    assert _report(report)["status"] == "interrupted"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_while_shrinking_keeps_the_finding_and_its_case(sig: int, tmp_path: Path) -> None:
    """The signal comes 0.5 s after SlowBuggy's bug first fires (it marks a file): shrinking its case then takes
    several seconds more (100 ms a step), so the kit is shrinking when it is signalled."""
    report, mark = tmp_path / "r.json", tmp_path / "bug-fired"
    args = ["check", "--adapter", "faulty_adapters:SlowBuggy", "--no-scenarios", "--quiet"]
    run = kvspec(
        *args,
        "--report",
        str(report),
        "--cases-dir",
        str(tmp_path / "cases"),
        signals=[(0.5, sig)],
        from_file=mark,
        env={"SLOW_BUGGY_MARK": str(mark)},
    )
    assert run.code == 2, (run.code, run.out[-500:], run.err[-500:])
    data = _report(report)
    assert data["status"] == "interrupted"
    assert any(row["verdict"] == "violated" for row in data["invariants"])
    assert len(data["cases"]) == 1 and Path(data["cases"][0]).exists()


def test_a_second_signal_ends_the_kit_at_once_with_exit_2(tmp_path: Path) -> None:
    """SlowClose takes 20 s to close: after a first Ctrl-C the kit waits for it; a second one does not."""
    run = kvspec(
        "check",
        "--adapter",
        "faulty_adapters:SlowClose",
        "--quiet",
        signals=[(1.5, signal.SIGINT), (3.0, signal.SIGINT)],
    )
    assert run.code == 2, (run.code, run.err[-300:])
    assert run.seconds < 10


def test_a_report_is_written_whole_or_not_at_all(tmp_path: Path) -> None:
    """Writing is a temporary file and a rename: a failure half-way leaves the last report as it was."""
    path = tmp_path / "r.json"
    good = Report("a", [Row("x", "safety", 1)])
    good.write_json(path)
    before = path.read_text()
    bad = Report("a", [Row("x", "safety", 1)], duration_s=math.nan)
    with pytest.raises(ValueError):
        bad.write_json(path)
    assert path.read_text() == before and list(tmp_path.iterdir()) == [path]
