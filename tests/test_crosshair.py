"""CrossHair checks the reference simulators' contracts, and finds a seeded violation of them."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import crosshair_seeded
import pytest

from kvspec.stateful_tests.crosshair_run import REFERENCE_TARGETS, crosshair_command, run_crosshair

SEEDED = Path(crosshair_seeded.__file__)


def _line_of(method: object) -> str:
    return f"{SEEDED}:{inspect.getsourcelines(method)[1]}"  # type: ignore[arg-type]


@pytest.mark.slow
def test_reference_contracts_hold_on_a_bounded_budget() -> None:
    targets = ["kvspec.reference.scheduler.SchedulerSim.score", "kvspec.reference.paged.PagedPrefixCache.allocate"]
    result = run_crosshair(targets, per_condition_timeout=1, budget=240)
    assert result.exit_code == 0, result.output[-3000:]
    assert result.counterexamples == []


@pytest.mark.slow
def test_crosshair_finds_the_seeded_contract_violations() -> None:
    targets = [_line_of(crosshair_seeded.FloorRounding.blocks_for_tokens), _line_of(crosshair_seeded.SizeBonus.score)]
    result = run_crosshair(targets, per_condition_timeout=1, budget=240)
    assert result.exit_code == 1, result.output[-3000:]
    text = "\n".join(result.counterexamples)
    assert "blocks_for_tokens" in text and "__return__ * self.block_size_tokens" in text
    assert "score(hits, size + 1, last_used)" in text


def test_an_unfinished_run_is_not_a_pass() -> None:
    result = run_crosshair(REFERENCE_TARGETS, per_condition_timeout=1, budget=0.5)
    assert result.timed_out and result.exit_code == 2


def test_the_command_runs_the_current_interpreter() -> None:
    command = crosshair_command(["kvspec.reference.paged"], 2.5)
    assert command == [
        sys.executable,
        "-m",
        "crosshair",
        "check",
        "--per_condition_timeout",
        "2.5",
        "kvspec.reference.paged",
    ]
