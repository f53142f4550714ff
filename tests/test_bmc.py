"""Bounded model checking, k-induction, the every-N abstraction and the Z3 coverage scenarios.

"It bites": each seeded bug of the stateful suite, expressed on the spec's Z3
encoding, yields a shortest counterexample naming the bug's invariant; the same
op sequence replayed on the buggy reference implementation breaks the same
invariant, and on the correct one holds.
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import z3
from seeded_bugs import PAGED_BUGS
from symbolic_bugs import VARIANTS, BuggyEncoding, EvictReferenced, FloorRounding, LostOnReclaim

from kvspec.adapters.reference_paged import ReferencePagedAdapter
from kvspec.cli.formal import register
from kvspec.spec.formal.bmc import bmc, inductive_lemmas, prove
from kvspec.spec.formal.goals import GOALS, reach
from kvspec.spec.formal.parametric import check_refinement, prove_every_n
from kvspec.spec.formal.symbolic import SEMANTICS, Bounds, Encoding, SymTransition
from kvspec.spec.ledger import LedgerModel
from kvspec.stateful_tests import PROFILES, Case, Options, replay_ops, run_check
from kvspec.stateful_tests.bounded import DEFAULT_BOUNDS, DEFAULT_DEPTH, coverage_cases, generate, load

SMALL = Bounds(blocks=3, requests=2)


def test_bmc_holds_on_the_spec() -> None:
    result = bmc(SMALL, 3)
    assert result.holds and result.complete and result.depth == 3


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
@pytest.mark.slow
def test_each_seeded_spec_bug_yields_a_counterexample_that_bites_the_implementation(
    variant: type[BuggyEncoding],
) -> None:
    bug, expected = variant.name, variant.invariant
    result = bmc(SMALL, 6, variant=variant, time_limit=120)
    cex = result.counterexample
    assert cex is not None, f"BMC found no counterexample for {bug} up to depth {result.depth}"
    assert expected in cex.invariants
    assert len(cex.ops) == result.depth <= 6
    # Shortest: one op fewer holds.
    if len(cex.ops) > 1:
        shorter = bmc(SMALL, len(cex.ops) - 1, variant=variant, invariants=cex.invariants)
        assert shorter.holds and shorter.complete
    # The case replays: the buggy reference implementation breaks the same invariant, the correct one holds.
    seeded = next(b for b in PAGED_BUGS if b.name == bug)
    violation = replay_ops(seeded.factory(), SMALL.config, cex.ops)
    assert violation is not None and expected in violation.failures, f"{bug}: {violation}"
    assert replay_ops(seeded.correct(), SMALL.config, cex.ops) is None


def test_bmc_stops_at_its_time_limit_and_says_so() -> None:
    result = bmc(Bounds(blocks=6, requests=3), 40, time_limit=2)
    assert result.holds and not result.complete and result.depth < 40


@pytest.mark.slow
def test_every_invariant_is_proved_by_induction() -> None:
    aux, proofs = prove(SMALL)
    assert aux.proved
    assert {p.invariant for p in proofs if p.proved} == {p.invariant for p in proofs}
    alone = {p.invariant for p in proofs if not p.strengthened}
    assert alone == {"atomic_failure", "bad_input_rejected", "hit_keeps_key"}, "only these hold from every state"
    assert all(p.k == 1 for p in proofs)


def test_induction_refutes_a_seeded_bug() -> None:
    aux, proofs = prove(SMALL, ["tail_rounding"], variant=FloorRounding)
    assert not aux.proved
    [proof] = proofs
    assert not proof.proved and proof.counterexample is not None
    assert proof.counterexample.invariants == ["tail_rounding"]


@pytest.mark.slow
def test_houdini_keeps_every_lemma_of_the_spec_and_drops_the_ones_a_bug_breaks() -> None:
    spec = inductive_lemmas(Encoding(SMALL))
    assert spec.dropped == 0 and spec.conjuncts
    buggy = inductive_lemmas(EvictReferenced(SMALL))
    assert buggy.dropped > 0
    result = bmc(SMALL, 4, variant=EvictReferenced, lemmas=True)
    assert result.counterexample is not None and "no_active_eviction" in result.counterexample.invariants


def test_capacity_is_conserved_for_every_pool_size() -> None:
    assert prove_every_n().proved
    assert check_refinement(SMALL).holds
    assert not check_refinement(SMALL, variant=LostOnReclaim).holds


# -- coverage goals -----------------------------------------------------------------------------------


def _reaches(bounds: Bounds, ops: list, goal_name: str) -> bool:  # type: ignore[type-arg]
    """Replay ``ops`` on the Python spec; does the last step satisfy the goal's formula?"""
    enc = Encoding(bounds)
    goal = next(g for g in GOALS if g.name == goal_name)
    model = LedgerModel(bounds.config, SEMANTICS)
    for op in ops[:-1]:
        model.step(op)
    before, sym_op, after = enc.encode_model(model), enc.encode_op(ops[-1]), enc.state("after")
    step = enc.step(before, sym_op)
    tr = SymTransition(before, sym_op, type(step)(step.status, step.hit_blocks, step.evicted, step.reclaimed, after))
    solver = z3.Solver()
    solver.add(after.eq(step.after), goal.formula(enc, tr))
    return solver.check() == z3.sat


def test_the_committed_scenarios_reach_every_goal_on_the_spec_and_hold_on_the_reference() -> None:
    scenarios = load(DEFAULT_BOUNDS, DEFAULT_DEPTH)
    assert scenarios is not None, "run `kvspec scenarios` to regenerate the bundle"
    assert scenarios.unreached == []
    assert sorted(c.expected["goal"] for c in scenarios.cases) == sorted(g.name for g in GOALS)
    for case in scenarios.cases:
        assert _reaches(DEFAULT_BOUNDS, case.ops, case.expected["goal"]), case.expected["goal"]
        assert replay_ops(ReferencePagedAdapter(), case.config, case.ops) is None, case.expected["goal"]
        assert Case.from_json(json.loads(json.dumps(case.to_json()))).ops == case.ops


def test_generated_scenarios_are_shortest() -> None:
    goal = next(g for g in GOALS if g.name == "preempt_then_resume_with_hit")
    reached = reach(SMALL, goal, 6)
    assert reached.ops is not None and [op.op for op in reached.ops] == ["admit", "preempt", "resume"]
    fresh = generate(SMALL, 4, goals=[goal])
    assert [[op.op for op in c.ops] for c in fresh.cases] == [["admit", "preempt", "resume"]]
    assert fresh.cases[0].expected["goal"] == goal.name and fresh.unreached == []
    assert generate(SMALL, 2, goals=[goal]).unreached == [goal.name], "three ops are needed"


def test_coverage_cases_are_filtered_by_the_adapters_operations() -> None:
    every = coverage_cases()
    admit_only = coverage_cases(ops={"admit", "append", "release"})
    assert len(every) == len(GOALS)
    assert 0 < len(admit_only) < len(every)
    assert all(op.op in {"admit", "append", "release"} for c in admit_only for op in c.ops)


def test_check_replays_the_scenarios_before_the_random_phase_and_they_catch_a_bug() -> None:
    cases = coverage_cases()
    clean = run_check(
        ReferencePagedAdapter, "reference", Options(profile=PROFILES["ci"], max_examples=2), extra_cases=cases
    )
    assert clean.status == "passed"
    assert clean.tally.steps >= sum(len(c.ops) for c in cases)
    seeded = next(b for b in PAGED_BUGS if b.name == "evict-referenced")
    caught = run_check(
        seeded.factory, "evict-referenced", Options(profile=PROFILES["ci"], max_examples=2), extra_cases=cases
    )
    assert caught.status == "violated"
    assert caught.tally.examples <= len(cases), "caught by a Z3 scenario, before the random phase"


# -- the command line ----------------------------------------------------------------------------------


def _kvspec(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="kvspec")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    code: int = args.handler(args)
    return code


def test_cli_bmc_exit_codes_and_replayable_case(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _kvspec("bmc", "--blocks", "3", "--depth", "2", "--quiet") == 0
    assert "holds up to 2" in capsys.readouterr().out
    code = _kvspec(
        "bmc", "--blocks", "3", "--depth", "4", "--variant", "symbolic_bugs:ShareCopies", "--cases-dir", str(tmp_path)
    )
    out = capsys.readouterr().out
    assert code == 1 and "share_without_duplication" in out
    [path] = tmp_path.glob("*.json")
    case = Case.load(path)
    assert case.expected["invariant"] == "share_without_duplication" and case.config.capacity == 3
    assert replay_ops(ReferencePagedAdapter(), case.config, case.ops) is None
    assert _kvspec("bmc", "--blocks", "3", "--variant", "no_such_module:X") == 2
    assert _kvspec("bmc", "--blocks", "6", "--requests", "3", "--depth", "30", "--time-limit", "1", "--quiet") == 2


@pytest.mark.slow
def test_cli_bmc_and_prove_write_the_kits_report(tmp_path: Path) -> None:
    """bmc and prove end in the same report as every check: held rows, a violated row with its case, exit codes."""
    held, junit = tmp_path / "held.json", tmp_path / "held.xml"
    assert _kvspec("bmc", "--blocks", "3", "--depth", "2", "--quiet", "--report", str(held), "--junit", str(junit)) == 0
    data = json.loads(held.read_text())
    assert data["status"] == "passed" and data["formal"]["depth_reached"] == 2
    assert {r["verdict"] for r in data["invariants"]} == {"held"}
    assert all(r["checked_steps"] == 2 for r in data["invariants"])
    assert ET.parse(junit).getroot().get("failures") == "0"

    broken = tmp_path / "broken.json"
    argv = ["bmc", "--blocks", "3", "--depth", "4", "--variant", "symbolic_bugs:ShareCopies"]
    assert _kvspec(*argv, "--quiet", "--cases-dir", str(tmp_path), "--report", str(broken)) == 1
    data = json.loads(broken.read_text())
    rows = {r["name"]: r for r in data["invariants"]}
    assert data["status"] == "violated" and data["formal"]["variant"] == "symbolic_bugs:ShareCopies"
    assert rows["share_without_duplication"]["verdict"] == "violated"
    assert rows["share_without_duplication"]["first_violation"]["ops"]
    assert [Path(p).exists() for p in data["cases"]] == [True]

    only = tmp_path / "only.json"
    assert _kvspec("bmc", "--blocks", "3", "--depth", "1", "--invariant", "tail_rounding", "--report", str(only)) == 0
    verdicts = {r["name"]: r["verdict"] for r in json.loads(only.read_text())["invariants"]}
    assert verdicts.pop("tail_rounding") == "held" and set(verdicts.values()) == {"unknown"}

    proved = tmp_path / "proved.json"
    assert _kvspec("prove", "--blocks", "3", "--invariant", "tail_rounding", "--report", str(proved)) == 0
    data = json.loads(proved.read_text())
    assert data["status"] == "passed" and data["profile"] == "prove"
    assert {r["name"] for r in data["invariants"]} >= {"tail_rounding", "capacity_conservation_every_n"}
