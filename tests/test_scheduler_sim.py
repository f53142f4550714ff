"""The scheduler simulator on its own, its adapter, and the adapter under the kit's conformance check.

Seeded bugs of this simulator live in tests/seeded_bugs.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvspec.adapter import Adapter
from kvspec.adapters.scheduler_sim import SchedulerSimAdapter
from kvspec.reference.scheduler import SchedulerSim
from kvspec.spec import INVARIANTS, Config, Event, Op
from kvspec.spec.invariants import KeyMemory, Transition, check_transition
from kvspec.spec.ledger import LedgerModel
from kvspec.spec.policies import retention_score
from kvspec.stateful_tests import PROFILES, Harness, Options, run_check

# -- the simulator ------------------------------------------------------------------


def test_scheduling_scenario_scores_reuses_evicts_and_snapshots() -> None:
    with pytest.raises(ValueError):
        SchedulerSim(capacity_bytes=0)

    sim = SchedulerSim(capacity_bytes=128)
    log = sim.schedule([("a", 40), ("b", 48), ("a", 40), ("c", 56), ("d", 48), ("a", 40)])
    # c needs room: b (one hit) goes before a (two hits); then d pushes out c.
    assert sim.evictions == ["b", "c"]
    assert len(log) == 6 + 2 and sum(line.startswith("reuse a") for line in log) == 2
    assert set(sim.entries) == {"a", "d"}
    assert sim.current_bytes == sum(e.size_bytes for e in sim.entries.values()) == 88
    assert sim.current_bytes <= sim.capacity_bytes

    snap = sim.snapshot()
    assert [row[0] for row in snap] == ["a", "d"]
    assert all(len(row) == 4 for row in snap)
    assert [row[2] for row in snap] == sorted((row[2] for row in snap), reverse=True)
    assert snap[0][3] == 3

    # Reuse, recency and size each move the score the documented way.
    now = sim.time
    assert sim.score(hits=3, size=16, last_used=now) > sim.score(hits=1, size=16, last_used=now)
    assert sim.score(hits=1, size=16, last_used=now) > sim.score(hits=1, size=16, last_used=0)
    assert sim.score(hits=1, size=16, last_used=now) > sim.score(hits=1, size=64, last_used=now)

    # A refreshed entry leaves a stale heap item behind; it must be skipped, not evicted twice.
    stale = SchedulerSim(capacity_bytes=80)
    stale.touch("hot", 32)
    stale.touch("hot", 32)
    assert len(stale.queue) == 2
    stale.touch("cold", 64)
    assert stale.evictions == ["hot"]
    assert set(stale.entries) == {"cold"} and stale.current_bytes == 64
    assert stale.queue == [(stale.entries["cold"].priority, 3, "cold")]

    for prefix, size in (("", 8), ("bad-size", 0), ("too-large", 129)):
        with pytest.raises(ValueError):
            sim.touch(prefix, size)
    assert sim.time == now


def test_score_is_bit_identical_to_the_spec() -> None:
    sim = SchedulerSim(capacity_bytes=96)
    sim.time = 7
    for hits in (1, 2, 5):
        for size in (1, 13, 96):
            for last_used in (0, 3, 7):
                assert sim.score(hits, size, last_used) == retention_score(hits, size, 7 - last_used, 96)


def test_a_stale_heap_item_never_picks_the_victim() -> None:
    sim = SchedulerSim(capacity_bytes=40)
    sim.touch("a", 16)
    sim.touch("b", 16)
    sim.touch("a", 16)  # a's first item now sits on top of the heap, stale
    top = sim.queue[0]
    assert top[1:] == (1, "a") and top[0] < sim.entries["a"].priority
    sim.touch("c", 16)
    assert sim.evictions == ["b"]
    assert sorted(sim.entries) == ["a", "c"]


def test_a_hit_keeps_the_entry_size() -> None:
    sim = SchedulerSim(capacity_bytes=64)
    sim.touch("p", 10)
    entry = sim.touch("p", 50)
    assert (entry.size_bytes, entry.hits, entry.last_used) == (10, 2, 2)
    assert sim.current_bytes == 10


# -- the adapter ----------------------------------------------------------------------

CONFIG = Config(capacity=64, block_size=4, bytes_per_token=4)


def admit(req: str | None, *tokens: int) -> Op:
    return Op("admit", req, tuple(tokens))


def test_adapter_satisfies_the_protocol() -> None:
    adapter = SchedulerSimAdapter(config=CONFIG)
    assert isinstance(adapter, Adapter)
    assert adapter.capabilities.semantics.granularity == "entry"
    assert adapter.capabilities.ops == frozenset({"admit"})


def test_adapter_accesses_entries_without_keeping_requests() -> None:
    adapter = SchedulerSimAdapter(config=CONFIG)
    assert adapter.apply(admit("q", 1, 2)).hit_tokens == 0
    assert adapter.apply(admit("q", 1, 2)).hit_tokens == 2  # same id again: requests do not persist
    obs = adapter.observe()
    assert obs.requests == {}
    assert (obs.capacity, obs.free) == (64, 56)
    entry = obs.objects["1,2"]
    assert (entry.key, entry.size, entry.tokens, entry.ref_count, entry.hits, entry.last_used) == (
        (1, 2),
        8,
        2,
        0,
        2,
        2,
    )
    assert obs.index == {(1, 2): ("1,2",)}
    assert adapter.apply(admit("q", *[3] * 14)).hit_tokens == 0  # 56 bytes: fills the pool exactly
    assert adapter.events() == []
    assert adapter.apply(admit("q", 4)).status == "ok"  # 4 more bytes: the 56-byte entry scores lowest
    assert [(e.kind, e.oid, e.key) for e in adapter.events()] == [("evict", ",".join(["3"] * 14), (3,) * 14)]
    assert adapter.events() == []
    assert set(adapter.observe().objects) == {"1,2", "4"}


@pytest.mark.parametrize(
    "op",
    [
        admit("q"),
        admit("q", 1, -1),
        admit("q", *range(17)),  # 68 bytes > 64
        admit("", 1),
        admit(None, 1),
        Op("append", "q", (1,)),
        Op("release", "q"),
        Op("preempt", "q"),
        Op("reset_cache"),
    ],
    ids=str,
)
def test_adapter_reports_bad_input_as_invalid_and_changes_nothing(op: Op) -> None:
    """Bad input is answered before the simulator is called (the kit's one validation: checks_input=False)."""
    adapter = SchedulerSimAdapter(config=CONFIG)
    harness = Harness(adapter, CONFIG)
    harness.step(admit("q", 1, 2))
    before, time = adapter.observe(), adapter.sim.time
    # An op the simulator does not implement is its own answer; bad input is the kit's (the harness).
    outcome = adapter.apply(op) if op.op not in adapter.capabilities.ops else harness.step(op)
    assert outcome.status == "invalid", outcome
    assert adapter.observe() == before and adapter.sim.time == time
    assert adapter.events() == []


def test_adapter_reports_the_simulators_own_byte_counter() -> None:
    """Free capacity is capacity_bytes - current_bytes as the simulator keeps it, never a recount of
    the entries: otherwise capacity_conservation could not see a counter that drifts."""
    adapter = SchedulerSimAdapter(config=CONFIG)
    adapter.apply(admit("q", 1, 2))
    adapter.sim.current_bytes += 4  # drift the counter behind the adapter's back
    obs = adapter.observe()
    assert obs.free == 64 - 12
    assert obs.free + sum(o.size for o in obs.objects.values()) != obs.capacity


def test_adapter_builds_its_simulator_through_the_factory() -> None:
    adapter = SchedulerSimAdapter(sim_factory=lambda c: SchedulerSim(c.capacity * 2), config=CONFIG)
    assert adapter.sim.capacity_bytes == 128
    assert adapter.observe().capacity == 128


# -- the adapter against the spec -------------------------------------------------------


def test_adapter_conforms_to_the_spec_under_the_kits_own_check(tmp_path: Path) -> None:
    """The kit's stateful check holds every invariant, refinement included, and reaches every path."""
    result = run_check(
        SchedulerSimAdapter, "scheduler-sim", Options(profile=PROFILES["ci"], max_examples=60, cases_dir=tmp_path)
    )
    assert result.status == "passed", (result.error, result.failure)
    verdicts = {row["name"]: row["verdict"] for row in result.report().verdicts()}
    assert {name: verdicts[name] for name in result.applicable} == dict.fromkeys(result.applicable, "held")
    assert {i.name for i in INVARIANTS if "entry" in i.granularities} <= result.applicable  # refinement too
    coverage = result.tally.coverage
    assert coverage["evict"] > 0 and coverage["prefix_hit"] > 0, coverage
    # Entries are never referenced, so nothing valid is refused: an entry larger than the
    # whole pool is bad input. The refusal path at this granularity is that rejection.
    assert coverage["admit:invalid"] > 0, coverage
    assert not any(k.endswith(":refused") for k in coverage), coverage
    assert result.cases == [] and not any(tmp_path.iterdir())


def test_spec_invariants_accept_the_specs_own_entry_ledger() -> None:
    """The spec's own entry-granularity steps, a hit and an eviction among them, satisfy every invariant.

    Requests do not persist at entry granularity; share_without_duplication must not ask for them.
    """
    semantics = SchedulerSimAdapter.capabilities.semantics
    model = LedgerModel(CONFIG, semantics)
    memory = KeyMemory()
    for op in (admit("q", 1, 2), admit("q", 1, 2), admit("r", *[3] * 14), admit("s", 4)):
        before = model.observe()
        step = model.step(op)
        events = tuple(Event("evict", key, key) for key in step.evicted)
        transition = Transition(before, op, step.outcome, events, model.observe(), CONFIG, semantics, memory, step)
        assert step.outcome.status == "ok"
        assert {name: found for name, found in check_transition(transition).items() if found} == {}, op
    assert step.evicted == ((3,) * 14,)  # the last admit did evict
