"""The vLLM adapters: the conformance suite passes on vLLM's real allocator, and it bites on vLLM itself.

Needs the vLLM extra; skipped otherwise (the core suite passes without it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM extra not installed: pip install kvspec[vllm]")

from vllm_bugs import KNOWN_BUGS, SEEDED_AS, VLLM_BUGS, VllmBug

from kvspec.adapter import Adapter
from kvspec.adapters import _vllm_shims as shims
from kvspec.adapters.vllm_blockpool import VllmBlockPoolAdapter
from kvspec.adapters.vllm_inprocess import VllmAdapter, VllmProjection
from kvspec.spec import Config, Op
from kvspec.spec.invariants import HYBRID_INVARIANTS, RADIX_INVARIANTS
from kvspec.stateful_tests import PROFILES, Harness, Options, check_adapter, replay_ops, run_check

FACTORIES: dict[str, type[VllmProjection]] = {"vllm": VllmAdapter, "vllm-blockpool": VllmBlockPoolAdapter}


def exact() -> bool:
    """Whether the installed spec can express vLLM's semantics (else the refinement checks are off)."""
    return VllmAdapter().capabilities.semantics.exact


def tolerates_repeats() -> bool:
    """Whether the installed BlockPool.free_blocks takes two references to a block in one call (0.24+)."""
    return VllmAdapter().vllm.free_blocks_tolerates_repeats()


def blockpool() -> VllmBlockPoolAdapter:
    """The block-level adapter; on releases with the known free_blocks bug (KNOWN_BUGS), one reference per call."""
    return VllmBlockPoolAdapter(sibling_frees=tolerates_repeats())


blockpool.name = "vllm-blockpool"  # type: ignore[attr-defined]


@pytest.fixture(params=["vllm", "vllm-blockpool"])
def factory(request: pytest.FixtureRequest) -> Any:
    return VllmAdapter if request.param == "vllm" else blockpool


def run(adapter: Adapter, config: Config, *ops: Op) -> list[Any]:
    adapter.reset(config)
    return [adapter.apply(op) for op in ops]


# -- the suite passes on the real allocator ------------------------------------------------------


def test_conformance_passes(factory: Any, tmp_path: Path) -> None:
    """The suite as `kvspec check` runs it (coverage cases and the bad-input tour first) holds on vLLM."""
    report = check_adapter(factory, factory.name, Options(max_examples=60, cases_dir=tmp_path))
    assert report.status == "passed", [report.findings, report.error]
    assert report.adapter_version.startswith("vllm ")
    verdicts = {r["name"]: r["verdict"] for r in report.verdicts()}
    radix = {inv.name for inv in (*RADIX_INVARIANTS, *HYBRID_INVARIANTS)}  # one group: no radix tree, no per-group view
    assert verdicts["free_list_exact"] == "held"  # the free queue is shown (spec.free_list_view)
    not_held = {n: v for n, v in verdicts.items() if v != "held" and n != "adapter_contract" and n not in radix}
    assert not {n for n in not_held if not n.startswith("predicted_")}, not_held
    refinement = {v for n, v in verdicts.items() if n.startswith("predicted_")}
    assert refinement == ({"held"} if exact() else {"unknown"})
    for situation in ("evict", "prefix_hit", "admit:refused", "append:refused", "reclaim"):
        assert report.coverage.get(situation, 0) > 0, situation


def test_declared_semantics_follow_the_release() -> None:
    adapter = VllmAdapter()
    sem = adapter.capabilities.semantics
    assert (sem.granularity, sem.eviction, sem.hit_cap, sem.reset_requires_idle) == ("block", "lru", True, True)
    if exact():
        assert sem.duplicate_keys == "indexed"
        assert sem.free_uncached == ("head" if adapter.vllm.uncached_freed_first() else "tail")
    else:
        assert adapter.capabilities.notes


# -- the projection is vLLM's own accounting -------------------------------------------------------


def test_null_block_is_reserved(factory: Any) -> None:
    adapter = factory()
    adapter.reset(Config(capacity=3, block_size=2))
    obs = adapter.observe()
    assert adapter.pool.num_gpu_blocks == 4 and adapter.pool.blocks[0].is_null
    assert (obs.capacity, obs.free, dict(obs.objects)) == (3, 3, {})
    assert 0 not in obs.objects


def test_cached_free_blocks_are_objects_until_popped(factory: Any) -> None:
    """Lazy eviction: a released full block keeps its hash in the free queue, then loses it when reused."""
    adapter = factory()
    outcomes = run(adapter, Config(capacity=3, block_size=2), Op("admit", "a", (1, 2, 3)), Op("release", "a"))
    assert [o.status for o in outcomes] == ["ok", "ok"]
    obs = adapter.observe()
    (cached,) = obs.objects.values()
    assert cached.ref_count == 0 and cached.key is not None
    assert obs.free == 2 and adapter.pool.get_num_free_blocks() == 3  # vLLM counts it free; the ledger as cached
    assert adapter.apply(Op("admit", "b", (7, 8, 9, 10, 11))).status == "ok"  # 3 blocks: the cached one is popped
    events = adapter.events()
    assert [(e.kind, e.oid) for e in events if e.kind == "evict"] == [("evict", cached.oid)]


def test_hit_cap_leaves_one_token(factory: Any) -> None:
    adapter = factory()
    run(adapter, Config(capacity=6, block_size=2), Op("admit", "a", (1, 2, 3, 4)))
    assert adapter.apply(Op("admit", "b", (1, 2, 3, 4))).hit_tokens == 2  # not 4: the last block is recomputed
    assert adapter.apply(Op("admit", "c", (1, 2, 3, 4, 5))).hit_tokens == 4


def test_independently_filled_blocks_share_a_hash(factory: Any) -> None:
    """No de-duplication: the index lists both blocks under one hash (declared duplicate_keys='indexed')."""
    adapter = factory()
    run(adapter, Config(capacity=4, block_size=2), Op("admit", "a", (1, 2)), Op("admit", "b", (1, 2)))
    obs = adapter.observe()
    assert obs.index is not None
    assert sorted(len(oids) for oids in obs.index.values()) == [2]
    a, b = obs.requests["a"].objects, obs.requests["b"].objects
    assert a != b and obs.objects[a[0]].key == obs.objects[b[0]].key


def test_refused_append_changes_nothing(factory: Any) -> None:
    adapter = factory()
    run(adapter, Config(capacity=3, block_size=2), Op("admit", "a", (1, 2, 3)), Op("admit", "b", (9,)))
    before = adapter.observe()
    assert adapter.apply(Op("append", "a", (4, 5))).status == "refused"
    after = adapter.observe()
    assert after.requests == before.requests and after.free == before.free
    assert len(adapter.running["a"].block_hashes) == 1


def test_bad_input_is_rejected_before_the_allocator(factory: Any) -> None:
    """The kit answers bad input (checks_input=False): the allocator is never called with it."""
    adapter = factory()
    harness = Harness(adapter, Config(capacity=2, block_size=2))
    for op in (Op("admit", "a", ()), Op("admit", "a", (1,) * 5), Op("release", "ghost"), Op("resume", "ghost")):
        assert harness.step(op).status == "invalid", op
    assert adapter.observe().free == 2


def test_queue_walk_is_bounded() -> None:
    """A corrupted free list (a cycle) ends the walk at the bound instead of hanging the check."""
    adapter = VllmBlockPoolAdapter()
    adapter.reset(Config(capacity=3, block_size=2))
    queue = adapter.pool.free_block_queue
    first = queue.fake_free_list_head.next_free_block
    saved = first.next_free_block.next_free_block
    first.next_free_block.next_free_block = first  # a cycle
    try:
        walk = shims.walk_free_queue(queue, bound=10)
        assert len(walk.blocks) == 10 and not walk.complete
    finally:
        first.next_free_block.next_free_block = saved


# -- the checks bite on vLLM itself ----------------------------------------------------------------


@pytest.mark.parametrize("bug", VLLM_BUGS, ids=[b.name for b in VLLM_BUGS])
def test_seeded_vllm_bug_is_reported(bug: VllmBug, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if bug.refine and not exact():
        pytest.skip("refinement bug: the installed spec cannot express vLLM's semantics yet")
    target = bug.target()
    monkeypatch.setattr(target, bug.attribute, bug.make(target.__dict__[bug.attribute]))
    factory = FACTORIES[bug.adapter]
    result = run_check(factory, bug.name, Options(profile=PROFILES["ci"], cases_dir=tmp_path, refine=bug.refine))
    assert result.status == "violated", f"{bug.name} was not found"
    assert result.failure is not None
    assert bug.invariant in result.failure.failures, result.failure
    assert len(result.failure_ops) <= bug.max_ops, result.failure_ops
    assert not [f for f in result.findings if f["kind"] == "flaky"]


@pytest.mark.parametrize("known", KNOWN_BUGS, ids=[k.fingerprint for k in KNOWN_BUGS])
def test_known_vllm_bug_regression(known: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The baseline entry's case from the release matrix: it holds on a fixed release, fails on the historical
    code, and the entry's release range says which the installed release is."""
    fixed = tolerates_repeats()
    installed = FACTORIES[known.adapter]()
    assert known.applies_to(known.adapter, installed.capabilities.version) == (not fixed)
    violation = replay_ops(installed, known.case.config, known.case.ops, refine=False)
    assert (violation is None) == fixed, violation
    bug = next(b for b in VLLM_BUGS if b.name == SEEDED_AS[known.fingerprint])
    target = bug.target()
    monkeypatch.setattr(target, bug.attribute, bug.make(target.__dict__[bug.attribute]))
    violation = replay_ops(FACTORIES[known.adapter](), known.case.config, known.case.ops, refine=False)
    assert violation is not None and known.invariant in violation.failures
