"""Class 1 (hangs): a hung adapter never keeps the kit alive; every adapter call runs under the timeout.

Each test runs ``kvspec`` in a fresh process with a wall-clock limit far above the step timeout: a kit
that waits on the hung call, or on its stuck worker at interpreter exit, is killed at the limit and the
test fails.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clirun import kvspec

LIMIT = 60.0
FAST = ["--step-timeout", "2", "--max-examples", "30", "--quiet"]


@pytest.mark.parametrize("adapter", ["HangsInApply", "HangsInObserve", "HangsInFirstReset", "HangsInFirstApply"])
def test_a_hang_during_the_check_is_a_finding_and_the_kit_exits(adapter: str, tmp_path: Path) -> None:
    report = tmp_path / "report.json"
    args = ["check", "--adapter", f"faulty_adapters:{adapter}", *FAST, "--report", str(report)]
    run = kvspec(*args, "--cases-dir", str(tmp_path / "cases"), limit=LIMIT)
    assert run.code == 1, (run.code, run.seconds, run.err[-500:])
    data = json.loads(report.read_text())
    rows = {r["name"]: r for r in data["invariants"]}
    assert rows["adapter_contract"]["verdict"] == "violated"
    assert "did not return within 2 s" in json.dumps(rows["adapter_contract"]["first_violation"])
    assert len(data["cases"]) == 1


@pytest.mark.slow
def test_a_constructor_that_hangs_could_not_start_and_the_kit_exits(tmp_path: Path) -> None:
    run = kvspec("check", "--adapter", "faulty_adapters:HangsInInit", "--step-timeout", "1", limit=200)
    assert run.code == 2, (run.code, run.seconds)
    assert "did not return" in run.out + run.err


def test_a_close_that_hangs_does_not_keep_the_kit_alive(tmp_path: Path) -> None:
    run = kvspec("check", "--adapter", "faulty_adapters:HangsInClose", *FAST, limit=LIMIT)
    assert run.code is not None, f"still running after {LIMIT} s"
    assert "close" in run.out + run.err


def test_replaying_a_hang_case_reproduces_it_within_the_timeout(tmp_path: Path) -> None:
    first = kvspec(
        "check", "--adapter", "faulty_adapters:HangsInApply", *FAST, "--cases-dir", str(tmp_path), limit=LIMIT
    )
    assert first.code == 1
    (case,) = tmp_path.glob("*.json")
    again = kvspec("replay", str(case), "--step-timeout", "2", limit=LIMIT)
    assert again.code == 1, (again.code, again.out[-500:], again.err[-500:])
    assert "adapter_contract" in again.out


def test_the_pytest_plugin_fails_the_item_of_a_hung_adapter(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess(
        "--kvspec-adapter=faulty_adapters:HangsInApply",
        "--kvspec-max-examples=30",
        "--kvspec-step-timeout=2",
        timeout=LIMIT,
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*adapter_contract*violated*"])
