"""Eviction policies: the spec's orders, the reference's policy objects, and the checks that hold them together.

The spec (spec/policies.py) and the reference (reference/eviction_policies.py) state each
order independently; these tests show they agree on every candidate set, that the
model and the pool evict the same blocks, and that each policy check bites.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from seeded_bugs import RanksReferenced, _policy_paged, by_name

from kvspec.adapters import load
from kvspec.adapters.reference_paged import (
    ReferenceFamilyProtectAdapter,
    ReferenceNewestAdapter,
    ReferencePagedAdapter,
    ReferenceScoreAdapter,
    ReferenceSharedAwareAdapter,
)
from kvspec.reference.eviction_policies import POLICIES, BlockStats, FamilyProtectPolicy, ScorePolicy, SharedAwarePolicy
from kvspec.reference.paged import PagedPrefixCache
from kvspec.reference.scheduler import SchedulerSim
from kvspec.spec import Config, Event, ObjectView, Observation, Op, Outcome, RequestView, Semantics, SpecError
from kvspec.spec.invariants import KeyMemory, Transition, check_transition, orphaned_blocks
from kvspec.spec.ledger import LedgerModel
from kvspec.spec.policies import (
    BLOCK_ORDERS,
    BlockFeatures,
    BlockOrder,
    OrderParams,
    order_key,
    retain_score,
    retention_score,
)
from kvspec.stateful_tests import PROFILES, Case, Options, replay_ops, run_check

POLICY_ADAPTERS = {
    "reference": ReferencePagedAdapter,
    "reference-score": ReferenceScoreAdapter,
    "reference-shared-aware": ReferenceSharedAwareAdapter,
    "reference-family-protect": ReferenceFamilyProtectAdapter,
}

# -- the orders themselves ---------------------------------------------------------------

small = st.integers(0, 6)


@st.composite
def candidate_sets(draw: st.DrawFn) -> list[BlockFeatures]:
    """Candidates with distinct free queue positions, as both sides guarantee."""
    n = draw(st.integers(1, 8))
    positions = draw(st.lists(st.integers(0, 50), min_size=n, max_size=n, unique=True))
    return [
        BlockFeatures(
            hits=draw(small),
            share_degree=draw(st.integers(1, 4)),
            branch_factor=draw(st.integers(0, 3)),
            prefix_depth=draw(st.integers(1, 5)),
            last_used=draw(st.integers(0, 20)),
            free_pos=pos,
        )
        for pos in positions
    ]


def as_stats(features: list[BlockFeatures], clock: int) -> list[BlockStats]:
    """The same candidates as the reference pool's side table rows, read at ``clock``."""
    return [
        dataclasses.replace(s, clock=clock)
        for s in [
            BlockStats(
                i, bytes([i]), f.hits, f.share_degree, f.branch_factor, f.prefix_depth, f.last_used, f.free_pos, clock
            )
            for i, f in enumerate(features)
        ]
    ]


@settings(max_examples=300, deadline=None)
@given(candidate_sets(), st.sampled_from(BLOCK_ORDERS), st.integers(0, 3), st.integers(1, 12), st.integers(0, 5))
def test_reference_policies_rank_like_the_spec(
    features: list[BlockFeatures], order: BlockOrder, min_hits: int, capacity: int, extra_clock: int
) -> None:
    """Two independent statements of each order give the same ranking of any candidate set."""
    clock = max(f.last_used for f in features) + extra_clock
    params = OrderParams(clock=clock, capacity=capacity, protect_min_hits=min_hits)
    spec_rank = sorted(range(len(features)), key=lambda i: order_key(order, features[i], params))
    kwargs = {"score": {"capacity": capacity}, "family_protect": {"protect_min_hits": min_hits}}.get(order, {})
    policy = POLICIES[order](**kwargs)
    assert policy.name == order
    assert [s.block_id for s in policy.order(as_stats(features, clock))] == spec_rank


@settings(max_examples=300, deadline=None)
@given(candidate_sets(), st.integers(0, 30))
def test_score_order_is_hits_then_recency_whatever_the_clock(features: list[BlockFeatures], extra: int) -> None:
    """The block score order is (hits, last_used, free_pos): it does not depend on which clock reads the ages."""
    clock = max(f.last_used for f in features) + extra
    by_score = sorted(features, key=lambda f: order_key("score", f, OrderParams(clock=clock, capacity=8)))
    assert by_score == sorted(features, key=lambda f: (f.hits, f.last_used, f.free_pos))


@settings(max_examples=300, deadline=None)
@given(candidate_sets())
def test_retain_score_never_falls_when_a_signal_grows(features: list[BlockFeatures]) -> None:
    for f in features:
        base = retain_score(f)
        for grown in (
            BlockFeatures(f.hits + 1, f.share_degree, f.branch_factor, f.prefix_depth, f.last_used, f.free_pos),
            BlockFeatures(f.hits, f.share_degree + 1, f.branch_factor, f.prefix_depth, f.last_used, f.free_pos),
            BlockFeatures(f.hits, f.share_degree, f.branch_factor + 1, f.prefix_depth, f.last_used, f.free_pos),
        ):
            assert retain_score(grown) > base
        deeper = BlockFeatures(f.hits, f.share_degree, f.branch_factor, f.prefix_depth + 1, f.last_used, f.free_pos)
        assert retain_score(deeper) < base


def test_score_policy_is_the_scheduler_simulators_score_of_a_one_block_entry() -> None:
    """Bit for bit, on the same inputs: the reference ScorePolicy, the spec and SchedulerSim.score."""
    for capacity in (1, 3, 12):
        sim = SchedulerSim(capacity)
        sim.time = 40
        policy = ScorePolicy(capacity)
        for hits in range(4):
            for last_used in range(0, 41, 7):
                stats = BlockStats(0, None, hits, 1, 0, 1, last_used, 0, clock=40)
                assert policy.retain_score(stats) == sim.score(hits, 1, last_used)
                assert policy.retain_score(stats) == retention_score(hits, 1, 40 - last_used, capacity)


def test_family_protect_defers_protected_blocks_and_keeps_queue_order_otherwise() -> None:
    stats = [
        BlockStats(i, None, hits, 1, 0, 1, 0, seq) for i, (hits, seq) in enumerate([(2, 1), (0, 2), (1, 3), (0, 4)])
    ]
    assert [s.block_id for s in FamilyProtectPolicy(protect_min_hits=1).order(stats)] == [1, 3, 0, 2]
    assert [s.block_id for s in FamilyProtectPolicy(protect_min_hits=2).order(stats)] == [1, 2, 3, 0]
    with pytest.raises(ValueError):
        FamilyProtectPolicy(protect_min_hits=-1)


# -- the orders differ where they should ---------------------------------------------------------

# Each scenario ends in one admission that must evict; the expected evictions per order, reasoned out:
SCENARIOS: dict[str, tuple[int, list[Op], dict[str, tuple[tuple[int, ...], ...]]]] = {
    # a's tail block is filled by an append, so the leaf (1,2,3,4) was used after its trunk (1,2).
    # score evicts the older trunk and orphans the leaf; every other order takes the leaf.
    "score-orphans-an-appended-leaf": (
        3,
        [
            Op("admit", "a", (1, 2, 3)),
            Op("append", "a", (4,)),
            Op("release", "a"),
            Op("admit", "c", (9,)),  # the never-used block: nothing evicted
            Op("admit", "d", (8,)),
        ],
        {
            "lru": ((1, 2, 3, 4),),
            "score": ((1, 2),),
            "shared_aware": ((1, 2, 3, 4),),
            "family_protect": ((1, 2, 3, 4),),
        },
    ),
    # The trunk (1,2) was hit once and joined the free queue before (7,8), which was never hit.
    # lru takes the queue head; the others keep the reused trunk.
    "lru-evicts-a-reused-trunk": (
        4,
        [
            Op("admit", "a", (1, 2, 3)),
            Op("admit", "b", (1, 2, 5)),  # hits (1,2)
            Op("release", "a"),
            Op("release", "b"),
            Op("admit", "c", (7, 8, 6)),
            Op("release", "c"),
            Op("admit", "d", (9,) * 7),
        ],
        {
            "lru": ((1, 2), (7, 8)),
            "score": ((7, 8), (1, 2)),
            "shared_aware": ((7, 8), (1, 2)),
            "family_protect": ((7, 8), (1, 2)),
        },
    ),
    # (2,1) is oldest in the queue; shared_aware evicts the deep chain leaf first instead (retain
    # 1/3, then 1/2) and (2,1) last, where it ties with (1,1) and is older.
    "shared-aware-takes-a-chain-from-its-leaf": (
        4,
        [
            Op("admit", "r0", (2, 1)),
            Op("release", "r0"),
            Op("admit", "r1", (1, 1, 2, 2, 2, 2)),
            Op("release", "r1"),
            Op("admit", "r2", (2, 2, 2, 2, 2, 1)),
        ],
        {
            "lru": ((2, 1), (1, 1, 2, 2, 2, 2), (1, 1, 2, 2)),
            "score": ((2, 1), (1, 1, 2, 2, 2, 2), (1, 1, 2, 2)),
            "shared_aware": ((1, 1, 2, 2, 2, 2), (1, 1, 2, 2), (2, 1)),
            "family_protect": ((2, 1), (1, 1, 2, 2, 2, 2), (1, 1, 2, 2)),
        },
    ),
}

ADAPTER_OF: dict[str, type[ReferencePagedAdapter]] = {
    "lru": ReferencePagedAdapter,
    "score": ReferenceScoreAdapter,
    "shared_aware": ReferenceSharedAwareAdapter,
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("order", BLOCK_ORDERS)
def test_each_order_evicts_what_its_formula_says(scenario: str, order: BlockOrder) -> None:
    """The model's evictions per order, and the reference pool under the same policy evicts the same blocks."""
    capacity, ops, expected = SCENARIOS[scenario]
    model = LedgerModel(Config(capacity=capacity, block_size=2), Semantics(eviction=order))
    steps = [model.step(op) for op in ops]
    assert [s.outcome.status for s in steps] == ["ok"] * len(ops)
    assert all(not s.evicted for s in steps[:-1])
    assert steps[-1].evicted == expected[order]
    pool = PagedPrefixCache(capacity, 2, policy=POLICIES[order]())
    for op in ops:
        if op.op == "admit":
            pool.allocate(op.req or "", op.tokens)
        elif op.op == "append":
            pool.append(op.req or "", op.tokens)
        else:
            pool.free(op.req or "")
    assert len([e for e in pool.evictions if e[0] == "evict"]) == len(expected[order])
    if order in ADAPTER_OF:  # and through the adapter, every invariant holding on the way
        assert replay_ops(ADAPTER_OF[order](), Config(capacity=capacity, block_size=2), ops) is None


def test_non_lru_orders_take_uncached_blocks_before_evicting() -> None:
    """lru pops the queue head even when it is cached; every other order evicts nothing while it need not."""
    ops = [
        Op("admit", "a", (1, 2)),
        Op("admit", "b", (9, 9, 9)),  # a full block and a partial one
        Op("release", "a"),  # (1, 2): cached, free, queued before b's blocks
        Op("release", "b"),  # b's partial block (uncached), then its full block (9, 9)
        Op("admit", "c", (5,)),  # takes the one block never used
        Op("admit", "d", (6,)),
    ]
    for order in BLOCK_ORDERS:
        model = LedgerModel(Config(capacity=4, block_size=2), Semantics(eviction=order))
        evicted = [model.step(op).evicted for op in ops]
        assert evicted[-2] == ()
        assert evicted[-1] == (((1, 2),) if order == "lru" else ()), order


def test_admission_gate_caches_only_the_first_blocks_of_a_cold_request() -> None:
    """A cold request keeps its later blocks uncached; a warm one caches them; nothing is refused for it."""
    gated = LedgerModel(
        Config(capacity=8, block_size=2), Semantics(eviction="family_protect", admission_anchor_blocks=1)
    )
    plain = LedgerModel(Config(capacity=8, block_size=2), Semantics(eviction="family_protect"))
    ops = [Op("admit", "a", (1, 2, 3, 4, 5, 6, 7)), Op("release", "a"), Op("admit", "b", (1, 2, 3, 4, 5, 6, 7))]
    first = [gated.step(op) for op in ops]
    second = [plain.step(op) for op in ops]
    assert [s.outcome.status for s in first] == [s.outcome.status for s in second] == ["ok"] * 3
    assert first[2].outcome.hit_tokens == 2  # only (1, 2) was cached by the cold request
    assert second[2].outcome.hit_tokens == 6
    cached = {o.key for o in gated.observe().objects.values() if o.key is not None}
    assert cached == {(1, 2), (1, 2, 3, 4), (1, 2, 3, 4, 5, 6)}  # b was warm: it cached the rest


def test_pool_side_table_and_lifecycle_log() -> None:
    """The pool's per-block stats are the spec's features, and the policy events are logged."""
    pool = PagedPrefixCache(4, 2, policy=SharedAwarePolicy(), admission_anchor_blocks=3)
    pool.lifecycle_log = []
    pool.allocate("a", [1, 2, 3, 4])
    pool.allocate("b", [1, 2, 3, 4, 5])
    trunk, leaf = pool.req_blocks["b"][:2]
    t, lf = pool.block_stats(trunk), pool.block_stats(leaf)
    assert (t.hit_count, t.share_degree, t.branch_factor, t.prefix_depth) == (1, 2, 1, 1)
    assert (lf.hit_count, lf.share_degree, lf.branch_factor, lf.prefix_depth) == (1, 2, 0, 2)
    pool.free("a")
    pool.free("b")
    pool.allocate("c", [9, 9, 9, 9, 9, 9, 9, 9])  # 4 blocks: 2 uncached, then the leaf and the trunk
    events = [e["event"] for e in pool.lifecycle_log]
    assert events.count("block_evicted") == 2 and "eviction_candidates_ranked" in events
    assert "cache_admission_limited" in events  # c is cold: 4 full blocks, 3 cached
    ranked = next(e for e in pool.lifecycle_log if e["event"] == "eviction_candidates_ranked")
    assert ranked["candidates"][0][0] == leaf.block_id


# -- each policy adapter passes the suite --------------------------------------------------------


@pytest.mark.parametrize("name", sorted(POLICY_ADAPTERS))
@pytest.mark.slow
def test_policy_adapter_passes_the_ci_profile(name: str, tmp_path: Path) -> None:
    """Every invariant, refinement and policy checks included, holds; the orders were exercised with a choice."""
    assert load(name) is POLICY_ADAPTERS[name]
    result = run_check(POLICY_ADAPTERS[name], name, Options(profile=PROFILES["ci"], cases_dir=tmp_path))
    assert result.status == "passed", result.failure
    verdicts = {row["name"]: row for row in result.report().verdicts()}
    for inv in ("candidates_unreferenced", "no_spurious_refusal", "policy_conformance", "predicted_eviction"):
        assert verdicts[inv]["verdict"] == "held" and verdicts[inv]["checked_steps"] > 50, verdicts[inv]
    quality = next(f for f in result.findings if f["kind"] == "policy_quality")
    assert quality["evictions_with_choice"] > 50
    if name != "reference":
        assert quality["evictions_off_lru"] > 0  # the order made a difference
    else:
        assert quality["evictions_off_lru"] == 0


# -- the policy checks bite -------------------------------------------------------------------------


def test_candidates_unreferenced_covers_the_appending_requests_own_blocks() -> None:
    """An append that evicts its own request's cached block: no_active_eviction (other readers) sees nothing."""
    factory = _policy_paged(RanksReferenced, ReferenceSharedAwareAdapter)
    ops = [
        Op("admit", "r0", (5, 6)),  # r0's block, cached and held; never freed, so first in free order
        Op("admit", "r1", (7, 8)),
        Op("release", "r1"),  # the only real candidate
        Op("append", "r0", (9,)),  # needs one block: the buggy pool ranks r0's own block first
    ]
    found = replay_ops(factory(), Config(capacity=2, block_size=2), ops, refine=False)
    assert found is not None and found.step == 3
    assert "candidates_unreferenced" in found.failures
    assert "no_active_eviction" not in found.failures
    assert replay_ops(ReferenceSharedAwareAdapter(), Config(capacity=2, block_size=2), ops) is None


def _transition(before: Observation, op: Op, outcome: Outcome, after: Observation, sem: Semantics) -> Transition:
    memory = KeyMemory()
    for obs in (before, after):
        for r in obs.requests.values():
            for i, oid in enumerate(r.objects):
                key = obs.objects[oid].key
                if key is not None:
                    memory.content[key] = r.tokens[: (i + 1) * 2]
                    memory.key_of[r.tokens[: (i + 1) * 2]] = key
    return Transition(before, op, outcome, (), after, Config(capacity=4, block_size=2), sem, memory)


def test_no_spurious_refusal_flags_a_refusal_with_room_and_not_one_without() -> None:
    cached = ObjectView(0, 1, 2, 0, "k0")
    before = Observation(4, 2, {0: cached}, {}, {"k0": (0,)})
    with_room = _transition(before, Op("admit", "x", (7, 7, 7, 7, 7)), Outcome.refused(), before, Semantics())
    assert check_transition(with_room)["no_spurious_refusal"]  # 3 needed, 2 free + 1 evictable
    short = _transition(before, Op("admit", "x", (7,) * 7), Outcome.refused(), before, Semantics())
    assert check_transition(short)["no_spurious_refusal"] == []  # 4 needed


def _evicting(order: str, victim: int, hits: int | None) -> Transition:
    """Admission of x on a full 2-block pool whose two cached free blocks were released 0 first, then 1."""
    cached = {oid: ObjectView(oid, 1, 2, 0, f"k{oid}", hits) for oid in (0, 1)}
    before = Observation(2, 0, cached, {}, {"k0": (0,), "k1": (1,)})
    kept = 1 - victim
    after_objects = {kept: cached[kept], victim: ObjectView(victim, 1, 1, 1)}
    after = Observation(2, 0, after_objects, {"x": RequestView("x", (3,), 1, (victim,))}, {f"k{kept}": (kept,)})
    memory = KeyMemory(content={"k0": (1, 2), "k1": (3, 4)}, free_order={0: 1, 1: 2}, share_peak={0: 1, 1: 1})
    return Transition(
        before,
        Op("admit", "x", (3,)),
        Outcome.ok(0),
        (Event("evict", victim, f"k{victim}"),),
        after,
        Config(2, 2),
        Semantics(eviction=order),  # type: ignore[arg-type]
        memory,
    )


def test_policy_conformance_judges_what_it_observes_and_is_unknown_otherwise() -> None:
    """lru needs only the release order the checker tracks; shared_aware also needs hits, which vLLM does not report."""
    assert check_transition(_evicting("lru", 0, None))["policy_conformance"] == []
    assert check_transition(_evicting("lru", 1, None))["policy_conformance"]  # out of LRU order
    assert check_transition(_evicting("shared_aware", 1, None))["policy_conformance"] is None  # unknown
    assert check_transition(_evicting("shared_aware", 0, 0))["policy_conformance"] == []  # equal retain: older first
    assert check_transition(_evicting("shared_aware", 1, 0))["policy_conformance"]


def test_orphaned_blocks_are_counted() -> None:
    """A cached leaf whose trunk is gone can never be hit: the quality report counts it."""
    objects = {0: ObjectView(0, 1, 2, 0, "leaf"), 1: ObjectView(1, 1, 2, 0, "root")}
    memory = KeyMemory(content={"leaf": (1, 2, 3, 4), "root": (5, 6)})
    obs = Observation(4, 2, objects, {}, {"leaf": (0,), "root": (1,)})
    assert orphaned_blocks(obs, Config(4, 2), Semantics(), memory) == [0]
    with_trunk = {**objects, 2: ObjectView(2, 1, 2, 0, "trunk")}
    memory.content["trunk"] = (1, 2)
    assert orphaned_blocks(Observation(4, 1, with_trunk, {}, None), Config(4, 2), Semantics(), memory) == []


def test_a_policy_case_replays_from_json(tmp_path: Path) -> None:
    """A case on a policy adapter round-trips and replays like any other."""
    capacity, ops, _ = SCENARIOS["shared-aware-takes-a-chain-from-its-leaf"]
    case = Case("reference-shared-aware", Config(capacity=capacity, block_size=2), ops)
    path = case.save(tmp_path)
    again = Case.load(path)
    assert replay_ops(ReferenceSharedAwareAdapter(), again.config, again.ops) is None


def test_policy_parameters_are_spec_parameters() -> None:
    """The gate and the protection threshold are Semantics fields, checked and written to JSON like the rest."""
    with pytest.raises(SpecError):
        Semantics(protect_min_hits=-1)
    with pytest.raises(SpecError):
        Semantics(admission_anchor_blocks=-1)
    data = ReferenceFamilyProtectAdapter.capabilities.semantics.to_json()
    assert (data["eviction"], data["protect_min_hits"], data["admission_anchor_blocks"]) == ("family_protect", 1, 1)


@pytest.mark.slow
def test_a_pool_that_ignores_the_admission_gate_is_held_to_it(tmp_path: Path) -> None:
    """The gate is a spec parameter, so refinement catches a pool that caches a cold request's later blocks."""

    def ungated() -> ReferenceFamilyProtectAdapter:
        return ReferenceFamilyProtectAdapter(
            lambda c: PagedPrefixCache(c.capacity, c.block_size, policy=FamilyProtectPolicy())
        )

    profile = dataclasses.replace(PROFILES["ci"], step_count=20)
    result = run_check(ungated, "ungated", Options(profile=profile, cases_dir=tmp_path))
    assert result.exit_code == 1 and result.failure is not None
    # A cold two-block prompt released: the spec leaves its second block uncached (free), the pool cached it.
    assert result.failure.invariant == "predicted_free_capacity", result.failure
    assert len(result.failure_ops) == 2


# no_spurious_refusal judges a hit on a duplicated key by the declared duplicate_keys, from the objects and when
# each got its key: r1 fills a second block under r0's first key while r0 runs; r0 leaves; r2 needs two new blocks.
DUPLICATE_PRESSURE = [
    Op("admit", "r0", (0, 0, 1)),
    Op("admit", "r1", (0, 0)),
    Op("release", "r0"),
    Op("admit", "r2", (0, 0, 1, 1, 0, 0)),
]


def test_no_spurious_refusal_takes_the_newest_duplicate_not_the_index_entry_an_implementation_kept() -> None:
    """newest-keeps-first hits the idle older duplicate its index kept, though the newest (r1's block) is in use:
    free 1 + evictable 1 covers the 2 blocks r2 needs. The old judgement took the index's entry and saw no room."""
    cfg = Config(capacity=3, block_size=2)
    found = replay_ops(by_name("newest-keeps-first").factory(), cfg, DUPLICATE_PRESSURE, refine=False)
    assert found is not None and found.step == 3 and list(found.failures) == ["no_spurious_refusal"]
    assert replay_ops(ReferenceNewestAdapter(), cfg, DUPLICATE_PRESSURE) is None
    # Without the record of when each block got its key, the judgement falls back to the index's entry: no room.
    model = LedgerModel(cfg, Semantics(duplicate_keys="newest"))
    for op in DUPLICATE_PRESSURE[:3]:
        model.step(op)
    before = model.observe()
    r1 = before.requests["r1"].objects[0]
    key = before.objects[r1].key
    idle = next(oid for oid, o in before.objects.items() if o.key == key and oid != r1)
    kept_first = dataclasses.replace(before, index={**(before.index or {}), key: (idle,)})
    t = _transition(
        kept_first, DUPLICATE_PRESSURE[3], Outcome.refused(), kept_first, Semantics(duplicate_keys="newest")
    )
    assert check_transition(t)["no_spurious_refusal"] == []


def test_no_spurious_refusal_judges_the_best_copy_not_vllms_declared_first_entry_hit() -> None:
    """duplicate_keys="indexed" (vLLM): hits take the first entry, the idle older block, and the spec predicts that
    refusal; sharing the held copy instead would have fit, so the refusal is needless: a declared choice never
    excuses it (docs/semantics.md)."""
    cfg, sem = Config(capacity=3, block_size=2), Semantics(duplicate_keys="indexed", free_uncached="head")
    model, memory = LedgerModel(cfg, sem), KeyMemory()
    verdicts = []
    for op in DUPLICATE_PRESSURE:
        before = model.observe()
        step = model.step(op)
        t = Transition(before, op, step.outcome, (), model.observe(), cfg, sem, memory)
        verdicts.append((step.outcome.status, check_transition(t)["no_spurious_refusal"]))
    status, problems = verdicts[-1]
    assert status == "refused" and problems and "was refused with" in problems[0], verdicts[-1]
    held_first = LedgerModel(cfg, replace(sem, hit_prefers_held=True))  # the best choice, declared: it fits
    assert [held_first.step(op).outcome.status for op in DUPLICATE_PRESSURE][-1] == "ok"
