"""Class 2 (false passes): whatever adapter code raises or however its process ends, the kit reports a
finding (exit 1, a report saying adapter_contract) and never exits 0 or with the adapter's own code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import kvspec


@pytest.mark.parametrize("adapter", ["ExitsZeroInApply", "InterruptsInApply", "GeneratorExitInApply", "OsExitInApply"])
def test_an_adapter_that_exits_or_raises_base_exceptions_is_a_finding(adapter: str, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    run = kvspec(
        "check", "--adapter", f"faulty_adapters:{adapter}", "--max-examples", "30", "--quiet",
        "--report", str(report), "--cases-dir", str(tmp_path / "cases"), limit=120,
    )  # fmt: skip
    assert run.code == 1, (run.code, run.out[-800:], run.err[-800:])
    data = json.loads(report.read_text())
    assert data["status"] == "violated"
    verdicts = {r["name"]: r["verdict"] for r in data["invariants"]}
    assert verdicts["adapter_contract"] == "violated"
    assert "VIOLATED adapter_contract" in run.out
