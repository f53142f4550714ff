"""Incremental checking: the delta protocol (spec/delta.py), and the harness taking deltas.

The protocol's invariant: a step's delta applied to the observation before it equals the observation after it.
The reference adapters keep it on random walks; the kit's kept state answers as the whole state did before
and after a step; a change outside a step's delta is caught by the full check every K steps and at the end;
and K=1 is today's path, which never asks an adapter for a delta.
"""

from __future__ import annotations

import json
import pickle
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from random_ops import random_op
from seeded_bugs import by_name

from kvspec.adapter import Adapter
from kvspec.adapters.isolation import IsolatedAdapter
from kvspec.adapters.reference_paged import (
    ReferenceFamilyProtectAdapter,
    ReferenceNewestAdapter,
    ReferencePagedAdapter,
    ReferenceScoreAdapter,
    ReferenceSharedAwareAdapter,
)
from kvspec.cli import main
from kvspec.spec import BlockKey, Config, ObjectView, Observation, ObservationDelta, Op, Outcome, RequestView, Semantics
from kvspec.spec.delta import KeptObservation, differences
from kvspec.spec.invariants import ADAPTER_CONTRACT
from kvspec.spec.invariants.ranking import CandidateRanking
from kvspec.spec.ledger import BlockLedger
from kvspec.stateful_tests import PROFILES, Harness, Options, Tally, Violation, replay_ops, run_check
from kvspec.stateful_tests.swarm import run_swarm

ADAPTERS = [
    ReferencePagedAdapter,
    ReferenceScoreAdapter,
    ReferenceSharedAwareAdapter,
    ReferenceFamilyProtectAdapter,
    ReferenceNewestAdapter,
]


@pytest.mark.parametrize("make", ADAPTERS, ids=lambda a: a.name)
def test_reference_deltas_applied_give_the_observation(make: type[ReferencePagedAdapter]) -> None:
    """On 600 random ops per adapter (refusals, evictions, preemption and resets included), each step's delta
    applied to the previous observation equals the adapter's full observation; after a reset it gives none."""
    adapter = make()
    assert adapter.capabilities.deltas
    rng = random.Random(17)
    adapter.reset(Config(capacity=6, block_size=2))
    obs = adapter.observe()
    deltas = 0
    for n in range(600):
        op = random_op(rng, obs, n)
        adapter.apply(op)
        adapter.events()
        delta = adapter.observe_delta()
        full = adapter.observe()
        if op.op == "reset_cache":
            assert delta is None
        else:
            assert delta is not None, op
            assert delta.apply(obs) == full, (n, op)
            assert delta.touched_objects <= {*obs.objects, *full.objects}
            deltas += 1
        obs = full
    assert deltas > 500


def test_kept_state_answers_as_the_whole_state_before_and_after() -> None:
    """KeptObservation.apply: ``before`` answers with the old values (a dropped object found, an added one
    not), ``after`` with the new; the local views iterate only what the step touched and the readers of the
    touched objects, while every lookup answers from the whole state."""
    obj = {i: ObjectView(i, 1, 2, 1, None) for i in range(4)}
    reqs = {"a": RequestView("a", (1, 2, 3, 4), 4, (0, 1)), "b": RequestView("b", (5, 6, 7, 8), 4, (2, 3))}
    kept = KeptObservation(Observation(8, 4, obj, reqs, {}))
    grown = RequestView("a", (1, 2, 3, 4, 9), 4, (0, 1, 4))
    delta = ObservationDelta(3, {4: ObjectView(4, 1, 1, 1, None)}, frozenset(), {"a": grown})
    change = kept.apply(delta)
    assert change.before.free == 4 and change.after.free == 3
    assert 4 not in change.before.objects and 4 in change.after.objects
    assert change.before.requests["a"].objects == (0, 1) and change.after.requests["a"] is grown
    assert sorted(change.before.objects) == [0, 1, 2, 3] and sorted(change.after.objects) == [0, 1, 2, 3, 4]
    assert change.after == delta.apply(Observation(8, 4, obj, reqs, {}))
    before, after = kept.local(change, [], "a")
    assert list(after.objects) == [4] and list(after.requests) == ["a"]
    assert list(before.objects) == [] and before.requests["a"].objects == (0, 1)
    assert after.objects[2] == obj[2] and "b" in after.requests  # lookups see everything
    assert kept.readers[4] == {"a"}
    drop = ObservationDelta(3, {}, frozenset({3}), {}, frozenset({"b"}))
    change = kept.apply(drop)
    assert 3 in change.before.objects and 3 not in change.after.objects
    assert "b" in change.before.requests and "b" not in kept.now().requests
    assert 3 not in kept.readers


def _bystander_ops() -> list[Op]:
    return [Op("admit", "a", (1, 2, 3)), Op("admit", "b", (4, 5)), Op("append", "b", (6,)), Op("append", "b", (7,))]


def test_a_change_outside_the_delta_is_caught_by_the_full_check_not_before() -> None:
    """bystander-reference corrupts a block of request a while admitting b, outside the step's delta: with K=1
    the whole state shows it at that step; with K=4 the local checks of steps 1-3 cannot see it, and the full
    check of step 4 reports it by its invariant, and the kept state's difference from the observation."""
    bug = by_name("bystander-reference")
    config = Config(capacity=8, block_size=2)
    now = replay_ops(bug.factory(), config, _bystander_ops())
    assert now is not None and now.step == 1 and now.invariant == "ref_count_matches_references"
    later = replay_ops(bug.factory(), config, _bystander_ops(), Tally(full_check_every=4))
    assert later is not None and later.step == 3, later
    assert later.invariant == "ref_count_matches_references"
    assert any("differs from its observation" in p for p in later.failures[ADAPTER_CONTRACT])
    # With K past the example's end, the end-of-example check catches it at the last op.
    end = replay_ops(bug.factory(), config, _bystander_ops()[:3], Tally(full_check_every=100))
    assert end is not None and end.step == 2 and end.invariant == "ref_count_matches_references"
    assert replay_ops(ReferencePagedAdapter(), config, _bystander_ops(), Tally(full_check_every=4)) is None


class ForgetsTheAppend(ReferencePagedAdapter):
    """A delta that lies and nothing else: an append's delta leaves out every block it changed."""

    def apply(self, op: Op) -> Outcome:
        self.appending = op.op == "append"
        return super().apply(op)

    def observe_delta(self) -> ObservationDelta | None:
        delta = super().observe_delta()
        if delta is None or not self.appending:
            return delta
        return ObservationDelta(delta.free, {}, frozenset(), delta.requests, delta.dropped_requests)


def test_a_lying_delta_with_a_correct_pool_is_an_adapter_contract_finding() -> None:
    """The pool is right, but the delta of an append that filled the tail block leaves that block out: the
    local check of the append has nothing to see, the full check of the K-th step reports adapter_contract
    (the kept state differs from the observation), and the same ops hold under K=1."""
    config = Config(capacity=8, block_size=2)
    ops = [Op("admit", "a", (1, 2, 3)), Op("append", "a", (4,)), Op("admit", "b", (7, 8))]
    assert replay_ops(ForgetsTheAppend(), config, ops[:2], Tally(full_check_every=100)) is not None  # the end
    found = replay_ops(ForgetsTheAppend(), config, ops, Tally(full_check_every=3))
    assert found is not None and found.step == 2, found
    assert any("differs from its observation" in p for p in found.failures[ADAPTER_CONTRACT])
    assert replay_ops(ForgetsTheAppend(), config, ops) is None


def _isolated_replay(factory: Callable[[], Adapter], config: Config, ops: list[Op], k: int) -> Violation | None:
    with IsolatedAdapter(factory, timeout=30.0) as adapter:
        return replay_ops(adapter, config, ops, Tally(full_check_every=k))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("factory", "ops", "k"),
    [
        (by_name("bystander-reference").factory, _bystander_ops(), 4),  # at the K-th step
        (by_name("bystander-reference").factory, _bystander_ops()[:3], 100),  # at the example's end
        (ForgetsTheAppend, [Op("admit", "a", (1, 2, 3)), Op("append", "a", (4,)), Op("admit", "b", (7, 8))], 3),
        (ForgetsTheAppend, [Op("admit", "a", (1, 2, 3)), Op("append", "a", (4,))], 100),
    ],
    ids=["bystander-kth", "bystander-end", "lying-delta-kth", "lying-delta-end"],
)
def test_a_difference_found_in_the_child_is_reported_as_in_process(
    factory: Callable[[], Adapter], ops: list[Op], k: int
) -> None:
    """An adapter in its child process: the child compares the state it kept from the deltas with the
    observation (adapters/kept.py) and, finding a difference, sends the observation; the kit reports the same
    violation as in-process, at the same step, with the same adapter_contract lines and invariants."""
    config = Config(capacity=8, block_size=2)
    here = replay_ops(factory(), config, ops, Tally(full_check_every=k))
    there = _isolated_replay(factory, config, ops, k)
    assert here is not None and there is not None
    assert any("differs from its observation" in p for p in there.failures[ADAPTER_CONTRACT])
    assert (there.step, there.invariant, there.failures) == (here.step, here.invariant, here.failures)


def _filling_ops(requests: int, blocks: int) -> list[Op]:
    """Unique prompts of ``blocks`` blocks (block size 2), every other one released with its blocks kept cached."""
    ops = []
    for n in range(requests):
        ops.append(Op("admit", f"r{n}", tuple(range(n * blocks * 2, (n + 1) * blocks * 2))))
        if n % 2:
            ops.append(Op("release", f"r{n}", keep=True))
    return ops


def test_an_agreeing_kth_step_sends_no_observation_over_the_pipe() -> None:
    """Taking deltas in a child process, a K-th step and the example's end whose comparison agrees send
    the child's verdict, not the observation: each crosses in fewer bytes than a tenth of the pickled full
    observation, and the whole state is still judged there (full_checks) on the kit's kept state, which
    equals the adapter's observation."""
    config, k = Config(capacity=1024, block_size=2), 4
    ops = _filling_ops(48, 16)[:-1]  # 768 blocks held or cached at the end; steps past the last K-th step
    tally = Tally(full_check_every=k)
    with IsolatedAdapter(ReferencePagedAdapter, timeout=30.0) as adapter:
        harness = Harness(adapter, config, tally)  # type: ignore[arg-type]
        crossed = []
        for op in ops:
            start = adapter.bytes_received
            harness.step(op)
            crossed.append(adapter.bytes_received - start)
        start = adapter.bytes_received
        harness.finish()
        at_end = adapter.bytes_received - start
        full = adapter.observe()
    assert harness.kept is not None and not differences(harness.kept.now(), full)
    whole = len(pickle.dumps(full))
    assert len(full.objects) > 700 and whole > 40_000
    kth = crossed[k - 1 :: k]
    assert len(kth) == len(ops) // k and tally.full_checks == len(kth) + 1
    assert max([*kth, at_end]) < whole / 10, (kth, at_end, whole)


class NoDeltaAtK1(ReferencePagedAdapter):
    def observe_delta(self) -> ObservationDelta | None:
        raise AssertionError("K=1 asked for a delta")


def test_k1_never_asks_for_a_delta() -> None:
    """K=1 (every profile's default) is the full check of every step: the adapter is never asked for a delta."""
    harness = Harness(NoDeltaAtK1(), Config(capacity=8, block_size=2), Tally(full_check_every=1))
    for op in _bystander_ops():
        harness.step(op)
    harness.finish()
    assert harness.kept is None and harness.tally.full_checks == 0


@pytest.mark.parametrize("isolate", [False, True], ids=["in-process", "isolated"])
def test_incremental_run_checks_every_step_and_the_whole_state_every_k(isolate: bool, tmp_path: Path) -> None:
    """A run with K=5 passes on the reference adapter, judges each incremental invariant on every step and the
    whole-state ones on the full checks only (in a child process the deltas cross the pipe)."""
    result = run_check(
        ReferencePagedAdapter,
        "reference",
        Options(profile=PROFILES["ci"], max_examples=30, cases_dir=tmp_path, isolate=isolate, full_check_every=5),
    )
    assert result.exit_code == 0, result.error
    tally = result.tally
    assert 0 < tally.full_checks < tally.steps
    # every step, plus each end-of-example check
    assert tally.steps < tally.checked["ref_count_matches_references"] <= tally.steps + tally.full_checks
    assert tally.checked["index_completeness"] < tally.steps // 2
    rows = {row["name"]: row["verdict"] for row in result.report().verdicts()}
    assert rows["capacity_conservation"] == rows["index_completeness"] == "held"


def test_incremental_run_finds_a_seeded_bug_through_its_invariant(tmp_path: Path) -> None:
    """The bug outside the delta, searched with K=4: found, named by ref_count_matches_references."""
    bug = by_name("bystander-reference")
    result = run_check(
        bug.factory, bug.name, Options(profile=PROFILES["ci"], cases_dir=tmp_path, refine=False, full_check_every=4)
    )
    assert result.exit_code == 1
    assert isinstance(result.failure, Violation) and result.failure.invariant == bug.invariant


@pytest.mark.parametrize(
    "semantics",
    [
        Semantics(),
        Semantics(duplicate_keys="indexed"),
        Semantics(duplicate_keys="newest"),
        Semantics(eviction="score", free_uncached="head"),
        Semantics(reset_requires_idle=False, admission_anchor_blocks=1),
    ],
    ids=["lru", "indexed", "newest", "score-head", "reset-busy-anchor"],
)
def test_block_ledger_counts_free_and_lost_as_a_scan_would(semantics: Semantics) -> None:
    """The spec's block ledger keeps ``free`` as a count and answers ``lost`` without a scan outside
    duplicate_keys=newest (spec/ledger/block.py); on 800 random ops both equal the scan of every slot."""
    ledger = BlockLedger(Config(capacity=7, block_size=2), semantics)
    rng = random.Random(3)
    for n in range(800):
        ledger.step(random_op(rng, ledger.observe(), n))
        slots = ledger.slots
        assert ledger.free == sum(1 for s in slots if not s.ref_count and s.key is None), n
        assert ledger.lost() == tuple(s.key for s in slots if isinstance(s.key, BlockKey) and s.key not in ledger.index)


class AnswersNonsense(ReferencePagedAdapter):
    def observe_delta(self) -> ObservationDelta | None:
        return "nonsense"  # type: ignore[return-value]


def test_a_delta_that_is_not_one_is_an_adapter_contract_finding() -> None:
    """observe_delta() must give an ObservationDelta or None: anything else is the adapter's finding."""
    found = replay_ops(AnswersNonsense(), Config(capacity=8, block_size=2), _bystander_ops(), Tally(full_check_every=3))
    assert found is not None and found.step == 0 and found.invariant == ADAPTER_CONTRACT


def test_command_line_full_check_every(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`kvspec check --full-check-every K`: K below 1 could not run (exit 2, one line); K=8 checks the
    reference adapter incrementally and passes, every safety invariant held."""
    assert main(["check", "--adapter", "reference", "--full-check-every", "0", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--full-check-every must be at least 1" in err
    report = tmp_path / "r.json"
    argv = ["check", "--adapter", "reference", "--full-check-every", "8", "--max-examples", "20"]
    code = main([*argv, "--cases-dir", str(tmp_path), "--report", str(report), "--quiet"])
    assert code == 0
    data = json.loads(report.read_text())
    assert data["full_check_every"] == 8 and data["full_checks"] > 0
    rows = {row["name"]: row["verdict"] for row in data["invariants"]}
    assert rows["capacity_conservation"] == rows["ref_count_matches_references"] == rows["index_completeness"] == "held"


def test_swarm_engine_with_k_finds_the_bug_outside_the_delta(tmp_path: Path) -> None:
    """The swarm engine takes K too: its walks end with the whole-state check, and the failure it minimises
    (under the same K) is named by the bug's invariant and replays under that K."""
    bug = by_name("bystander-reference")
    result = run_swarm(
        bug.factory, bug.name, Options(profile=PROFILES["ci"], cases_dir=tmp_path, refine=False, full_check_every=4)
    )
    assert result.exit_code == 1 and result.tally.full_checks > 0
    assert result.failure is not None and result.failure_config is not None
    assert result.failure.invariant == bug.invariant
    again = replay_ops(bug.factory(), result.failure_config, result.failure_ops, Tally(full_check_every=4))
    assert again is not None and again.invariant == bug.invariant


@pytest.mark.parametrize("make", ADAPTERS[:4], ids=lambda a: a.name)
def test_candidates_kept_ranked_across_delta_steps_equal_a_ranking_of_the_whole_state(
    make: type[ReferencePagedAdapter],
) -> None:
    """On 400 random ops per block order, taking deltas: after each step the ranking KeyMemory kept from the
    steps' touched objects (spec.invariants.ranking) equals one built afresh from the whole state and memory,
    feature for feature (branch factors included), and its first candidate is the whole state's minimum."""
    rng = random.Random(5)
    harness = Harness(make(), Config(capacity=8, block_size=2), Tally(full_check_every=10**9))
    ranked = 0
    for n in range(400):
        op = random_op(rng, harness.obs, n)
        if op.op == "reset_cache":
            continue
        harness.step(op)
        kept = harness.memory.ranking
        if kept is None:
            continue
        assert harness.kept is not None
        fresh = CandidateRanking(kept.order, kept.block_size, kept.protect_min_hits)
        fresh.rebuild(harness.kept.objects, harness.memory)
        assert (kept.features, kept.unjudgeable, kept.content, kept.children) == (
            fresh.features, fresh.unjudgeable, fresh.content, fresh.children,
        ), (n, op)  # fmt: skip
        if fresh.keys:
            assert kept.first(set(), set(), {}, []) == min(fresh.keys, key=fresh.keys.__getitem__)
            ranked += 1
    assert ranked > 100


ORDER_BREAKS = {
    # Shrunk counterexamples the search found (run_check, "ci" profile, refine=False) for the two order bugs.
    "lru-most-recent-first": (
        Config(capacity=2, block_size=2),
        [Op("admit", "r0", (0, 0, 0, 0)), Op("release", "r0", keep=True), Op("admit", "r1", (1064,))],
    ),
    "shared-aware-ranks-by-lru": (
        Config(capacity=7, block_size=2),
        [
            Op("admit", "r0", (0, 0, 0, 1)),
            Op("release", "r0", keep=True),
            Op("admit", "r1", (0,) * 12),
            Op("release", "r1", keep=True),
            Op("admit", "r2", (0, 0)),
        ],
    ),
}


@pytest.mark.parametrize("name", sorted(ORDER_BREAKS))
def test_an_eviction_order_break_is_reported_at_its_step_between_full_checks(name: str) -> None:
    """policy_conformance judges every delta step (O(evictions x log pool)): a seeded order bug's counterexample
    fails at the same step, by the same invariant, with K past the example's end as with K=1; the correct
    adapter holds on it."""
    bug = by_name(name)
    config, ops = ORDER_BREAKS[name]
    whole = replay_ops(bug.factory(), config, ops, refine=False)
    local = replay_ops(bug.factory(), config, ops, Tally(full_check_every=10**9), refine=False)
    assert whole is not None and local is not None
    assert whole.invariant == local.invariant == "policy_conformance"
    assert whole.step == local.step == len(ops) - 1
    assert replay_ops(bug.correct(), config, ops, Tally(full_check_every=10**9), refine=False) is None


def _quality_per_step(k: int, ops: list[Op]) -> list[tuple[int, int]]:
    """(steps counted, orphan block-steps) that each op added to the run's policy quality, with K=k."""
    harness = Harness(ReferenceSharedAwareAdapter(), Config(capacity=6, block_size=2), Tally(full_check_every=k))
    quality, added, last = harness.memory.quality, [], (0, 0)
    for op in ops:
        harness.step(op)
        now = (quality.steps, quality.orphan_block_steps)
        added.append((now[0] - last[0], now[1] - last[1]))
        last = now
    return added


def test_policy_quality_under_deltas_is_the_full_checks_sample_of_every_step() -> None:
    """With K>1 the orphan figures are counted on the K-th steps (judged whole), each exactly as the full
    check of every step counts it at that step; before, nothing was counted between resets."""
    rng, ops = random.Random(7), []
    shadow = ReferenceSharedAwareAdapter()
    shadow.reset(Config(capacity=6, block_size=2))
    for n in range(240):
        op = random_op(rng, shadow.observe(), n, longest_prompt=6)
        if op.op == "reset_cache":
            continue
        shadow.apply(op)
        ops.append(op)
    every, sampled = _quality_per_step(1, ops), _quality_per_step(4, ops)
    assert all(steps == 1 for steps, _ in every) and sum(o for _, o in every) > 0  # the walk leaves orphans
    kth = [i for i in range(len(ops)) if (i + 1) % 4 == 0]
    assert [i for i, (steps, _) in enumerate(sampled) if steps] == kth
    assert [sampled[i][1] for i in kth] == [every[i][1] for i in kth]
    assert sum(sampled[i][1] for i in kth) > 0
