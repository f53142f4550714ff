"""``kvspec prove --engine pdr``'s time limit is a hard wall-clock stop per invariant.

Spacer's own timeout is a cancellation it checks only now and then (a 30 s limit once ran
9.5 minutes), so each invariant's query runs in a forked child that is killed at the
limit. A query Spacer cannot answer in two seconds (tail_rounding at N=3, R=1, B=1: unknown
after 60 s, docs/formal.md) must come back unknown, marked as stopped by the time limit,
soon after the limit, with no solver process left behind; the CLI says so and exits 2 (not
proved within the limits, report.py's contract), and its report records it.

Backward (``--direction backward``), Spacer's relation is the states from which a violation
is reachable: a proof is its complement, checked like a forward one; a refutation is a case.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

import z3
from clirun import kvspec

from kvspec.report import ExitCode
from kvspec.spec.formal.pdr import prove_pdr
from kvspec.spec.formal.symbolic import Bounds

HARD = Bounds(blocks=3, requests=1, block_size=1)
SLACK_S = 10.0
"""Loose on purpose: this checks that the stop happens, not how fast (the machine is shared)."""


def test_a_query_past_its_time_limit_is_stopped_and_reported_unknown() -> None:
    t0 = time.monotonic()
    (proof,) = prove_pdr(HARD, ["tail_rounding"], time_limit=2.0)
    elapsed = time.monotonic() - t0
    assert proof.verdict == "unknown" and proof.timed_out and not proof.proved, proof
    assert "time limit" in proof.note
    assert 2.0 <= proof.seconds <= elapsed < 2.0 + SLACK_S
    assert not multiprocessing.active_children()  # the child running Spacer was killed and reaped


def test_an_answer_within_the_limit_is_not_marked_as_stopped() -> None:
    (proof,) = prove_pdr(Bounds(blocks=2, requests=1, block_size=1), ["bad_input_rejected"], time_limit=30.0)
    assert proof.proved and not proof.timed_out and proof.inductive is not None, proof


def test_the_cli_prints_the_time_limit_and_exits_could_not_run(tmp_path: Path) -> None:
    report = tmp_path / "pdr.json"
    args = ["prove", "--engine", "pdr", "--blocks", "3", "--requests", "1", "--block-size", "1"]
    run = kvspec(*args, "--invariant", "tail_rounding", "--time-limit", "2", "--report", str(report))
    assert run.code == ExitCode.COULD_NOT_RUN, run.out + run.err
    assert "unknown (time limit)" in run.out, run.out
    data = json.loads(report.read_text())
    assert data["status"] == "error" and "tail_rounding" in data["error"]
    entry = data["formal"]["invariants"]["tail_rounding"]
    assert entry["verdict"] == "unknown" and entry["timed_out"] is True
    assert data["formal"]["time_limit_s"] == 2.0
    run = kvspec(*args, "--time-limit", "0")
    assert run.code == ExitCode.COULD_NOT_RUN and run.err.startswith("kvspec:"), run.err
    assert len(run.err.strip().splitlines()) == 1, run.err


SMALLEST = Bounds(blocks=2, requests=1, block_size=1)


def test_a_backward_proof_is_the_complement_of_what_can_reach_a_violation_and_is_checked() -> None:
    """Backward, Spacer's relation over-approximates the states from which a violation is reachable;
    its complement is the inductive invariant, and the independent check proves that of it."""
    proofs = prove_pdr(SMALLEST, ["bad_input_rejected", "atomic_failure"], time_limit=60, direction="backward")
    for p in proofs:
        assert p.proved and p.inductive is not None, p


def test_the_cli_refutes_a_variant_backward_and_saves_the_case(tmp_path: Path) -> None:
    cases = tmp_path / "cases"
    args = ["prove", "--engine", "pdr", "--blocks", "2", "--requests", "1", "--block-size", "1"]
    args += ["--invariant", "bad_input_rejected", "--direction", "backward", "--cases-dir", str(cases)]
    run = kvspec(*args, "--variant", "symbolic_bugs:SilentDoubleRelease")
    assert run.code == ExitCode.VIOLATED and "VIOLATED" in run.out and "backward" in run.out, run.out + run.err
    (saved,) = cases.glob("*.json")
    expected = json.loads(saved.read_text())["expected"]
    assert expected["invariant"] == "bad_input_rejected" and expected["variant"] == "symbolic_bugs:SilentDoubleRelease"
    run = kvspec("prove", "--variant", "symbolic_bugs:SilentDoubleRelease")
    assert run.code == ExitCode.COULD_NOT_RUN and len(run.err.strip().splitlines()) == 1, run.err


def test_with_the_inductive_lemmas_spacer_proves_no_active_eviction_and_the_check_covers_them() -> None:
    """With two requests Spacer alone gives up on no_active_eviction (N=2, R=2, B=2: unknown after
    60 s, docs/formal.md); given the auxiliary conjuncts Houdini keeps, it proves it at N=2, R=2,
    B=1, and the invariant the independent check proves contains them."""
    pool = Bounds(blocks=2, requests=2, block_size=1)
    (proof,) = prove_pdr(pool, ["no_active_eviction"], time_limit=60, lemmas=True)
    assert proof.proved and proof.assumed > 0, proof
    assert proof.inductive is not None and z3.is_and(proof.inductive)
