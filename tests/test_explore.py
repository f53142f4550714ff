"""The explicit-state search (``kvspec explore``) and the Spacer proofs (``kvspec prove --engine pdr``).

The search must agree with the Z3 encoding on how many states are reachable within a
depth (all-SAT over the BMC unrolling, without symmetry reduction), its symmetry
reduction must only merge states, it must find a seeded bug in a variant of the
spec's own ledger with a shortest counterexample, and, driving the buggy reference
implementations of tests/seeded_bugs.py through the reachable states, it must catch
every paged bug the BMC finds, naming its invariant. Spacer must prove the invariants
it can at the smallest pool, with an inductive invariant that an independent check
confirms, and refute a seeded variant.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import z3
from clirun import kvspec
from seeded_bugs import PAGED_BUGS
from symbolic_bugs import VARIANTS, BuggyEncoding, SilentDoubleRelease

from kvspec.case import Case
from kvspec.spec.formal.bmc import Path as Unrolled
from kvspec.spec.formal.explore import ExploreResult, canonical, explore, spec_model
from kvspec.spec.formal.pdr import check_inductive, prove_pdr
from kvspec.spec.formal.symbolic import SEMANTICS, Bounds, Encoding
from kvspec.spec.formal.symbolic_invariants import SAFETY
from kvspec.spec.ledger import BlockLedger, Step
from kvspec.spec.ops import Op, Outcome
from kvspec.stateful_tests import replay_ops
from kvspec.stateful_tests.reachable import drive

TINY = Bounds(blocks=2, requests=1)
PAIR = Bounds(blocks=2, requests=2)


def z3_reachable(bounds: Bounds, depth: int) -> int:
    """Distinct states of the Z3 encoding after ``depth`` ops from the empty pool (hit counts left out).

    Bad input changes nothing and some op is always bad input, so these are the states within ``depth``.
    """
    enc = Encoding(bounds)
    solver = z3.SolverFor("QF_BV")
    path = Unrolled(enc, solver)
    for _ in range(depth):
        path.extend()
    last = path.states[-1]
    hits = {t.get_id() for t in last.hits}
    projected = [t for t in last.terms() if t.get_id() not in hits]
    count = 0
    while solver.check() == z3.sat:
        model = solver.model()
        count += 1
        solver.add(z3.Or(*[t != model.eval(t, model_completion=True) for t in projected]))
    return count


@pytest.mark.parametrize("depth", [1, 2, 3])
def test_explore_and_the_z3_encoding_reach_the_same_number_of_states(depth: int) -> None:
    raw = explore(TINY, depth, reduce=False)
    assert raw.counterexample is None and raw.depth == depth
    assert raw.distinct == z3_reachable(TINY, depth)


def test_the_whole_reachable_space_of_a_small_pool_holds_and_symmetry_only_merges() -> None:
    reduced = explore(TINY, 50)
    raw = explore(TINY, 50, reduce=False)
    assert reduced.complete and raw.complete and reduced.counterexample is None
    assert reduced.depth <= raw.depth and 1 < reduced.distinct < raw.distinct
    assert reduced.diameter == reduced.depth - 1 and raw.diameter == raw.depth - 1  # the last depth added nothing
    # Symmetry only merges: the canonical forms of the states reached without it are exactly the states with it.
    assert canonical_forms(raw) == set(reduced.tree)
    # Every safety invariant is judged on every transition; the refinement checks, which compare an
    # implementation with the spec's own step, on none (the spec is its own prediction).
    assert raw.checked["no_active_eviction"] == raw.checked["capacity_conservation"] == raw.states
    assert raw.checked["predicted_admission"] == 0


def canonical_forms(raw: ExploreResult) -> set[object]:
    """The canonical forms of the states a search without symmetry reduction reached (each replayed)."""
    merged = set()
    for state in raw.tree:
        model = spec_model(raw.bounds)
        for op in raw.path(state):
            model.step(op)
        merged.add(canonical(model, raw.bounds))
    return merged


@pytest.mark.parametrize(("bounds", "depth"), [(PAIR, 3), (Bounds(blocks=3, requests=1), 3)], ids=["N2R2d3", "N3R1d3"])
def test_one_op_per_orbit_reaches_the_same_canonical_states_as_every_op(bounds: Bounds, depth: int) -> None:
    """The op-orbit reduction is sound and the trie symmetry only merges, at every depth."""
    orbit = explore(bounds, depth)
    every = explore(bounds, depth, orbits=False)
    raw = explore(bounds, depth, reduce=False)
    assert orbit.states < every.states < raw.states  # fewer transitions expanded, not fewer states
    assert orbit.layers == every.layers and set(orbit.tree) == set(every.tree)
    assert canonical_forms(raw) == set(orbit.tree)
    assert orbit.counterexample is None and orbit.depth == raw.depth == depth


def test_token_strings_are_one_state_up_to_a_renaming_of_the_trie() -> None:
    """One prompt of two tokens is one state whatever its tokens; two prompts are two states when one
    shares its first token with the other and the other does not (the trie's shape differs)."""

    def after(*prompts: tuple[int, ...]) -> object:
        model = spec_model(PAIR)
        for i, p in enumerate(prompts):
            assert model.step(Op("admit", f"r{i}", p)).outcome.status == "ok"
        return canonical(model, PAIR)

    assert after((0, 1)) == after((1, 1)) == after((1, 0)) != after((1, 0, 1))
    assert after((0, 0), (0, 1)) == after((1, 1), (1, 0)) != after((0, 0), (1, 1))


class SilentRelease(BlockLedger):
    """A seeded bug in the spec's own ledger: a release of an unknown request is answered ok."""

    def step(self, op: Op) -> Step:
        if op.op == "release" and op.req not in self.requests:
            self.clock += 1
            return Step(Outcome.ok(), (), (), self.free)
        return super().step(op)


def silent_release(bounds: Bounds) -> BlockLedger:
    return SilentRelease(bounds.config, spec_model(bounds).semantics)


def test_explore_finds_a_seeded_bug_in_a_variant_of_the_spec_with_a_shortest_case() -> None:
    result = explore(TINY, 10, model=silent_release)
    cex = result.counterexample
    assert cex is not None and cex.invariants == ["bad_input_rejected"]
    assert len(cex.ops) == 1 and cex.ops[0].op == "release" and result.depth == 1


@pytest.fixture(scope="module")
def pair_space() -> ExploreResult:
    return explore(PAIR, 3)


@pytest.fixture(scope="module")
def pair_space_newest() -> ExploreResult:
    return explore(PAIR, 3, semantics=replace(SEMANTICS, duplicate_keys="newest"))


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
def test_driving_each_seeded_paged_bug_through_the_reachable_states_catches_it(
    pair_space: ExploreResult, pair_space_newest: ExploreResult, variant: type[BuggyEncoding]
) -> None:
    """Each paged bug the BMC finds (symbolic_bugs), on the spec of the semantics its implementation declares."""
    bug = next(b for b in PAGED_BUGS if b.name == variant.name)
    space = pair_space_newest if variant.duplicate_keys == "newest" else pair_space
    out = drive(bug.factory(), space, refine=False)
    assert out.violation is not None, f"{bug.name}: not caught in {out.states} states"
    assert variant.invariant in out.violation.failures, f"{bug.name}: {out.violation.failures}"
    assert replay_ops(bug.factory(), PAIR.config, out.violation.ops) is not None  # the path replays
    assert replay_ops(bug.correct(), PAIR.config, out.violation.ops) is None


def test_the_correct_reference_is_driven_through_every_reachable_state(pair_space: ExploreResult) -> None:
    correct = PAGED_BUGS[0].correct()
    out = drive(correct, pair_space)
    assert out.violation is None and out.hung is None
    assert out.states == len(pair_space.tree)  # every state of the search tree, each once


def test_cli_explore_report_and_case(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    run = kvspec("explore", "--blocks", "2", "--requests", "1", "--report", str(report))
    assert run.code == 0, run.out + run.err
    data = json.loads(report.read_text())
    formal = data["formal"]
    assert data["status"] == "passed" and formal["complete"] and formal["distinct_states"] == explore(TINY, 50).distinct
    assert formal["diameter"] == explore(TINY, 50).diameter and "(diameter " in run.out
    assert any(r["name"] == "no_active_eviction" and r["verdict"] == "held" for r in data["invariants"])
    run = kvspec("explore", "--blocks", "2", "--requests", "1", "--depth", "2", "--adapter", "reference", "--quiet")
    assert run.code == 0 and "driven through" in run.out, run.out + run.err
    run = kvspec("explore", "--blocks", "0")
    assert run.code == 2 and run.err.strip().startswith("kvspec:") and len(run.err.strip().splitlines()) == 1, run.err
    bug = "seeded_bugs:forget_decrement"
    cases = tmp_path / "cases"
    run = kvspec(
        "explore", "--blocks", "2", "--requests", "2", "--depth", "3", "--adapter", bug, "--cases-dir", str(cases)
    )
    assert run.code == 1 and "VIOLATED ref_count_matches_references" in run.out, run.out + run.err
    (saved,) = cases.glob("*.json")
    assert Case.load(saved).expected["invariant"] == "ref_count_matches_references"


SMALLEST = Bounds(blocks=2, requests=1, block_size=1)


def test_spacer_proves_invariants_with_an_inductive_invariant_that_is_checked() -> None:
    proofs = prove_pdr(SMALLEST, ["bad_input_rejected", "atomic_failure", "hit_keeps_key"], time_limit=60)
    for p in proofs:
        assert p.verdict == "proved" and p.checked and p.inductive is not None, p
    # The independent check can fail: "true" is no inductive invariant strong enough for this one.
    enc = Encoding(Bounds(blocks=2, requests=1, block_size=1, arith="int"))
    assert not check_inductive(enc, SAFETY["non_negative_ref_counts"], z3.BoolVal(True))


def test_spacer_refutes_a_seeded_variant_and_the_counterexample_replays() -> None:
    (proof,) = prove_pdr(SMALLEST, ["bad_input_rejected"], variant=SilentDoubleRelease, time_limit=60)
    assert proof.verdict == "violated" and proof.counterexample is not None
    ((op),) = proof.counterexample.ops  # a release of the request that does not exist yet
    assert (op.op, op.req) == ("release", "r0")
    bug = next(b for b in PAGED_BUGS if b.name == SilentDoubleRelease.name)
    violation = replay_ops(bug.factory(), SMALLEST.config, proof.counterexample.ops)
    assert violation is not None and "bad_input_rejected" in violation.failures


ONE_TOKEN = Bounds(blocks=2, requests=2, block_size=1, alphabet=1, max_append=1)
"""Two requests sharing blocks, with one token value and one-token appends: the smallest pool
where forget-decrement (a shared block) and evict-referenced (a hit on a cached-free block,
then a pop) happen; Spacer finds each in about 20-30 s there (at 2, 2, 1 with two token
values 35-50 s, docs/formal.md)."""

AGREEMENT: dict[str, Bounds] = {
    SilentDoubleRelease.name: SMALLEST,
    "share-copies": SMALLEST,
    "reuse-keeps-index": SMALLEST,
    "lost-on-reclaim": SMALLEST,
    "hit-drops-key": TINY,
    "floor-rounding": TINY,
    "double-decrement": PAIR,
    "leak-on-refusal": PAIR,
    "newest-unkeys-owner": PAIR,
    "forget-decrement": ONE_TOKEN,
    "evict-referenced": ONE_TOKEN,
}
"""Each seeded spec bug at the smallest pool where Spacer refutes it within the test's limit (docs/formal.md)."""


def test_every_seeded_spec_bug_is_in_the_agreement() -> None:
    assert set(AGREEMENT) == {v.name for v in VARIANTS}


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.name)
@pytest.mark.slow
def test_each_seeded_spec_bug_is_found_by_spacer_the_bmc_and_the_search(
    pair_space: ExploreResult, pair_space_newest: ExploreResult, variant: type[BuggyEncoding]
) -> None:
    """Spacer refutes the invariant on the variant's encoding, the BMC decodes a shortest case breaking
    it, and driving the bug's implementation through the search's states (N=2, R=2 within depth 3:
    the search drives only the first path to each state, so a pool that small may leave the bug's
    path undriven) breaks the same invariant.

    Spacer runs backward (``direction="backward"``: from the empty pool towards the states that
    can break the invariant): forward, forget-decrement took 240 s and evict-referenced was
    never refuted within 240 s; backward, each of the eleven takes under a minute.
    """
    bounds = AGREEMENT[variant.name]
    (proof,) = prove_pdr(bounds, [variant.invariant], variant=variant, time_limit=90, direction="backward")
    assert proof.verdict == "violated" and proof.counterexample is not None, proof
    cex = proof.counterexample
    assert variant.invariant in cex.invariants
    bug = next(b for b in PAGED_BUGS if b.name == variant.name)
    violation = replay_ops(bug.factory(), bounds.config, cex.ops)
    assert violation is not None and variant.invariant in violation.failures
    space = pair_space_newest if variant.duplicate_keys == "newest" else pair_space
    driven = drive(bug.factory(), space, refine=False)
    assert driven.violation is not None and variant.invariant in driven.violation.failures
