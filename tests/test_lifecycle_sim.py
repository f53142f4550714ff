"""The lifecycle simulator on its own, its adapter, and the adapter under the kit's conformance check.

Seeded bugs of this simulator live in tests/seeded_bugs.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvspec.adapter import Adapter
from kvspec.adapters.lifecycle_sim import LifecycleSimAdapter, prefix_of
from kvspec.reference.lifecycle import CapacityError, LifecycleSim, Record
from kvspec.spec import INVARIANTS, Config, Op
from kvspec.stateful_tests import PROFILES, Harness, Options, run_check

# -- the simulator ------------------------------------------------------------------


def test_constructor_rejects_non_positive_sizes() -> None:
    with pytest.raises(ValueError):
        LifecycleSim(total_blocks=0)
    with pytest.raises(ValueError):
        LifecycleSim(block_size_tokens=-1)


def test_token_counts_round_up_to_whole_blocks() -> None:
    sim = LifecycleSim(total_blocks=6, block_size_tokens=4)
    assert [sim.blocks_for_tokens(n) for n in (1, 3, 4, 5, 8, 9)] == [1, 1, 1, 2, 2, 3]
    for bad in (0, -3):
        with pytest.raises(ValueError):
            sim.blocks_for_tokens(bad)


@pytest.mark.parametrize(
    ("prefix", "tokens"),
    [("", 4), (None, 4), (7, 4), ("p", 0), ("p", -1), ("p", 25)],
)
def test_acquire_rejects_bad_input_without_ticking(prefix: object, tokens: int) -> None:
    sim = LifecycleSim(total_blocks=6, block_size_tokens=4)
    with pytest.raises(ValueError):
        sim.acquire(prefix, tokens)  # type: ignore[arg-type]
    assert sim.time == 0 and sim.records == {} and sim.log == []


def test_sharing_adds_a_reference_but_no_blocks() -> None:
    sim = LifecycleSim(total_blocks=6, block_size_tokens=4)
    first = sim.acquire("doc", 6)
    before = sim.allocated_blocks
    again = sim.acquire("doc", 6)
    assert again is first
    assert (again.ref_count, again.hits, again.last_used) == (2, 2, 2)
    assert sim.allocated_blocks == before == 2
    assert sim.free_blocks == 4


def test_append_takes_a_block_only_when_the_tail_overflows() -> None:
    sim = LifecycleSim(total_blocks=6, block_size_tokens=4)
    sim.acquire("gen", 3)
    assert sim.append("gen", 1) == 0  # fills the tail block
    assert sim.append("gen", 1) == 1  # spills into a new one
    rec = sim.records["gen"]
    assert (rec.used_tokens, rec.block_count, rec.last_used) == (5, 2, 3)
    assert sim.allocated_blocks == 2
    with pytest.raises(ValueError):
        sim.append("gen", 0)
    with pytest.raises(ValueError):
        sim.append("gen", 4 * 6)  # would outgrow the whole pool
    with pytest.raises(ValueError):
        sim.append("nobody", 1)


def test_release_keeps_or_reclaims_and_pressure_spares_active_records() -> None:
    sim = LifecycleSim(total_blocks=5, block_size_tokens=4)
    sim.acquire("cold", 8)
    assert sim.release("cold") == 0  # kept for reuse
    assert sim.records["cold"].state == "reusable"
    sim.acquire("busy", 8)
    sim.acquire("fresh", 8)  # needs 2 blocks, 1 free: evicts the idle record only
    assert "cold" not in sim.records
    assert sim.records["busy"].ref_count == 1
    assert (sim.allocated_blocks, sim.free_blocks) == (4, 1)
    assert sim.release("fresh", keep_reusable=False) == 0
    assert "fresh" not in sim.records and sim.allocated_blocks == 2
    assert sim.evictions == [("evict", "cold"), ("reclaim", "fresh")]
    with pytest.raises(ValueError):
        sim.append("fresh", 1)
    with pytest.raises(ValueError):
        sim.release("fresh")


def test_capacity_failure_leaves_active_records_alone() -> None:
    sim = LifecycleSim(total_blocks=3, block_size_tokens=4)
    sim.acquire("a", 8)
    sim.acquire("b", 4)
    with pytest.raises(CapacityError):
        sim.acquire("c", 4)
    assert set(sim.records) == {"a", "b"}
    assert sim.allocated_blocks == sim.total_blocks
    assert sim.evictions == []


def test_a_refused_call_changes_nothing_but_the_clock() -> None:
    # One idle block could be evicted, but even then the request would not fit:
    # nothing may be evicted for a request that is refused anyway.
    sim = LifecycleSim(total_blocks=6, block_size_tokens=4)
    sim.acquire("idle", 4)
    sim.release("idle")
    sim.acquire("busy", 12)
    sim.acquire("other", 4)
    before, log_len, time = sim.snapshot(), len(sim.log), sim.time
    with pytest.raises(CapacityError):
        sim.acquire("big", 12)
    assert sim.time == time + 1  # a valid call ticks even when it is refused
    assert sim.snapshot() == before and len(sim.log) == log_len
    assert sim.evictions == [] and sim.free_blocks == 1
    with pytest.raises(CapacityError):
        sim.append("busy", 9)  # 3 -> 6 blocks: 3 more, only 2 free or evictable
    assert sim.snapshot() == before and sim.evictions == []


def test_victims_are_fewest_hits_then_oldest_then_largest() -> None:
    sim = LifecycleSim(total_blocks=8, block_size_tokens=1)
    for prefix, n in (("old", 1), ("mid", 2), ("hot", 1)):
        sim.acquire(prefix, n)
    sim.acquire("hot", 1)  # hot now has 2 hits
    for prefix in ("hot", "hot", "old", "mid"):
        sim.release(prefix)
    # old and mid both have 1 hit; old was released before mid, so it goes first.
    assert [r.prefix for r in sim._eviction_candidates()] == ["old", "mid", "hot"]
    sim.acquire("new", 6)  # 4 free: needs 2 more, one eviction of 'old' is not enough
    assert sim.evictions == [("evict", "old"), ("evict", "mid")]
    assert set(sim.records) == {"hot", "new"}


def test_ties_on_hits_and_age_evict_the_larger_record_first() -> None:
    sim = LifecycleSim(total_blocks=4, block_size_tokens=1)
    small, large = Record("small", 1, 1, 0, 1, 5), Record("large", 2, 2, 0, 1, 5)
    sim.records = {"small": small, "large": large}
    assert sim._eviction_candidates() == [large, small]


def test_snapshot_lists_records_by_prefix() -> None:
    sim = LifecycleSim(total_blocks=4, block_size_tokens=2)
    sim.acquire("b", 3)
    sim.acquire("a", 1)
    sim.release("a")
    assert sim.snapshot() == [
        {
            "prefix": "a",
            "state": "reusable",
            "used_tokens": 1,
            "block_count": 1,
            "ref_count": 0,
            "hits": 1,
            "last_used": 3,
        },
        {
            "prefix": "b",
            "state": "active",
            "used_tokens": 3,
            "block_count": 2,
            "ref_count": 1,
            "hits": 1,
            "last_used": 1,
        },
    ]


# -- the adapter ----------------------------------------------------------------------

CONFIG = Config(capacity=10, block_size=2)


def admit(req: str, *tokens: int) -> Op:
    return Op("admit", req, tuple(tokens))


def test_adapter_satisfies_the_protocol() -> None:
    adapter = LifecycleSimAdapter(config=CONFIG)
    assert isinstance(adapter, Adapter)
    assert adapter.capabilities.semantics.granularity == "record"
    assert adapter.capabilities.ops == frozenset({"admit", "append", "release"})


def test_adapter_shares_records_and_reports_prompt_keys() -> None:
    adapter = LifecycleSimAdapter(config=CONFIG)
    assert adapter.apply(admit("r1", 1, 2, 3)).hit_tokens == 0
    assert adapter.apply(admit("r2", 1, 2, 3)).hit_tokens == 3
    assert adapter.apply(Op("append", "r1", (4,))).status == "ok"
    obs = adapter.observe()
    assert list(obs.objects) == ["1,2,3"]
    rec = obs.objects["1,2,3"]
    assert (rec.key, rec.size, rec.tokens, rec.ref_count, rec.hits) == ((1, 2, 3), 2, 4, 2, 2)
    assert obs.index == {(1, 2, 3): ("1,2,3",)}
    assert (obs.capacity, obs.free) == (10, 8)
    assert obs.requests["r1"].tokens == (1, 2, 3, 4) and obs.requests["r1"].prompt_len == 3
    assert obs.requests["r2"].tokens == (1, 2, 3) and obs.requests["r2"].objects == ("1,2,3",)
    assert adapter.events() == []
    assert adapter.apply(Op("release", "r1", keep=False)).status == "ok"  # still shared: kept
    assert adapter.events() == [] and "1,2,3" in adapter.observe().objects
    assert adapter.apply(Op("release", "r2", keep=False)).status == "ok"
    events = adapter.events()
    assert [(e.kind, e.oid, e.key) for e in events] == [("reclaim", "1,2,3", (1, 2, 3))]
    assert adapter.events() == []  # drained
    obs = adapter.observe()
    assert obs.objects == {} and obs.requests == {} and obs.free == 10


@pytest.mark.parametrize(
    "op",
    [
        admit("r9"),
        admit("r9", 1, -2),
        admit("r9", *range(21)),  # 11 blocks > 10
        admit("", 1),
        Op("admit", None, (1,)),
        admit("r1", 5),  # r1 is live already
        Op("append", "r1", ()),
        Op("append", "r1", (-1,)),
        Op("append", "r1", tuple(range(18))),  # 20 tokens -> 11 blocks
        Op("append", "ghost", (1,)),
        Op("release", "ghost"),
        Op("preempt", "r1"),
        Op("resume", "r1"),
        Op("reset_cache"),
    ],
    ids=str,
)
def test_adapter_reports_bad_input_as_invalid_and_changes_nothing(op: Op) -> None:
    """Bad input is answered before the simulator is called (the kit's one validation: checks_input=False)."""
    adapter = LifecycleSimAdapter(config=CONFIG)
    harness = Harness(adapter, CONFIG)
    harness.step(admit("r1", 1, 2, 3))
    before, time = adapter.observe(), adapter.sim.time
    # An op the simulator does not implement is its own answer; bad input is the kit's (the harness).
    outcome = adapter.apply(op) if op.op not in adapter.capabilities.ops else harness.step(op)
    assert outcome.status == "invalid", outcome
    assert adapter.observe() == before and adapter.sim.time == time
    assert adapter.events() == []


def test_adapter_refuses_when_active_records_fill_the_pool() -> None:
    adapter = LifecycleSimAdapter(config=Config(capacity=3, block_size=2))
    adapter.apply(admit("a", 1, 2, 3))
    adapter.apply(admit("b", 4))
    before = adapter.observe()
    outcome = adapter.apply(admit("c", 5))
    assert outcome.status == "refused" and outcome.message
    assert adapter.observe() == before and adapter.events() == []


def test_adapter_builds_its_simulator_through_the_factory() -> None:
    seen: list[Config] = []

    def factory(config: Config) -> LifecycleSim:
        seen.append(config)
        return LifecycleSim(config.capacity, config.block_size)

    adapter = LifecycleSimAdapter(sim_factory=factory, config=CONFIG)
    adapter.reset(Config(capacity=4, block_size=1))
    assert seen == [CONFIG, Config(capacity=4, block_size=1)]
    assert (adapter.sim.total_blocks, adapter.sim.block_size_tokens) == (4, 1)
    assert prefix_of((3, 10, 0)) == "3,10,0"


# -- the adapter against the spec -------------------------------------------------------


def test_adapter_conforms_to_the_spec_under_the_kits_own_check(tmp_path: Path) -> None:
    """The kit's stateful check holds every invariant, refinement included, and reaches every path."""
    result = run_check(
        LifecycleSimAdapter, "lifecycle-sim", Options(profile=PROFILES["ci"], max_examples=60, cases_dir=tmp_path)
    )
    assert result.status == "passed", (result.error, result.failure)
    verdicts = {row["name"]: row["verdict"] for row in result.report().verdicts()}
    assert {name: verdicts[name] for name in result.applicable} == dict.fromkeys(result.applicable, "held")
    assert {i.name for i in INVARIANTS if "record" in i.granularities} <= result.applicable  # refinement too
    coverage = result.tally.coverage
    # Agreement means little unless eviction, refusal and sharing all happened.
    assert coverage["evict"] > 0 and coverage["reclaim"] > 0, coverage
    assert sum(n for k, n in coverage.items() if k.endswith(":refused")) > 0, coverage
    assert coverage["prefix_hit"] > 0, coverage
    assert result.cases == [] and not any(tmp_path.iterdir())
