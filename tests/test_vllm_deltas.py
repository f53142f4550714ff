"""The vLLM adapters report what a step changed (spec/delta.py), and the kit checking every K steps still bites.

The protocol's invariant on vLLM's real allocator: the deltas applied one after another to an observation
equal the adapter's full observation (random op sequences with shared prefixes, evictions of cached free
blocks, preemption, releases that drop their cache entries, refusals and resets); the seeded vLLM bugs are
still reported by their invariant with the whole state judged every 4 steps; the conformance suite holds under
K=4. Needs the vLLM extra; skipped otherwise.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM extra not installed: pip install kvspec[vllm]")

from random_ops import random_op as walk_op
from vllm_bugs import VLLM_BUGS, VllmBug
from vllm_hybrid_bugs import HYBRID_BUGS

from kvspec.adapters import load
from kvspec.adapters.vllm_blockpool import VllmBlockPoolAdapter, single_frees
from kvspec.adapters.vllm_inprocess import VllmAdapter
from kvspec.spec import Config, Observation, Op, SpecError
from kvspec.spec.kv_groups import hybrid_view
from kvspec.spec.ledger import validate
from kvspec.stateful_tests import PROFILES, Options, check_adapter, run_check

WALKS = {
    "vllm": (VllmAdapter, Config(capacity=8, block_size=2)),
    "vllm-blockpool": (VllmBlockPoolAdapter, Config(capacity=8, block_size=2)),
    "vllm-blockpool-single": (single_frees, Config(capacity=8, block_size=2)),
    "vllm-hybrid-sliding": (lambda: load("vllm-hybrid-sliding")(), Config(capacity=16, block_size=2)),
    "vllm-hybrid-sizes": (lambda: load("vllm-hybrid-sizes")(), Config(capacity=16, block_size=2)),
}


def random_op(rng: random.Random, obs: Observation, n: int) -> Op:
    """Longer prompts and appends than the reference walk's, and now and then a duplicate id (refused)."""
    return walk_op(rng, obs, n, longest_prompt=11, longest_append=4, duplicate_ids=0.05, keep=0.7)


@pytest.mark.parametrize("name", list(WALKS))
def test_vllm_deltas_applied_give_the_observation(name: str) -> None:
    """On 300 random ops per adapter, the deltas applied in a chain (a full observation taken every 1 to 12
    steps, so the adapter's own tracking runs that long) equal vLLM's full observation; after reset_cache the
    adapter gives none. The hybrid adapters' deltas carry the whole HybridView, and it equals the full one."""
    make, config = WALKS[name]
    adapter = make()
    assert adapter.capabilities.deltas
    rng = random.Random(17)
    adapter.reset(config)
    assert adapter.observe_delta() is None  # nothing observed since the reset
    kept = adapter.observe()
    until_full, deltas, evicted, compared = rng.randint(1, 12), 0, 0, 0
    for n in range(300):
        op = random_op(rng, kept, n)
        try:  # bad input (a duplicate id) is the kit's to answer: the adapter is never given it
            validate(op, kept, config, adapter.capabilities.semantics)
        except SpecError:
            continue
        adapter.apply(op)
        evicted += sum(1 for e in adapter.events() if e.kind == "evict")
        delta = adapter.observe_delta()
        if op.op == "reset_cache":
            assert delta is None
            kept = adapter.observe()
            continue
        assert delta is not None, op
        deltas += 1
        kept = delta.apply(kept)
        until_full -= 1
        if until_full == 0:
            full = adapter.observe()
            assert kept == full, (n, op)
            assert dict(kept.index or {}) == dict(full.index or {}), (n, op)
            if hybrid_view(full) is not None:
                assert hybrid_view(kept) == hybrid_view(full), (n, op)
            kept, until_full, compared = full, rng.randint(1, 12), compared + 1
    assert deltas > 250 and compared > 30
    assert evicted > 0  # cached free blocks were popped for reuse inside the walk


def test_a_shared_prefix_release_and_a_reuse_are_in_the_delta() -> None:
    """Releasing one of two requests that share a prefix block lowers that block's count (touched); a later
    admit that pops the cached free block for reuse touches it again and drops its index entry."""
    adapter = VllmAdapter()
    adapter.reset(Config(capacity=4, block_size=2))
    adapter.apply(Op("admit", "a", (1, 2, 3)))
    adapter.apply(Op("admit", "b", (1, 2, 5)))
    obs = adapter.observe()
    shared = obs.requests["a"].objects[0]
    assert obs.requests["b"].objects[0] == shared and obs.objects[shared].ref_count == 2
    adapter.apply(Op("release", "a"))
    delta = adapter.observe_delta()
    assert delta is not None and delta.objects[shared].ref_count == 1 and delta.dropped_requests == {"a"}
    adapter.apply(Op("release", "b"))
    assert adapter.observe_delta() is not None
    key = adapter.observe().objects[shared].key
    adapter.apply(Op("admit", "c", (7, 8, 9, 10, 11, 12, 13)))  # all 4 blocks: the cached one is reused
    delta = adapter.observe_delta()
    assert delta is not None and shared in delta.objects and delta.objects[shared].key != key
    assert key in delta.dropped_keys and delta.free == 0


# -- the checks still bite with the whole state judged every 4 steps ----------------------------------------

BITE_K4 = ["double-free", "reuse-keeps-hash-entry", "popleft-n-keeps-link"]
"""A representative subset (~20 s here): a ref count and an index entry judged on each step's part, and the
free-queue view, judged on the whole state only (the K-th step or the example's end). The two capacity bugs
(free-queues-twice, touch-keeps-queued) are also reported with K=4 but cost 64 s and 302 s on the loaded
2-core machine, so they stay out of CI's default run: ``KVSPEC_VLLM_K4_ALL=1`` adds them."""
if os.environ.get("KVSPEC_VLLM_K4_ALL"):
    BITE_K4 += ["free-queues-twice", "touch-keeps-queued"]


@pytest.mark.parametrize("bug", [b for b in VLLM_BUGS if b.name in BITE_K4], ids=lambda b: b.name)
def test_seeded_vllm_bug_is_reported_with_k4(bug: VllmBug, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    target = bug.target()
    monkeypatch.setattr(target, bug.attribute, bug.make(target.__dict__[bug.attribute]))
    factory: Any = {"vllm": VllmAdapter, "vllm-blockpool": VllmBlockPoolAdapter}[bug.adapter]
    result = run_check(
        factory, bug.name, Options(profile=PROFILES["ci"], cases_dir=tmp_path, refine=bug.refine, full_check_every=4)
    )
    assert result.status == "violated", f"{bug.name} was not found"
    assert result.failure is not None and result.tally.full_check_every == 4
    assert bug.invariant in result.failure.failures, result.failure
    assert len(result.failure_ops) <= bug.max_ops + 3, result.failure_ops  # K-1: a whole-state invariant waits
    assert not [f for f in result.findings if f["kind"] == "flaky"]


def test_seeded_hybrid_bug_is_reported_with_k4(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One hybrid bug: the hybrid invariants compare the view before and after a step, and under K=4 the
    view before the K-th step is the one the previous delta carried."""
    bug = HYBRID_BUGS[0]
    target = bug.target()
    monkeypatch.setattr(target, bug.attribute, bug.make(target.__dict__[bug.attribute]))
    result = run_check(
        load(bug.adapter),
        bug.name,
        Options(profile=PROFILES["ci"], cases_dir=tmp_path, refine=False, full_check_every=4),
    )
    assert result.status == "violated", f"{bug.name} was not found"
    assert result.failure is not None and bug.invariant in result.failure.failures, result.failure


# -- the suite holds under K=4 --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["vllm", "vllm-blockpool", "vllm-hybrid-sliding"])
def test_conformance_passes_with_k4(name: str, tmp_path: Path) -> None:
    """The suite (coverage cases, the bad-input tour, 30 examples) holds with the whole state every 4 steps,
    and whole-state checks did run (K=1 is tests/test_vllm_adapters.py and tests/test_vllm_hybrid.py)."""
    report = check_adapter(load(name), name, Options(max_examples=30, cases_dir=tmp_path, full_check_every=4))
    assert report.status == "passed", [report.findings, report.error]
    data = report.to_json()
    assert data["full_check_every"] == 4 and data["full_checks"] > 0
    verdicts = {r["name"]: r["verdict"] for r in report.verdicts()}
    assert verdicts["free_list_exact"] == "held"
