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


# vLLM's documented findings (docs/semantics.md): blocks two requests fill with the same tokens are both cached
# under one hash, and a hit takes the first inserted, idle or not: one block more than needed leaves the free
# queue (no_needless_allocation), and a prompt that sharing the held copy would fit is refused (no_spurious_refusal).
DUPLICATE_COPY = [Op("admit", "r6", (2, 0, 2)), Op("preempt", "r6"), Op("admit", "r9", (2,)), Op("append", "r9", (0,))]
DOCUMENTED = frozenset({"no_needless_allocation", "no_spurious_refusal"})


@pytest.mark.parametrize(
    ("prompt", "invariant"),
    [((2, 0, 2), "no_needless_allocation"), ((2, 0, 2, 0, 0), "no_spurious_refusal")],
    ids=["needless-allocation", "needless-refusal"],
)
def test_the_documented_duplicate_copy_findings_reproduce(
    factory: Any, prompt: tuple[int, ...], invariant: str
) -> None:
    ops = [*DUPLICATE_COPY, Op("admit", "r10", prompt)]
    violation = replay_ops(factory(), Config(capacity=3, block_size=2), ops)
    assert violation is not None and violation.invariant == invariant and violation.step == len(ops) - 1, violation
    assert not set(violation.failures) - DOCUMENTED  # the spec, declared "indexed", predicts the same (exact)


def test_conformance_passes(factory: Any, tmp_path: Path) -> None:
    """The suite as `kvspec check` runs it (coverage cases and the bad-input tour first) holds on vLLM, its
    documented findings known (judged above: test_the_documented_duplicate_copy_findings_reproduce)."""
    options = Options(max_examples=60, cases_dir=tmp_path, ignore=DOCUMENTED)
    report = check_adapter(factory, factory.name, options)
    assert report.status == "passed", [report.findings, report.error]
    assert report.adapter_version.startswith("vllm ")
    verdicts = {r["name"]: r["verdict"] for r in report.verdicts()}
    radix = {inv.name for inv in (*RADIX_INVARIANTS, *HYBRID_INVARIANTS)}  # one group: no radix tree, no per-group view
    assert verdicts["free_list_exact"] == "held"  # the free queue is shown (spec.free_list_view)
    skipped = radix | DOCUMENTED
    not_held = {n: v for n, v in verdicts.items() if v != "held" and n != "adapter_contract" and n not in skipped}
    assert not {n for n in not_held if not n.startswith("predicted_")}, not_held
    refinement = {v for n, v in verdicts.items() if n.startswith("predicted_")}
    assert refinement == ({"held"} if exact() else {"unknown"})
    for situation in ("evict", "prefix_hit", "admit:refused", "append:refused", "reclaim"):
        assert report.coverage.get(situation, 0) > 0, situation
    for contract in sorted(factory().capabilities.contracts):  # each declared misuse contract drawn, and kept
        assert report.coverage.get(f"contract:{contract}:ok", 0) > 0, (contract, report.coverage)
    if factory is not VllmAdapter:
        assert report.coverage.get("contract:append:unchecked:refused", 0) > 0, report.coverage


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


# -- misuse contracts (Capabilities.contracts): declared where vLLM's API allows the call -------------


def test_the_declared_contracts() -> None:
    """The manager's free may be called again, and on a request it never admitted ("default [] in case a request
    is freed (aborted) before alloc"); the pool's get_new_blocks raises when short. allocate_slots is itself
    the capacity check, so the manager has no unchecked path (docs/vllm.md, "Misuse contracts")."""
    assert VllmAdapter().capabilities.contracts == {"release:repeated", "preempt:repeated", "release:never_admitted"}
    assert blockpool().capabilities.contracts == {"append:unchecked"}


def test_the_managers_repeated_and_never_admitted_frees_free_nothing() -> None:
    config = Config(capacity=6, block_size=2)
    for ops in (
        [Op("admit", "a", (1, 2, 3)), Op("release", "a", contract="repeated"), Op("admit", "b", (1, 2, 3))],
        [Op("admit", "a", (1, 2, 3)), Op("preempt", "a", contract="repeated"), Op("resume", "a")],
        [Op("admit", "a", (1, 2, 3)), Op("admit", "b", (1, 2, 5)), Op("release", "a", contract="never_admitted")],
    ):
        assert replay_ops(VllmAdapter(), config, ops) is None, ops


def _free_without_pop(original: Any) -> Any:
    def buggy(self: Any, request_id: str) -> None:
        blocks = list(self.req_to_blocks.get(request_id, ()))  # read, not popped: a repeat frees the table again
        self.block_pool.free_blocks(reversed(blocks))

    return buggy


def test_a_repeated_free_that_frees_the_table_again_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded on the contract path only: a manager's free that reads the request's table instead of popping it
    frees nothing wrong once, and frees every block again when the free is repeated."""
    from vllm.v1.core.single_type_kv_cache_manager import SingleTypeKVCacheManager

    ops = [Op("admit", "a", (1, 2, 3)), Op("release", "a", contract="repeated")]
    monkeypatch.setattr(SingleTypeKVCacheManager, "free", _free_without_pop(SingleTypeKVCacheManager.free))
    assert replay_ops(VllmAdapter(), Config(capacity=4, block_size=2), [ops[0], Op("release", "a")]) is None
    found = replay_ops(VllmAdapter(), Config(capacity=4, block_size=2), ops)
    assert found is not None and found.step == 1, found
    assert found.invariant == "non_negative_ref_counts", found


def _takes_then_raises(original: Any) -> Any:
    def buggy(self: Any, num_blocks: int) -> Any:
        if num_blocks > self.get_num_free_blocks():  # takes what there is before it finds the pool short
            for block in self.free_block_queue.popleft_n(self.get_num_free_blocks()):
                self._maybe_evict_cached_block(block)
                block.ref_cnt += 1
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        return original(self, num_blocks)

    return buggy


def test_an_unchecked_append_is_refused_by_the_pool_and_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """append:unchecked on the BlockPool: get_new_blocks raises (ValueError) before it takes a block, so the
    refusal changes nothing; a pool that takes the free blocks before it raises breaks atomic_failure."""
    config = Config(capacity=4, block_size=2)
    ops = [Op("admit", "a", (1, 2, 3)), Op("admit", "b", (9,)), Op("append", "a", (4, 5, 6, 7), contract="unchecked")]
    outcomes = run(blockpool(), config, *ops)  # 2 blocks more for a, 1 free
    assert [o.status for o in outcomes] == ["ok", "ok", "refused"] and "get_new_blocks" in outcomes[2].message
    assert replay_ops(blockpool(), config, ops) is None
    monkeypatch.setattr(
        shims.load().BlockPool, "get_new_blocks", _takes_then_raises(shims.load().BlockPool.get_new_blocks)
    )
    found = replay_ops(blockpool(), config, ops, refine=False)
    assert found is not None and found.step == 2 and found.invariant == "atomic_failure", found
    assert replay_ops(blockpool(), config, [*ops[:2], Op("append", "a", ops[2].tokens)], refine=False) is None


# -- the checks bite on vLLM itself ----------------------------------------------------------------


@pytest.mark.parametrize("bug", VLLM_BUGS, ids=[b.name for b in VLLM_BUGS])
def test_seeded_vllm_bug_is_reported(bug: VllmBug, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if bug.refine and not exact():
        pytest.skip("refinement bug: the installed spec cannot express vLLM's semantics yet")
    target = bug.target()
    monkeypatch.setattr(target, bug.attribute, bug.make(target.__dict__[bug.attribute]))
    factory = FACTORIES[bug.adapter]
    # keep_going: a bug can break two invariants and which the search finds first depends on what it draws (the
    # misuse contracts' rule among them); the bug's own invariant must be among those reported, shrunk.
    options = Options(profile=PROFILES["ci"], cases_dir=tmp_path, refine=bug.refine, keep_going=True)
    result = run_check(factory, bug.name, options)
    assert result.status == "violated", f"{bug.name} was not found"
    assert result.failure is not None
    reported: dict[str, list[Op]] = {}
    for violation, ops in [(result.failure, result.failure_ops), *((v, o) for v, o, _ in result.more_failures)]:
        for name in violation.failures:
            reported.setdefault(name, ops)
    assert bug.invariant in reported, result.failure
    assert len(reported[bug.invariant]) <= bug.max_ops, reported[bug.invariant]
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
