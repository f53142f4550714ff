"""The SGLang adapter: the conformance suite passes on SGLang's real radix tree, and it bites on SGLang itself.

Needs the SGLang extra (its own venv: .ci/run builds it); skipped otherwise (the core suite passes without it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "sglang", reason="SGLang extra not installed: pip install kvspec[sglang] (its own venv, docs/sglang.md)"
)

from sglang_bugs import SGLANG_BUGS, SglangBug

from kvspec.adapters.sglang_inprocess import CONTRACTS, SglangAdapter
from kvspec.spec import Config, Op
from kvspec.spec.invariants import RADIX_INVARIANTS
from kvspec.spec.radix_view import radix_view
from kvspec.stateful_tests import PROFILES, Harness, Options, replay_ops, run_check

STARTUP = 300.0
"""Step timeout, which also bounds each adapter start: importing SGLang takes ~20 s idle, over 120 s on loaded cores."""


@pytest.fixture(scope="module")
def adapter() -> SglangAdapter:
    return SglangAdapter()


def run(adapter: SglangAdapter, config: Config, *ops: Op) -> list[Any]:
    adapter.reset(config)
    return [adapter.apply(op) for op in ops]


# -- the suite passes on the real tree --------------------------------------------------------------


def test_conformance_passes(tmp_path: Path) -> None:
    result = run_check(
        SglangAdapter,
        "sglang",
        Options(profile=PROFILES["ci"], max_examples=80, cases_dir=tmp_path, step_timeout=STARTUP),
    )
    assert result.status == "passed", [result.failure, result.findings, result.error]
    assert result.adapter_version.startswith("sglang ")
    verdicts = {r["name"]: r["verdict"] for r in result.report().verdicts()}
    for inv in RADIX_INVARIANTS:
        assert verdicts[inv.name] == "held", inv.name
    for situation in ("evict", "prefix_hit", "admit:refused", "append:refused", "reclaim"):
        assert result.tally.coverage[situation] > 0, situation
    # Every declared misuse contract is drawn (the report's coverage, contract:OP:NAME:STATUS) and, in this
    # search, kept: the unchecked allocations it refuses found nothing to evict (the next test's case does).
    coverage = result.report().to_json()["coverage"]
    for contract in sorted(CONTRACTS):
        assert any(key.startswith(f"contract:{contract}:") for key in coverage), (contract, coverage)
    assert coverage.get("contract:admit:unchecked:refused", 0) > 0, coverage


def test_a_shared_prefix_is_one_locked_path(adapter: SglangAdapter) -> None:
    """Two prompts sharing two pages hit them and lock the same nodes: lock_ref 2 on the shared path."""
    outcomes = run(
        adapter, Config(capacity=8, block_size=2), Op("admit", "a", (1, 2, 3, 4, 5)), Op("admit", "b", (1, 2, 3, 4, 9))
    )
    assert [o.hit_tokens for o in outcomes] == [0, 4]
    obs = adapter.observe()
    view = radix_view(obs)
    assert view is not None
    assert obs.requests["a"].objects[:2] == obs.requests["b"].objects[:2]
    shared = [obs.objects[p] for p in obs.requests["a"].objects[:2]]
    assert [(o.ref_count, o.key) for o in shared] == [(2, (1, 2)), (2, (1, 2, 3, 4))]
    assert view.protected_size == 4 and view.evictable_size == 0


def test_release_inserts_and_unlocks(adapter: SglangAdapter) -> None:
    run(adapter, Config(capacity=8, block_size=2), Op("admit", "a", (1, 2, 3)), Op("append", "a", (4, 5)))
    adapter.apply(Op("release", "a"))
    view = radix_view(adapter.observe())
    assert view is not None
    assert view.evictable_size == 4 and view.protected_size == 0  # (1, 2) (3, 4) cached; the partial (5,) freed
    assert view.free_tokens == 16 - 4


def test_refused_admit_leaves_no_lock(adapter: SglangAdapter) -> None:
    outcomes = run(adapter, Config(capacity=2, block_size=2), Op("admit", "a", (1, 2, 3)), Op("admit", "b", (1, 2, 7)))
    assert [o.status for o in outcomes] == ["ok", "refused"]
    view = radix_view(adapter.observe())
    assert view is not None
    assert view.protected_size == 2 and set(view.locks) == {"a"}


UNCHECKED_SHORT = [
    Op("admit", "a", (1, 2, 3)),  # a holds [1, 2] (in the tree, locked) and [3]
    Op("admit", "b", (4, 5, 6)),
    Op("release", "b"),  # [4, 5] cached and evictable, [6] freed: 1 page free, 1 evictable
    Op("admit", "c", (7, 8, 9, 10, 11), contract="unchecked"),  # 3 pages: no room even after eviction
]
"""The minimal case of SGLang's unchecked allocation (4 pages of 2 slots): it evicts, then finds no room."""


def test_an_unchecked_allocation_evicts_the_cache_before_it_fails(adapter: SglangAdapter) -> None:
    """admit:unchecked: no PrefillAdder budget first. ``alloc_paged_token_slots_extend`` evicts the tree for the
    shortfall, then its allocator's ``alloc_extend`` returns None and it raises out of memory: the refusal has
    evicted the cached page (SGLang 0.5.23's own behaviour, not atomic). The budgeted admission refuses first."""
    config = Config(capacity=4, block_size=2)
    outcomes = run(adapter, config, *UNCHECKED_SHORT)
    assert [o.status for o in outcomes] == ["ok", "ok", "ok", "refused"], outcomes
    assert [e.key for e in adapter.events()] == [(4, 5)]  # evicted by the refused allocation
    found = replay_ops(SglangAdapter(), config, UNCHECKED_SHORT)
    assert found is not None and found.step == 3 and found.invariant == "atomic_failure", found
    assert any("emitted 1 event" in p for p in found.failures["atomic_failure"]), found.failures
    checked = [*UNCHECKED_SHORT[:-1], Op("admit", "c", (7, 8, 9, 10, 11))]
    assert replay_ops(SglangAdapter(), config, checked) is None


def test_a_never_admitted_free_changes_nothing(adapter: SglangAdapter) -> None:
    """release:never_admitted: the allocator's free of a request that holds no slots (an empty index tensor)
    within the release; SGLang returns at once (``numel() == 0``). release_kv_cache itself asserts on such a
    request (its row was never taken), so it is not called twice nor on a stranger."""
    ops = [Op("admit", "a", (1, 2, 3)), Op("append", "a", (4,)), Op("release", "a", contract="never_admitted")]
    assert replay_ops(SglangAdapter(), Config(capacity=4, block_size=2), ops) is None


def test_preempt_and_resume_recompute(adapter: SglangAdapter) -> None:
    outcomes = run(
        adapter,
        Config(capacity=6, block_size=2),
        Op("admit", "a", (1, 2, 3, 4, 5)),
        Op("preempt", "a"),
        Op("resume", "a"),
    )
    assert [o.status for o in outcomes] == ["ok", "ok", "ok"]
    assert outcomes[2].hit_tokens == 4  # the prompt's full pages stayed cached while it waited


def test_reset_needs_an_idle_scheduler(adapter: SglangAdapter) -> None:
    outcomes = run(adapter, Config(capacity=4, block_size=2), Op("admit", "a", (1, 2, 3)), Op("reset_cache"))
    assert outcomes[1].status == "refused"
    adapter.apply(Op("release", "a"))
    assert adapter.apply(Op("reset_cache")).status == "ok"
    assert {e.kind for e in adapter.events()} == {"reclaim"}
    assert adapter.observe().free == 4


def test_bad_input_is_rejected_before_the_tree(adapter: SglangAdapter) -> None:
    """The kit answers bad input (checks_input=False): the tree is never called with it."""
    harness = Harness(adapter, Config(capacity=2, block_size=2))
    outcomes = [harness.step(op) for op in (Op("admit", "a", (1, 2, 3, 4, 5)), Op("admit", "b", ()))]
    assert [o.status for o in outcomes] == ["invalid", "invalid"]


# -- the checks bite on SGLang itself ---------------------------------------------------------------


@pytest.mark.parametrize("bug", SGLANG_BUGS, ids=lambda b: b.name)
def test_seeded_sglang_bug_is_reported(bug: SglangBug, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    target = bug.target()
    monkeypatch.setattr(target, bug.attribute, bug.make(target.__dict__[bug.attribute]))
    # keep_going: a bug can break two invariants and either may be found first (a leaking evict also makes SGLang's
    # next allocation raise out of memory: adapter_contract); the bug's own invariant must be among those reported.
    result = run_check(
        SglangAdapter,
        bug.name,
        Options(profile=PROFILES["ci"], cases_dir=tmp_path, step_timeout=STARTUP, keep_going=True),
    )
    assert result.exit_code == 1, (result.status, result.error)
    assert result.failure is not None
    reported = {v.invariant: ops for v, ops, _ in [(result.failure, result.failure_ops, None), *result.more_failures]}
    assert bug.invariant in reported, reported
    assert len(reported[bug.invariant]) <= 10, reported[bug.invariant]
