"""The swarm explorer (``kvspec check --engine swarm``, stateful_tests/swarm.py) against the seeded-bug catalogue.

Every seeded bug must be found by the invariant it breaks, minimised by replay to a case
that is 1-minimal (dropping any one op loses the failure), replays on the buggy adapter
and holds on the correct one; a run is a function of its seed; a failure kept in the
example database is the first example the Hypothesis engine runs.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest
from seeded_bugs import SEEDED_BUGS, SeededBug
from test_seeded_bugs import SEEDED_PROFILE, refines, replay

from kvspec import schemas
from kvspec.adapter import Capabilities
from kvspec.adapters import load
from kvspec.adapters.reference_paged import ReferencePagedAdapter
from kvspec.cli import main
from kvspec.spec import Op, Outcome, Semantics
from kvspec.stateful_tests import Case, Options, replay_ops, run_check
from kvspec.stateful_tests.case_db import kept_cases
from kvspec.stateful_tests.example_db import open_example_db
from kvspec.stateful_tests.swarm import MOVES, SHAPES, draw_swarm, run_swarm

# Bugs of an eviction order whose first failing walk breaks policy_conformance with the spec's prediction still
# right on that step (measured: the declared order and the spec's prediction judge different things there). They
# run with keep_going, and their own invariant must be among those reported.
ANOTHER_FIRST = {"lifecycle-plain-lru", "scheduler-stale-blind", "scheduler-evicts-largest", "scheduler-forgets-reuse"}


def reported(result: object) -> set[str]:
    failure = getattr(result, "failure", None)
    more = getattr(result, "more_failures", [])
    return ({failure.invariant} if failure is not None else set()) | {v.invariant for v, _, _ in more}


@pytest.mark.parametrize("bug", SEEDED_BUGS, ids=[b.name for b in SEEDED_BUGS])
def test_swarm_finds_the_seeded_bug_and_its_case_is_one_minimal(bug: SeededBug, tmp_path: Path) -> None:
    """The bug's invariant reports it; the saved case replays on the buggy adapter, holds on the correct one, and
    is 1-minimal: without any one of its ops the same invariant no longer breaks."""
    refine = refines(bug)
    keep_going = bug.name in ANOTHER_FIRST
    result = run_swarm(
        bug.factory, bug.name, Options(profile=SEEDED_PROFILE, cases_dir=tmp_path, refine=refine, keep_going=keep_going)
    )
    assert result.exit_code == 1, (result.status, result.error)
    assert result.failure is not None and result.failure_config is not None
    if keep_going:
        assert bug.invariant in reported(result), reported(result)
    else:
        assert result.failure.invariant in {bug.named_first or bug.invariant, *bug.symptoms}, result.failure
        assert ({bug.invariant} | bug.symptoms) & set(result.failure.failures)
    assert not [f for f in result.findings if f["kind"] == "flaky"], result.findings
    report = result.report().to_json()
    schemas.check(report, "report")
    assert report["engine"] == "swarm" and report["swarm"]["failing_swarm"]["moves"]

    case = Case.load(Path(result.cases[0]))
    assert case.ops == result.failure_ops
    target = result.failure.invariant if keep_going else None  # keep-going: others may break before it
    again = replay(bug.factory, case, refine=refine, target=target)
    assert again is not None and again.invariant == result.failure.invariant
    assert again.step == len(case.ops) - 1
    assert replay(bug.correct, case, refine=True) is None
    fresh = bug.factory()
    try:
        for i in range(len(case.ops)):
            shorter = case.ops[:i] + case.ops[i + 1 :]
            lost = replay_ops(fresh, case.config, shorter, refine=refine, target=target) if shorter else None
            assert lost is None or lost.invariant != result.failure.invariant, f"op {i} can be dropped"
    finally:
        fresh.close()


def test_a_run_is_a_function_of_its_seed(tmp_path: Path) -> None:
    """The same seed walks the same ops (the same counts, states and failure); another seed walks others."""

    def run(seed: int) -> tuple[object, ...]:
        states: set[object] = set()
        result = run_swarm(
            load("reference"),
            "reference",
            Options(profile=SEEDED_PROFILE, seed=seed, max_examples=30, cases_dir=tmp_path),
            states=states,
        )
        assert result.exit_code == 0, result.report().table()
        return result.tally.steps, dict(result.tally.coverage), len(states)

    assert run(5) == run(5)
    assert run(5) != run(6)
    bug = next(b for b in SEEDED_BUGS if b.name == "forget-decrement")
    first = run_swarm(bug.factory, bug.name, Options(profile=SEEDED_PROFILE, seed=9, cases_dir=tmp_path, refine=False))
    second = run_swarm(bug.factory, bug.name, Options(profile=SEEDED_PROFILE, seed=9, cases_dir=tmp_path, refine=False))
    assert first.failure_ops and first.failure_ops == second.failure_ops
    assert first.failure_config == second.failure_config
    assert first.tally.first_failure_at == second.tally.first_failure_at


def test_each_walk_draws_a_subset_of_moves_and_shapes() -> None:
    """Swarm testing: admit in every walk, every other move and every shape left out by some walks, used by others."""
    caps = Capabilities(Semantics(), contracts=frozenset({"release:repeated"}))
    swarms = [draw_swarm(random.Random(i), caps) for i in range(200)]
    assert all("admit" in s.moves and s.shapes for s in swarms)
    for move in MOVES[1:]:
        assert 0 < sum(move in s.moves for s in swarms) < len(swarms), move
    for shape in SHAPES:
        assert 0 < sum(shape in s.shapes for s in swarms) < len(swarms), shape
    no_contracts = Capabilities(Semantics(), ops=frozenset({"admit", "release"}))
    assert {m for i in range(50) for m in draw_swarm(random.Random(i), no_contracts).moves} == {
        "admit",
        "finish_oldest",
        "release",
        "bad_input",
    }


def test_a_swarm_failure_is_the_first_example_the_hypothesis_engine_runs(tmp_path: Path) -> None:
    """The swarm keeps its case in the example database; the Hypothesis engine replays it before anything else
    (its first example fails, with the same invariant); once the adapter is fixed the case holds and is dropped."""
    bug = next(b for b in SEEDED_BUGS if b.name == "forget-decrement")
    db = tmp_path / "db"
    found = run_swarm(bug.factory, bug.name, Options(profile=SEEDED_PROFILE, cases_dir=tmp_path, example_db=db))
    assert found.failure is not None
    database = open_example_db(db, bug.name)
    assert database is not None
    (kept,) = kept_cases(database)
    assert kept.ops == found.failure_ops and kept.config == found.failure_config

    again = run_check(
        bug.factory, bug.name, Options(profile=SEEDED_PROFILE, cases_dir=tmp_path, example_db=db, max_examples=5)
    )
    assert again.exit_code == 1 and again.kept_cases == 1
    assert again.tally.first_failure_at == (1, len(kept.ops))  # the first example, on its last op
    assert again.failure is not None and again.failure.invariant == found.failure.invariant
    assert again.report().to_json()["kept_cases"] == 1

    fixed = run_check(
        bug.correct, bug.name, Options(profile=SEEDED_PROFILE, cases_dir=tmp_path, example_db=db, max_examples=5)
    )
    assert fixed.exit_code == 0 and fixed.kept_cases == 1
    assert kept_cases(database) == []


def test_check_engine_swarm_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``kvspec check --engine swarm``: exit 1 on a seeded bug with the invariant named, its case replays; exit 0
    on the reference; the report says which engine ran and is schema-valid."""
    report = tmp_path / "r.json"
    args = ["check", "--engine", "swarm", "--quiet", "--cases-dir", str(tmp_path), "--report", str(report)]
    assert main([*args, "--adapter", "seeded_bugs:forget_decrement", "--safety-only"]) == 1
    out = capsys.readouterr().out
    assert "VIOLATED ref_count_matches_references" in out and "engine swarm" in out
    data = json.loads(report.read_text())
    schemas.check(data, "report")
    assert data["engine"] == "swarm" and data["status"] == "violated"
    assert main(["replay", data["cases"][0]]) == 1
    assert main([*args, "--adapter", "reference", "--max-examples", "20"]) == 0
    assert json.loads(report.read_text())["swarm"]["walks"] == 20
    with pytest.raises(SystemExit) as usage:
        main([*args, "--engine", "chess"])
    assert usage.value.code == 2


class WithContracts(ReferencePagedAdapter):
    """The reference, declaring two misuse contracts that it keeps: a contract op is run as the plain op."""

    capabilities = dataclasses.replace(
        ReferencePagedAdapter.capabilities, contracts=frozenset({"release:repeated", "preempt:repeated"})
    )


class RepeatedReleaseFails(WithContracts):
    """A repeated free is not idempotent: the second free of the same request is what the caller sees."""

    def apply(self, op: Op) -> Outcome:
        outcome = super().apply(op)
        if op.op == "release" and op.contract == "repeated":
            return super().apply(op)
        return outcome


def test_swarm_walks_declared_contracts_and_finds_a_broken_one(tmp_path: Path) -> None:
    """An adapter's misuse contracts are moves of the swarm too: kept, they hold; broken, the invariant says so."""
    kept = run_swarm(WithContracts, "contracts", Options(profile=SEEDED_PROFILE, cases_dir=tmp_path, max_examples=60))
    assert kept.exit_code == 0, kept.report().table()
    assert kept.tally.coverage["contract:release:repeated:ok"] and kept.tally.coverage["contract:preempt:repeated:ok"]
    broken = run_swarm(RepeatedReleaseFails, "broken", Options(profile=SEEDED_PROFILE, cases_dir=tmp_path))
    assert broken.exit_code == 1 and broken.failure is not None
    assert broken.failure.invariant == "bad_input_rejected", broken.failure
    assert broken.failure_ops[-1].contract == "repeated"


# -- the next op sent ahead (Harness.step's ``then``, IsolatedAdapter.send_ahead) ------------------------------


def test_a_hang_of_the_op_sent_ahead_is_reported_at_its_own_step(tmp_path: Path) -> None:
    """HangsInApply hangs on the 4th apply of an example; that op was sent to the child while step 3 was judged,
    yet the hang is the 4th step's: the case is the first four ops, the 4th named."""
    from faulty_adapters import HangsInApply

    result = run_swarm(HangsInApply, "hangs", Options(profile=SEEDED_PROFILE, cases_dir=tmp_path, step_timeout=1.0))
    assert result.status == "violated"
    first = result.tally.first_violation["adapter_contract"]
    assert first["step"] == 3 and "did not return within 1 s" in first["problems"][0]
    assert len(result.failure_ops) == 4 and first["op"] == result.failure_ops[3].to_json()


def test_an_answer_sent_ahead_that_no_step_takes_is_dropped_before_the_next_call() -> None:
    """The walk ended before the op sent ahead was taken (its step before broke an invariant): the child's next
    call gets its own answer, whether the dropped op answered, raised or hung (then a fresh child)."""
    from faulty_adapters import HangsInApply

    from kvspec.adapters.isolation import CallTimeout, IsolatedAdapter, RemoteError
    from kvspec.spec import Config

    class RaisesOnR9(ReferencePagedAdapter):
        def apply(self, op: Op) -> Outcome:
            if op.req == "r9":
                raise KeyError(op.req)
            return super().apply(op)

    config = Config(capacity=8, block_size=2)
    ops = [Op("admit", f"r{i}", (i, i + 1, i + 2)) for i in range(5)]
    with IsolatedAdapter(RaisesOnR9, timeout=5.0) as adapter:
        adapter.reset(config)
        adapter.send_ahead(ops[0])
        adapter.reset(config)  # ops[0]'s answer dropped: reset's own answer, an empty pool
        assert adapter.observe().requests == {}
        adapter.send_ahead(ops[1])
        outcome, _, obs = adapter.step(ops[1])  # taken by its own step
        assert outcome.status == "ok" and list(obs.requests) == ["r1"]
        adapter.send_ahead(Op("release", "r9"))  # raises in the child (unknown request), never taken
        assert adapter.observe().requests.keys() == {"r1"}
        raising = Op("release", "r9")
        adapter.send_ahead(raising)
        with pytest.raises(RemoteError, match="r9"):  # what the op sent ahead raised is raised by its own step
            adapter.step(raising)
        assert adapter.observe().requests.keys() == {"r1"}
    with IsolatedAdapter(HangsInApply, timeout=1.0) as adapter:
        adapter.reset(config)
        for op in ops[:3]:
            adapter.step(op)
        adapter.send_ahead(ops[3])  # the 4th apply hangs
        adapter.reset(config)  # dropped under its timeout, the child killed, a fresh one forked
        assert adapter.step(ops[4])[0].status == "ok"
        adapter.reset(config)
        for op in ops[:3]:
            adapter.step(op)
        adapter.send_ahead(ops[3])
        with pytest.raises(CallTimeout):
            adapter.step(ops[3])


def test_sending_the_next_op_ahead_changes_no_walk(tmp_path: Path) -> None:
    """Isolated, the reference adapter gets each next op while its step is judged; in-process nothing is sent
    ahead. The walks must be the same op for op: same coverage, same counts, same abstract states."""
    runs = []
    for isolate in (True, False):
        states: set[object] = set()
        result = run_swarm(
            load("reference"),
            "reference",
            Options(profile=SEEDED_PROFILE, seed=3, max_examples=30, cases_dir=tmp_path, isolate=isolate),
            states=states,
        )
        assert result.status == "passed"
        runs.append((result.tally.steps, result.tally.coverage, result.tally.checked, states))
    assert runs[0] == runs[1]
