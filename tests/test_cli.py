"""The command line's external contract: exit codes, the table, JSON report, JUnit, cases, replay."""

from __future__ import annotations

import json
import os
import signal
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvspec.adapters.reference_paged import ReferencePagedAdapter
from kvspec.cli import main
from kvspec.report import REPORT_KEYS
from kvspec.spec import INVARIANT_NAMES, Op, Outcome
from kvspec.spec.invariants import VIEW_INVARIANTS


def test_check_reference_passes_and_writes_report_and_junit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report, junit = tmp_path / "r.json", tmp_path / "j.xml"
    code = main(
        [
            "check",
            "--adapter",
            "reference",
            "--max-examples",
            "30",
            "--report",
            str(report),
            "--junit",
            str(junit),
            "--cases-dir",
            str(tmp_path / "cases"),
            "--quiet",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "PASSED" in out and "capacity_conservation" in out
    data = json.loads(report.read_text())
    assert set(data) >= REPORT_KEYS
    assert data["status"] == "passed" and data["cases"] == []
    assert [row["name"] for row in data["invariants"]] == list(INVARIANT_NAMES)
    assert all(row["verdict"] in ("held", "unknown") for row in data["invariants"])
    radix = {inv.name for inv in VIEW_INVARIANTS}  # they apply only to an adapter that shows a radix tree or groups
    assert all(
        row["verdict"] == "held" for row in data["invariants"] if row["kind"] == "safety" and row["name"] not in radix
    )
    assert all(row["verdict"] == "unknown" for row in data["invariants"] if row["name"] in radix)
    suite = ET.parse(junit).getroot()
    assert suite.get("failures") == "0"
    assert len(suite.findall("testcase")) == len(INVARIANT_NAMES)


def test_check_finds_a_seeded_bug_exits_1_and_the_case_replays(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "r.json"
    code = main(
        [
            "check",
            "--adapter",
            "test_cli:DoubleDecrementAdapter",
            "--report",
            str(report),
            "--cases-dir",
            str(tmp_path),
            "--quiet",
            "--no-scenarios",  # the random phase alone, as this test was written for (a factory function)
        ]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "VIOLATED non_negative_ref_counts" in out
    data = json.loads(report.read_text())
    assert data["status"] == "violated"
    verdicts = {row["name"]: row for row in data["invariants"]}
    assert verdicts["non_negative_ref_counts"]["verdict"] == "violated"
    assert verdicts["non_negative_ref_counts"]["first_violation"]["problems"]
    (case,) = data["cases"]
    saved = json.loads(Path(case).read_text())
    assert saved["kvspec_case"] == 1 and saved["expected"]["invariant"] == "non_negative_ref_counts"
    assert main(["replay", case]) == 1
    assert "VIOLATED non_negative_ref_counts" in capsys.readouterr().out
    assert main(["replay", case, "--adapter", "reference"]) == 0


def test_unknown_adapter_could_not_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--adapter", "no-such-adapter"]) == 2
    assert "unknown adapter" in capsys.readouterr().err
    assert main(["check", "--adapter", "no_such_module:Factory"]) == 2


def test_an_adapter_that_fails_to_start_could_not_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "r.json"
    assert main(["check", "--adapter", "test_cli:BrokenAdapter", "--report", str(report), "--quiet"]) == 2
    assert json.loads(report.read_text())["status"] == "error"
    assert "could not run" in capsys.readouterr().out


def test_interrupt_still_writes_the_report(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    code = main(
        [
            "check",
            "--adapter",
            "test_cli:InterruptingAdapter",
            "--report",
            str(report),
            "--quiet",
            "--cases-dir",
            str(tmp_path),
        ]
    )
    assert code == 2
    data = json.loads(report.read_text())
    assert data["status"] == "interrupted" and data["steps"] > 0


def test_replay_of_a_malformed_case_could_not_run(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a case"}')
    assert main(["replay", str(bad), "--adapter", "reference"]) == 2
    assert main(["replay", str(tmp_path / "missing.json")]) == 2


def test_adapters_lists_the_builtins(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["adapters"]) == 0
    out = capsys.readouterr().out
    for name in ("reference", "lifecycle-sim", "scheduler-sim"):
        assert name in out


def DoubleDecrementAdapter() -> ReferencePagedAdapter:
    from seeded_bugs import DoubleDecrement

    return ReferencePagedAdapter(lambda c: DoubleDecrement(c.capacity, c.block_size))


class BrokenAdapter:
    """Fails in its constructor, as an engine that cannot start."""

    def __init__(self) -> None:
        raise RuntimeError("engine failed to start")


class InterruptingAdapter:
    """Behaves like the reference adapter until the 50th operation, then the user hits Ctrl-C: SIGINT reaches
    the kit (the adapter runs in a child process; the kit is its parent)."""

    def __init__(self) -> None:
        self.inner = ReferencePagedAdapter()
        self.name, self.capabilities = "interrupting", self.inner.capabilities
        self.calls = 0

    def __getattr__(self, attr: str) -> object:
        return getattr(self.inner, attr)

    def apply(self, op: Op) -> Outcome:
        self.calls += 1
        if self.calls == 50:
            os.kill(os.getppid(), signal.SIGINT)
            time.sleep(1)  # the kit stops waiting for this answer
        return self.inner.apply(op)
