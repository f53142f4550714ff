"""The lifecycle simulator on its own, its adapter, and the adapter against the spec's record model."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from kvspec.adapters.base import Adapter
from kvspec.adapters.lifecycle_sim import LifecycleSimAdapter, prefix_of
from kvspec.reference.lifecycle import CapacityError, LifecycleSim, Record
from kvspec.spec import Config, KeyMemory, LedgerModel, Op, Transition, check_transition

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
    adapter = LifecycleSimAdapter(config=CONFIG)
    adapter.apply(admit("r1", 1, 2, 3))
    before, time = adapter.observe(), adapter.sim.time
    outcome = adapter.apply(op)
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

REQ_IDS = [f"r{i}" for i in range(6)]


class OpSource:
    """Deterministic random ops over a two-letter alphabet and a few request ids.

    Prompts and ids repeat on purpose. Most ops aim at a live request (append,
    release) or a free id (admit), going by the spec's own request table; the
    rest are aimed at random, which yields bad input too.
    """

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.seen: list[tuple[int, ...]] = []

    def _prompt(self) -> tuple[int, ...]:
        rng = self.rng
        if self.seen and rng.random() < 0.6:
            return rng.choice(self.seen)
        tokens = tuple(rng.randrange(2) for _ in range(rng.randint(1, 6)))
        self.seen.append(tokens)
        return tokens

    def next(self, live: set[str]) -> Op:
        rng = self.rng
        idle = [r for r in REQ_IDS if r not in live]
        roll, any_id = rng.random(), rng.choice(REQ_IDS)
        aimed = rng.random() < 0.9
        if roll < 0.45:
            req = rng.choice(idle) if idle and aimed else any_id
            return Op("admit", req, self._prompt())
        req = rng.choice(sorted(live)) if live and aimed else any_id
        if roll < 0.65:
            return Op("append", req, tuple(rng.randrange(2) for _ in range(rng.randint(1, 3))))
        if roll < 0.95:
            return Op("release", req, keep=rng.random() < 0.6)
        return rng.choice([Op("admit", any_id, ()), Op("admit", any_id, (0, -1)), Op("append", req, ())])


def differential_run(
    adapter: LifecycleSimAdapter, config: Config, source: OpSource, n: int = 300
) -> tuple[list[str], dict[str, int]]:
    """Run ``n`` ops on the adapter and the spec side by side, up to the first step where they disagree.

    Returns that step's mismatches (none: they agreed throughout) and a tally of what happened.
    """
    semantics = adapter.capabilities.semantics
    adapter.reset(config)
    model, memory = LedgerModel(config, semantics), KeyMemory()
    problems: list[str] = []
    tally = {"ok": 0, "refused": 0, "invalid": 0, "hits": 0, "evict": 0, "reclaim": 0}

    def ledger(objects: object) -> dict[object, tuple[int, int, int, int | None, int | None]]:
        assert isinstance(objects, dict)
        return {o.key: (o.size, o.tokens, o.ref_count, o.hits, o.last_used) for o in objects.values()}

    for i in range(n):
        op = source.next(set(model.requests))
        before = adapter.observe()
        outcome = adapter.apply(op)
        events = tuple(adapter.events())
        after = adapter.observe()
        step = model.step(op)
        where = f"step {i} {op}"
        if outcome.status != step.outcome.status:
            problems.append(f"{where}: status {outcome.status} ({outcome.message}), spec {step.outcome.status}")
        elif outcome.hit_tokens != step.outcome.hit_tokens:
            problems.append(f"{where}: hit {outcome.hit_tokens}, spec {step.outcome.hit_tokens}")
        if after.free != step.free:
            problems.append(f"{where}: free {after.free}, spec {step.free}")
        for kind, want in (("evict", step.evicted), ("reclaim", step.reclaimed)):
            got = tuple(e.key for e in events if e.kind == kind)
            if got != want:
                problems.append(f"{where}: {kind} {got}, spec {want}")
            tally[kind] += len(got)
        if ledger(after.objects) != ledger(model.observe().objects):
            problems.append(f"{where}: ledger {ledger(after.objects)}, spec {ledger(model.observe().objects)}")
        transition = Transition(before, op, outcome, events, after, config, semantics, memory, step)
        for name, found in check_transition(transition).items():
            problems += [f"{where}: {name}: {p}" for p in found or ()]
        if problems:  # later steps start from a diverged state: stop at the first one
            break
        tally[outcome.status] += 1
        tally["hits"] += bool(outcome.hit_tokens)
    return problems, tally


def test_adapter_matches_the_spec_on_a_random_run() -> None:
    problems, tally = differential_run(LifecycleSimAdapter(), CONFIG, OpSource(0))
    assert problems == []
    # The run must exercise every path, or agreement means little.
    assert all(tally[k] > 0 for k in tally), tally


class FloorRounding(LifecycleSim):
    def blocks_for_tokens(self, n: int) -> int:
        if n <= 0:
            raise ValueError("token count must be positive")
        return max(n // self.block_size_tokens, 1)


class PlainLRU(LifecycleSim):
    def _eviction_candidates(self) -> list[Record]:
        return sorted((r for r in self.records.values() if r.ref_count == 0), key=lambda r: r.last_used)


class EvictsActive(LifecycleSim):
    def _eviction_candidates(self) -> list[Record]:
        return sorted(self.records.values(), key=lambda r: (r.hits, r.last_used, -r.block_count))


class EvictsBeforeChecking(LifecycleSim):
    """Evicts first and checks afterwards: a refused request has already lost the cache."""

    def _make_room(self, needed: int) -> None:
        for rec in self._eviction_candidates():
            if self.free_blocks >= needed:
                break
            self._drop(rec, "evict")
        if self.free_blocks < needed:
            raise CapacityError("insufficient blocks")


SeededSim = Callable[[int, int], LifecycleSim]


@pytest.mark.parametrize(
    ("buggy", "caught_by"),
    [
        (FloorRounding, "tail_rounding"),
        (PlainLRU, "predicted_eviction"),
        (EvictsActive, "no_active_eviction"),
        (EvictsBeforeChecking, "atomic_failure"),
    ],
    ids=lambda x: getattr(x, "__name__", str(x)),
)
def test_the_random_run_catches_seeded_bugs(buggy: SeededSim, caught_by: str) -> None:
    adapter = LifecycleSimAdapter(sim_factory=lambda c: buggy(c.capacity, c.block_size))
    problems, _ = differential_run(adapter, CONFIG, OpSource(0))
    assert any(caught_by in p for p in problems), problems
