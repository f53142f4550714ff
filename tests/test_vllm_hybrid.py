"""vLLM's hybrid allocator: the suite passes on several KV cache groups sharing one pool, and bites on vLLM.

Needs the vLLM extra; skipped otherwise (the core suite passes without it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM extra not installed: pip install kvspec[vllm]")

from vllm_bugs import VllmBug
from vllm_hybrid_bugs import HYBRID_BUGS, HYBRID_KNOWN_BUGS, HYBRID_SEEDED_AS

from kvspec.adapters import load
from kvspec.adapters.vllm_hybrid import VllmHybridAdapter
from kvspec.spec import INVARIANTS, Config, Op
from kvspec.spec.invariants import HYBRID_INVARIANTS
from kvspec.spec.kv_groups import hybrid_view
from kvspec.stateful_tests import PROFILES, Options, replay_ops, run_check

HYBRID_NAMES = {inv.name for inv in HYBRID_INVARIANTS}
ONE_TABLE_NAMES = {inv.name for inv in INVARIANTS if inv.layouts == frozenset({"one_table"})}


def test_sliding_window_releases_out_of_window_blocks() -> None:
    """After a 17-token prompt with a window of 8 tokens in blocks of 4, the window group holds the null
    placeholder at its first two positions, full attention all five blocks; the released blocks are free."""
    adapter = VllmHybridAdapter("sliding")
    adapter.reset(Config(capacity=12, block_size=4))
    assert adapter.apply(Op("admit", "a", tuple(range(17)))).status == "ok"
    obs = adapter.observe()
    view = hybrid_view(obs)
    assert view is not None
    full, window = view.tables["a"]
    assert len(full) == 5 and None not in full
    assert window[:2] == (None, None) and None not in window[2:] and len(window) == 5
    assert len(obs.requests["a"].objects) == 8  # the null placeholder is no block of the request
    assert view.null not in obs.objects and view.null not in view.free_queue


def test_hit_is_the_longest_every_group_serves() -> None:
    """A second prompt sharing 16 tokens hits 16: full attention serves all four blocks, the window the last two."""
    adapter = VllmHybridAdapter("sliding")
    adapter.reset(Config(capacity=16, block_size=4))
    adapter.apply(Op("admit", "a", tuple(range(17))))
    assert adapter.apply(Op("admit", "b", (*range(16), 99, 98))).hit_tokens == 16


def test_eagle_drops_one_block_past_the_hit() -> None:
    """With use_eagle vLLM's lookup matches one block past the hit and drops it: 12 of a prompt sharing 16 tokens
    (16 without EAGLE); for a 16-token prompt, 12, because the lookup may read its last whole block (vLLM 0.32)."""
    hits = {}
    for eagle in (False, True):
        adapter = VllmHybridAdapter("sliding", eagle=eagle)
        adapter.reset(Config(capacity=24, block_size=4))
        adapter.apply(Op("admit", "a", tuple(range(17))))
        hits[eagle] = [
            adapter.apply(Op("admit", r, p)).hit_tokens
            for r, p in (("b", (*range(16), 99)), ("c", tuple(range(16))), ("d", tuple(range(9))))
        ]
    assert hits == {False: [16, 12, 8], True: [12, 12, 4]}
    view = hybrid_view(adapter.observe())
    assert view is not None and {g.eagle_drop for g in view.groups} == {1}


@pytest.mark.parametrize(
    "name",
    [
        "vllm-sliding",
        "vllm-hybrid-local",
        "vllm-hybrid-mixed",
        "vllm-hybrid-sizes",
        "vllm-hybrid-sliding-eagle",
        "vllm-hybrid-sizes-eagle",
    ],
)
def test_conformance_passes(name: str, tmp_path: Path) -> None:
    """Each hybrid configuration passes the ci profile; every hybrid invariant is judged (the window slid).
    vllm-hybrid-sliding runs the whole ci profile from the command line in .ci/run; these run 60 examples."""
    result = run_check(load(name), name, Options(profile=PROFILES["ci"], cases_dir=tmp_path, max_examples=60))
    assert result.status == "passed", [result.failure, result.findings, result.error]
    verdicts = {row["name"]: row["verdict"] for row in result.report().verdicts()}
    assert {n: verdicts[n] for n in HYBRID_NAMES} == dict.fromkeys(HYBRID_NAMES, "held")
    assert {verdicts[n] for n in ONE_TABLE_NAMES} == {"unknown"}  # judged per group instead
    for situation in ("evict", "prefix_hit", "admit:refused", "append:ok"):
        assert result.tally.coverage.get(situation, 0) > 0, situation


@pytest.mark.parametrize("bug", HYBRID_BUGS, ids=[b.name for b in HYBRID_BUGS])
def test_seeded_hybrid_bug_is_reported(bug: VllmBug, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    target = bug.target()
    monkeypatch.setattr(target, bug.attribute, bug.make(target.__dict__[bug.attribute]))
    result = run_check(load(bug.adapter), bug.name, Options(profile=PROFILES["ci"], cases_dir=tmp_path, refine=False))
    assert result.status == "violated", f"{bug.name} was not found"
    assert result.failure is not None
    assert bug.invariant in result.failure.failures, result.failure
    assert len(result.failure_ops) <= bug.max_ops, result.failure_ops
    assert not [f for f in result.findings if f["kind"] == "flaky"]


@pytest.mark.parametrize("known", HYBRID_KNOWN_BUGS, ids=[k.fingerprint for k in HYBRID_KNOWN_BUGS])
def test_known_hybrid_bug_regression(known: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The release matrix's case (tests/data/vllm-hybrid-known-bugs.json): violated with its invariant on the
    releases of the entry's range, held on the others, and there violated again with the historical code seeded."""
    installed = load(known.adapter)()
    in_range = known.applies_to(known.adapter, installed.capabilities.version)
    violation = replay_ops(installed, known.case.config, known.case.ops, refine=False)
    assert (violation is not None) == in_range, violation
    if in_range:  # the installed code is the historical code
        assert violation is not None and known.invariant in violation.failures, violation
        return
    bug = HYBRID_SEEDED_AS[known.fingerprint]
    target = bug.target()
    monkeypatch.setattr(target, bug.attribute, bug.make(target.__dict__[bug.attribute]))
    violation = replay_ops(load(known.adapter)(), known.case.config, known.case.ops, refine=False)
    assert violation is not None and known.invariant in violation.failures, violation
