"""`kvspec check --keep-going`, the seed a run really used, and the time to its first failure."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from clirun import kvspec
from hypothesis import seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test
from seeded_bugs import DropsEntryOnFree, ShortChain

from kvspec.adapters.reference_paged import ReferencePagedAdapter
from kvspec.stateful_tests import PROFILES, Case, Options, replay_ops, run_check
from kvspec.stateful_tests.rounds import derandomized_seed


class LostHitsAndShortChain(DropsEntryOnFree, ShortChain):
    """Two bugs at once: freed blocks leave the index (index_completeness), hits are under-reported (prefix hits)."""


def two_bugs() -> ReferencePagedAdapter:
    return ReferencePagedAdapter(lambda c: LostHitsAndShortChain(c.capacity, c.block_size, hit_cap=True))


@pytest.mark.slow
def test_keep_going_reports_each_violated_invariant_once_with_its_own_replayable_case(tmp_path: Path) -> None:
    stopped = run_check(two_bugs, "two-bugs", Options(profile=PROFILES["ci"], cases_dir=tmp_path / "first"))
    assert stopped.exit_code == 1 and len(stopped.cases) == 1

    result = run_check(
        two_bugs, "two-bugs", Options(profile=PROFILES["ci"], cases_dir=tmp_path / "all", keep_going=True)
    )
    assert result.exit_code == 1
    assert result.failure is not None
    named = [result.failure.invariant, *(v.invariant for v, _, _ in result.more_failures)]
    assert {"index_completeness", "predicted_prefix_hits"} <= set(named), named
    assert len(named) == len(set(named)) == len(result.cases)
    rows = {row["name"]: row for row in result.report().verdicts()}
    for invariant, path in zip(named, result.cases, strict=True):
        assert rows[invariant]["verdict"] == "violated"
        case = Case.load(Path(path))
        assert case.expected["invariant"] == invariant
        again = replay_ops(two_bugs(), case.config, case.ops, target=invariant)  # another may break before it
        assert again is not None and again.invariant == invariant
    text = "\n".join(result.report().details)
    assert text.count("VIOLATED ") == len(named)


@pytest.mark.slow
def test_the_cli_takes_keep_going(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    run = kvspec(
        "check",
        "--adapter",
        "test_keep_going:two_bugs",
        "--keep-going",
        "--quiet",
        "--max-examples",
        "60",
        "--cases-dir",
        str(tmp_path),
        "--report",
        str(out),
    )
    assert run.code == 1, run.err
    report = json.loads(out.read_text())
    assert len(report["cases"]) >= 2
    assert len({row["name"] for row in report["invariants"] if row["verdict"] == "violated"}) >= 2


def test_a_random_run_names_its_seed_and_the_seed_replays_it(tmp_path: Path) -> None:
    profile = dataclasses.replace(PROFILES["thorough"], max_examples=5, step_count=5)
    first = run_check(ReferencePagedAdapter, "reference", Options(profile=profile, cases_dir=tmp_path))
    assert isinstance(first.seed, int) and first.report().to_json()["seed"] == first.seed
    again = run_check(ReferencePagedAdapter, "reference", Options(profile=profile, cases_dir=tmp_path, seed=first.seed))
    assert again.tally.coverage == first.tally.coverage


DRAWN: list[int] = []


class _Draws(RuleBasedStateMachine):
    """Records what it draws."""

    @rule(n=st.integers(0, 10**6))
    def draw(self, n: int) -> None:
        DRAWN.append(n)


def _draws(machine_seed: int | None) -> list[int]:
    """What ``_Draws`` draws, derandomized (None) or from ``machine_seed``."""
    DRAWN.clear()
    machine = _Draws if machine_seed is None else seed(machine_seed)(type("_Draws", (_Draws,), {}))
    run_state_machine_as_test(
        machine, settings=settings(max_examples=5, derandomize=machine_seed is None, database=None)
    )
    return list(DRAWN)


def test_the_derandomized_seed_draws_what_a_derandomized_run_draws() -> None:
    """The ci profile's reported seed is the one Hypothesis derandomizes with (on the installed version)."""
    assert _draws(None) == _draws(derandomized_seed(_Draws)) != _draws(derandomized_seed(_Draws) + 1)


def test_the_ci_profile_names_its_seed_and_the_seed_replays_it(tmp_path: Path) -> None:
    ci = dataclasses.replace(PROFILES["ci"], max_examples=5, step_count=5)
    first = run_check(ReferencePagedAdapter, "reference", Options(profile=ci, cases_dir=tmp_path))
    assert first.derandomized and isinstance(first.seed, int) and first.report().to_json()["seed"] == first.seed
    thorough = dataclasses.replace(PROFILES["thorough"], max_examples=5, step_count=5)
    again = run_check(
        ReferencePagedAdapter, "reference", Options(profile=thorough, cases_dir=tmp_path, seed=first.seed)
    )
    assert again.tally.coverage == first.tally.coverage and again.seed == first.seed


@pytest.mark.slow
def test_the_report_carries_the_time_to_the_first_failure(tmp_path: Path) -> None:
    result = run_check(two_bugs, "two-bugs", Options(profile=PROFILES["ci"], cases_dir=tmp_path, max_examples=40))
    seconds = result.report().to_json()["seconds_to_first_failure"]
    assert isinstance(seconds, float) and 0 < seconds <= result.duration_s
    clean = run_check(ReferencePagedAdapter, "reference", Options(profile=PROFILES["ci"], max_examples=5))
    assert clean.report().to_json()["seconds_to_first_failure"] is None
