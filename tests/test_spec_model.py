"""The executable spec itself: its bad-input contract, its block semantics, and its own invariants."""

from __future__ import annotations

import random

import pytest

from kvspec.adapter import Capabilities
from kvspec.spec import INVARIANTS, Config, Event, Observation, Op, Outcome, Semantics, SpecError
from kvspec.spec.invariants import KeyMemory, Transition, check_transition
from kvspec.spec.ledger import LedgerModel, validate
from kvspec.spec.policies import retention_score
from kvspec.stateful_tests import PROFILES, Options, run_check

BLOCK = Semantics()
RECORD = Semantics(granularity="record", eviction="lifecycle", hit_cap=False)
ENTRY = Semantics(granularity="entry", eviction="score", hit_cap=False)


class SpecAdapter:
    """The spec's own model behind the adapter contract, so the suite can check the spec."""

    def __init__(self, semantics: Semantics = BLOCK) -> None:
        self.name = f"spec-{semantics.granularity}"
        ops = {"block": None, "record": {"admit", "append", "release"}, "entry": {"admit"}}[semantics.granularity]
        self.capabilities = Capabilities(semantics=semantics, **({"ops": frozenset(ops)} if ops else {}))  # type: ignore[arg-type]
        self.model = LedgerModel(Config(), semantics)
        self._events: list[Event] = []

    def reset(self, config: Config) -> None:
        self.model = LedgerModel(config, self.capabilities.semantics)

    def apply(self, op: Op) -> Outcome:
        before = self.model.observe()
        step = self.model.step(op)
        index = before.index or {}
        evicted = step.evicted_slots or tuple(index[k][0] for k in step.evicted)
        reclaimed = step.reclaimed_slots or tuple(index[k][0] for k in step.reclaimed)
        self._events = [Event("evict", oid, k) for k, oid in zip(step.evicted, evicted, strict=True)]
        self._events += [Event("reclaim", oid, k) for k, oid in zip(step.reclaimed, reclaimed, strict=True)]
        return step.outcome

    def observe(self) -> Observation:
        return self.model.observe()

    def events(self) -> list[Event]:
        out, self._events = self._events, []
        return out

    def close(self) -> None:
        pass


VLLM_LIKE = Semantics(duplicate_keys="indexed", free_uncached="head")
SCORE = Semantics(eviction="score")
SHARED_AWARE = Semantics(eviction="shared_aware", duplicate_keys="indexed", free_uncached="head")
FAMILY_PROTECT = Semantics(eviction="family_protect", protect_min_hits=2, admission_anchor_blocks=1)


@pytest.mark.parametrize(
    "semantics",
    [BLOCK, VLLM_LIKE, SCORE, SHARED_AWARE, FAMILY_PROTECT, RECORD, ENTRY],
    ids=["block", "block-vllm", "block-score", "block-shared-aware-vllm", "block-family-protect", "record", "entry"],
)
@pytest.mark.slow
def test_the_spec_satisfies_its_own_invariants(semantics: Semantics, tmp_path: object) -> None:
    """The model, checked by the suite as if it were an implementation, holds every invariant.

    At block granularity that includes policy_conformance: the checker recomputes each
    eviction order from what it observes, independently of the model's own ranking.
    """
    result = run_check(
        lambda: SpecAdapter(semantics), "spec", Options(profile=PROFILES["ci"], max_examples=80, cases_dir=tmp_path)
    )
    assert result.status == "passed", result.failure
    assert result.tally.coverage["evict"] > 0
    if semantics.granularity != "entry":  # entries are never referenced, so an admission always fits
        assert result.tally.coverage["admit:refused"] > 0
    if semantics.granularity == "block":
        conformance = next(row for row in result.report().verdicts() if row["name"] == "policy_conformance")
        assert conformance["verdict"] == "held" and conformance["checked_steps"] > 20, conformance


BAD_INPUT = [
    (Op("admit", "r0", ()), "empty prompt"),
    (Op("admit", "r0", (-1,)), "non-negative"),
    (Op("admit", "", (1,)), "request id"),
    (Op("admit", "r0", (0,) * 33), "larger than the whole cache"),
    (Op("append", "ghost", (1,)), "unknown"),
    (Op("release", "ghost"), "unknown"),
    (Op("preempt", "ghost"), "unknown"),
    (Op("resume", "ghost"), "unknown"),
]


@pytest.mark.parametrize(("op", "message"), BAD_INPUT, ids=lambda x: str(x))
def test_bad_input_is_an_error_and_changes_nothing(op: Op, message: str) -> None:
    model = LedgerModel(Config(capacity=8, block_size=4), BLOCK)
    model.step(Op("admit", "live", (1, 2, 3, 4, 5)))
    before = model.observe()
    with pytest.raises(SpecError, match=message):
        validate(op, before, model.config, BLOCK)
    step = model.step(op)
    assert step.outcome.status == "invalid"
    assert model.observe() == before


def test_bad_input_on_live_requests() -> None:
    model = LedgerModel(Config(capacity=4, block_size=4), BLOCK)
    model.step(Op("admit", "a", (1, 2, 3)))
    for op in [
        Op("admit", "a", (1,)),
        Op("append", "a", ()),
        Op("append", "a", (0,) * 14),
        Op("resume", "a"),
        Op("preempt", "a", mode="swap"),
    ]:
        before = model.observe()
        assert model.step(op).outcome.status == "invalid", op
        assert model.observe() == before
    model.step(Op("preempt", "a"))
    assert model.step(Op("append", "a", (1,))).outcome.status == "invalid"
    model.step(Op("release", "a"))
    assert model.step(Op("release", "a")).outcome.status == "invalid"


def test_prefix_hit_leaves_one_token_to_compute() -> None:
    model = LedgerModel(Config(capacity=8, block_size=2), BLOCK)
    model.step(Op("admit", "a", (1, 2, 3, 4)))
    assert model.step(Op("admit", "b", (1, 2, 3, 4))).outcome.hit_tokens == 2  # capped: last block recomputed
    assert model.step(Op("admit", "c", (1, 2, 3, 4, 5))).outcome.hit_tokens == 4
    uncapped = LedgerModel(Config(capacity=8, block_size=2), Semantics(hit_cap=False))
    uncapped.step(Op("admit", "a", (1, 2, 3, 4)))
    assert uncapped.step(Op("admit", "b", (1, 2, 3, 4))).outcome.hit_tokens == 4


def test_lazy_lru_eviction_takes_the_tail_block_of_the_oldest_request_first() -> None:
    model = LedgerModel(Config(capacity=4, block_size=2), BLOCK)
    model.step(Op("admit", "a", (1, 2, 3, 4)))
    model.step(Op("admit", "b", (5, 6, 7, 8)))
    model.step(Op("release", "a"))
    model.step(Op("release", "b"))
    assert model.free == 0  # all four blocks stay cached after release
    step = model.step(Op("admit", "c", (9, 9)))
    assert step.evicted == ((1, 2, 3, 4),)  # a's tail block went first
    assert model.step(Op("admit", "d", (1, 2, 0))).outcome.hit_tokens == 2  # a's head block still cached


def test_cached_free_blocks_count_towards_admission() -> None:
    model = LedgerModel(Config(capacity=2, block_size=2), BLOCK)
    model.step(Op("admit", "a", (1, 2, 3, 4)))
    model.step(Op("release", "a"))
    assert model.step(Op("admit", "b", (7, 7, 7))).outcome.status == "ok"


def test_reset_is_refused_while_blocks_are_in_use_and_reclaims_when_idle() -> None:
    model = LedgerModel(Config(capacity=4, block_size=2), BLOCK)
    model.step(Op("admit", "a", (1, 2, 3)))
    assert model.step(Op("reset_cache")).outcome.status == "refused"
    model.step(Op("release", "a"))
    step = model.step(Op("reset_cache"))
    assert step.outcome.status == "ok" and step.reclaimed == ((1, 2),)
    assert model.free == 4


def test_preempt_keeps_the_cache_and_resume_hits_it() -> None:
    model = LedgerModel(Config(capacity=4, block_size=2), BLOCK)
    model.step(Op("admit", "a", (1, 2, 3, 4, 5)))
    model.step(Op("preempt", "a"))
    assert model.observe().requests["a"].state == "preempted"
    assert model.step(Op("resume", "a")).outcome.hit_tokens == 4


def test_refused_resume_stays_preempted() -> None:
    model = LedgerModel(Config(capacity=3, block_size=2), BLOCK)
    model.step(Op("admit", "a", (1, 2, 3, 4, 5)))
    model.step(Op("preempt", "a"))
    model.step(Op("admit", "b", (9, 9, 9, 9, 9)))
    before = model.observe()
    assert model.step(Op("resume", "a")).outcome.status == "refused"
    assert model.observe() == before


def test_record_eviction_order_is_hits_then_age_then_size() -> None:
    model = LedgerModel(Config(capacity=5, block_size=1), RECORD)
    model.step(Op("admit", "a", (1,)))
    model.step(Op("admit", "a2", (1,)))  # shared: hits 2
    model.step(Op("admit", "b", (2,)))
    for r in ("a", "a2", "b"):
        model.step(Op("release", r))
    model.step(Op("admit", "c", (3, 3)))
    step = model.step(Op("admit", "d", (4, 4, 4)))
    assert step.evicted[0] == (2,)  # fewest hits goes first though (1,) is older


def test_retention_score_is_monotone_on_samples() -> None:
    rng = random.Random(0)
    for _ in range(1000):
        hits, size, age, cap = rng.randint(0, 9), rng.randint(1, 99), rng.randint(0, 50), rng.randint(1, 100)
        assert retention_score(hits + 1, size, age, cap) >= retention_score(hits, size, age, cap)
        assert retention_score(hits, size, age, cap) >= retention_score(hits, size, age + 1, cap)
        assert retention_score(hits, size + 1, age, cap) <= retention_score(hits, size, age, cap)


def test_each_invariant_is_documented_and_uniquely_named() -> None:
    names = [inv.name for inv in INVARIANTS]
    assert len(names) == len(set(names))
    assert all(inv.doc for inv in INVARIANTS)


def test_an_invariant_reports_a_doctored_observation() -> None:
    """A direct unit check: capacity_conservation flags a ledger that does not add up."""
    model = LedgerModel(Config(capacity=4, block_size=2), BLOCK)
    before = model.observe()
    model.step(Op("admit", "a", (1, 2, 3)))
    after = model.observe()
    lying = Observation(after.capacity, after.free + 1, after.objects, after.requests, after.index)
    t = Transition(before, Op("admit", "a", (1, 2, 3)), Outcome.ok(0), (), lying, model.config, BLOCK, KeyMemory())
    results = check_transition(t)
    assert results["capacity_conservation"]
    assert not results["ref_count_matches_references"]


@pytest.mark.parametrize(("mode", "free_after"), [("unkeyed", 3), ("indexed", 2)])
def test_duplicate_keys(mode: str, free_after: int) -> None:
    """A block filled with a prefix another block already caches stays uncached, or is cached too (vLLM)."""
    model = LedgerModel(Config(capacity=4, block_size=2), Semantics(duplicate_keys=mode))  # type: ignore[arg-type]
    model.step(Op("admit", "a", (1, 2)))
    model.step(Op("admit", "b", (1, 2)))  # the hit cap: b computes its one block itself
    model.step(Op("release", "b"))
    obs = model.observe()
    assert obs.free == free_after
    assert obs.index is not None and len(obs.index[(1, 2)]) == (2 if mode == "indexed" else 1)


@pytest.mark.parametrize(("mode", "evicted"), [("tail", ((1000, 1001),)), ("head", ())])
def test_free_uncached(mode: str, evicted: tuple[tuple[int, ...], ...]) -> None:
    """A released uncached block joins the free queue's tail, or its head, to be reused before any eviction."""
    model = LedgerModel(Config(capacity=3, block_size=2), Semantics(free_uncached=mode))  # type: ignore[arg-type]
    for op in (
        Op("admit", "r0", (1000, 1001)),
        Op("preempt", "r0"),
        Op("admit", "r1", (1000,)),
        Op("admit", "r2", (1000,)),
        Op("preempt", "r1"),
    ):
        model.step(op)
    assert model.step(Op("admit", "r3", (1192,))).evicted == evicted
