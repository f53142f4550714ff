"""Class 4 (adapter faults are findings): an adapter whose observe or events raises, or answers with the
wrong type, during the run is an adapter_contract violation with a saved case (exit 1); exit 2 is for an
adapter that cannot load or start. The report's status and verdicts agree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvspec.cli import main

FAULTS = [
    "ObserveRaises",
    "ObserveReturnsADict",
    "EventsReturnsNone",
    "ObservationOfWrongTypes",
    "ResetRaisesLater",
    "ObserveRaisesAtStart",
]


@pytest.mark.parametrize("adapter", FAULTS)
def test_a_fault_during_the_run_is_a_finding_with_a_case(adapter: str, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    argv = ["check", "--adapter", f"faulty_adapters:{adapter}", "--max-examples", "30", "--quiet"]
    code = main([*argv, "--report", str(report), "--cases-dir", str(tmp_path / "cases")])
    data = json.loads(report.read_text())
    assert code == 1, (data["status"], data["error"])
    assert data["status"] == "violated"
    rows = {r["name"]: r for r in data["invariants"]}
    assert rows["adapter_contract"]["verdict"] == "violated"
    assert len(data["cases"]) == 1 and Path(data["cases"][0]).exists()


def test_an_adapter_that_cannot_start_could_not_run(tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    assert main(["check", "--adapter", "test_cli:BrokenAdapter", "--quiet", "--report", str(report)]) == 2
    data = json.loads(report.read_text())
    assert data["status"] == "error" and {r["verdict"] for r in data["invariants"]} == {"unknown"}
