"""The kit against its catalogue of seeded bugs (tests/seeded_bugs.py).

For every bug, `run_check` must find it through the invariant it breaks, shrink it
to a short op sequence, and save a case file that replays the failure on a fresh
buggy adapter and holds on the correct adapter the bug was seeded into.

Safety bugs run with refinement off, so the safety invariant itself has to catch
them; a wrong prediction cannot stand in for it. Refinement bugs run in full mode.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from seeded_bugs import (
    HANG,
    LIFECYCLE_BUGS,
    LONG_SEARCH_BUGS,
    PAGED_BUGS,
    POLICY_BUGS,
    SCHEDULER_BUGS,
    SEEDED_BUGS,
    AdapterFactory,
    SeededBug,
)
from sglang_bugs import SGLANG_BUGS
from vllm_bugs import VLLM_BUGS
from vllm_hybrid_bugs import HYBRID_BUGS

from kvspec.adapters.lifecycle_sim import LifecycleSimAdapter
from kvspec.case import CASE_SCHEMA
from kvspec.spec import INVARIANT_NAMES, INVARIANTS, Config, Op
from kvspec.spec.invariants import ADAPTER_CONTRACT, STATE
from kvspec.stateful_tests import PROFILES, Case, Options, Profile, Result, Tally, Violation, replay_ops, run_check

KINDS = {inv.name: inv.kind for inv in INVARIANTS}
INCREMENTAL = {inv.name for inv in INVARIANTS if inv.incremental}

# The ci profile with 20 steps per example instead of 40. Shrinking is nearly all of the
# time a seeded bug costs (a 40-step example is shrunk through up to ~2,000 reruns, and
# max_examples does not bound that), and half-length examples shrink about four times
# faster. Every bug but SEARCH_MISSES is still found well within max_examples, under the
# derandomized search (latest: lifecycle-evicts-before-checking, example ~33) and under
# seeds 0-3 (latest: the same bug, example ~180).
SEEDED_PROFILE: Profile = dataclasses.replace(PROFILES["ci"], name="ci-seeded", step_count=20)

# Bugs the random phase does not reach under SEEDED_PROFILE. Their test is a strict xfail,
# so it starts failing, as a reminder to drop the entry, once the search finds them.
SEARCH_MISSES: dict[str, str] = {}


INCREMENTAL_K = 4
"""K of the incremental mode: an adapter that reports deltas is judged whole every 4th step and at the end of
each example, on the part a step changed between (spec/delta.py). The catalogue's bugs on such adapters run in
both modes; the others report no deltas, so both modes are the same run and they run once."""


def reports_deltas(bug: SeededBug) -> bool:
    """Whether the bug's adapter reports what a step changed (Capabilities.deltas)."""
    adapter = bug.factory()
    try:
        return adapter.capabilities.deltas
    finally:
        adapter.close()


def refines(bug: SeededBug) -> bool:
    """Refinement bugs run in full mode; safety and adapter-contract bugs with safety checks only."""
    return KINDS.get(bug.invariant, "adapter") == "refinement"


def replay(
    factory: AdapterFactory, case: Case, *, refine: bool, every: int = 1, target: str | None = None
) -> Violation | None:
    """Replay ``case`` on a fresh adapter from ``factory`` (the whole state judged every ``every`` steps);
    the first violation, or None (``target``: stepping past others, the first violation of that invariant)."""
    adapter = factory()
    try:
        return replay_ops(adapter, case.config, case.ops, Tally(full_check_every=every), refine=refine, target=target)
    finally:
        adapter.close()


def verdict(result: Result, name: str) -> str:
    """The report's verdict row for invariant ``name``: held, violated or unknown."""
    return next(str(row["verdict"]) for row in result.report().verdicts() if row["name"] == name)


def seeded_params() -> list[object]:
    """SEEDED_BUGS as test parameters, each in full mode (K=1) and, where its adapter reports deltas, in
    incremental mode (K=INCREMENTAL_K); the known search misses marked as strict xfails."""
    params = []
    for bug in SEEDED_BUGS:
        for every in (1, INCREMENTAL_K) if reports_deltas(bug) else (1,):
            name = bug.name if every == 1 else f"{bug.name}-incremental"
            marks = (
                [pytest.mark.xfail(raises=AssertionError, strict=True, reason=SEARCH_MISSES[name])]
                if name in SEARCH_MISSES
                else []
            )
            if every != 1:  # incremental mode: the slow tier (make test-slow); the full mode is in the core suite
                marks = [*marks, pytest.mark.slow]
            params.append(pytest.param(bug, every, id=name, marks=marks))
    return params


@pytest.mark.parametrize(("bug", "every"), seeded_params())
def test_seeded_bug_is_found_shrunk_saved_and_replayed(bug: SeededBug, every: int, tmp_path: Path) -> None:
    """The bug's invariant reports it, the counterexample is short, and its case file replays
    the same failure on the buggy adapter and holds on the correct one; in both modes (``every``: K)."""
    refine = refines(bug)
    result = run_check(
        bug.factory,
        bug.name,
        Options(profile=SEEDED_PROFILE, cases_dir=tmp_path, refine=refine, full_check_every=every),
    )

    assert result.exit_code == 1, (result.status, result.error)
    assert result.failure is not None and result.failure_config is not None
    assert ({bug.invariant} | bug.symptoms) & set(result.failure.failures), result.failure
    assert verdict(result, result.failure.invariant) == "violated"
    assert result.failure.invariant in {bug.named_first or bug.invariant, *bug.symptoms}, result.failure
    # A whole-state invariant is judged every K-th step (and the state ones at the end): reaching that step
    # may take up to K-1 more ops than the full check of every step needs. An incremental one (the eviction
    # order and candidates_unreferenced included: spec.invariants.ranking) is judged on every step, so the
    # same bound holds. A transition invariant judged only on K-th steps (no_spurious_refusal) has no length
    # bound under K: deleting one op moves the violation off a K-th step, so the shrinker can stop in a longer
    # local minimum; that the case is found, named and replays is what incremental mode must keep.
    if every == 1 or bug.invariant in INCREMENTAL | STATE:
        slack = 0 if every == 1 or bug.invariant in INCREMENTAL else every - 1
        assert len(result.failure_ops) <= bug.max_ops + slack, result.failure_ops
    assert not [f for f in result.findings if f["kind"] == "flaky"], result.findings

    assert len(result.cases) == 1
    path = Path(result.cases[0])
    assert path.parent == tmp_path and path.exists()
    data = json.loads(path.read_text())
    assert data["kvspec_case"] == CASE_SCHEMA
    assert data["adapter"] == bug.name
    assert data["config"] == result.failure_config.to_json()
    assert data["ops"] == [op.to_json() for op in result.failure_ops]
    assert data["expected"]["invariant"] == (bug.named_first or bug.invariant)
    assert bug.invariant in data["expected"]["violated"]

    case = Case.load(path)
    again = replay(bug.factory, case, refine=refine, every=every)
    assert again is not None, "the saved case does not reproduce"
    assert again.invariant == case.expected["invariant"] and bug.invariant in again.failures
    assert again.step == len(case.ops) - 1  # it breaks on the last op, not before
    # The correct adapter holds on the same ops, refinement included, in both modes.
    assert replay(bug.correct, case, refine=True) is None
    assert replay(bug.correct, case, refine=True, every=every) is None


def test_plain_lru_witness_is_caught_by_refinement_and_by_policy_conformance() -> None:
    """The lifecycle bug's hand-minimised witness: evicting the older record with more hits instead of the newer
    one-hit record breaks no safety invariant. Refinement catches it, and so does policy_conformance without
    refinement, from the records' observed hits and last use."""
    bug = next(b for b in LIFECYCLE_BUGS if b.name == "lifecycle-plain-lru")
    config = Config(capacity=3, block_size=4)
    ops = [
        Op("admit", "r0", (0,)),
        Op("admit", "r1", (0,)),  # shared: the record of (0,) has 2 hits
        Op("release", "r0"),
        Op("release", "r1"),  # (0,) idle, 2 hits
        Op("admit", "r2", (1,)),
        Op("release", "r2"),  # (1,) idle, 1 hit, used more recently
        Op("admit", "r3", (2,) * 5),  # 2 blocks, 1 free: one record must go, and the spec picks (1,)
    ]
    case = Case(bug.name, config, ops)
    found = replay(bug.factory, case, refine=True)
    assert found is not None and found.step == len(ops) - 1
    assert set(found.failures) == {bug.invariant, "policy_conformance"}
    assert found.invariant == bug.invariant
    assert len(ops) <= bug.max_ops
    unrefined = replay(bug.factory, case, refine=False)
    assert unrefined is not None and set(unrefined.failures) == {"policy_conformance"}
    assert replay(LifecycleSimAdapter, case, refine=True) is None


def test_a_hung_adapter_is_cut_off_and_saved(tmp_path: Path) -> None:
    """An adapter that never returns breaks the adapter contract after the step timeout, and a case is saved."""
    result = run_check(
        HANG.factory, HANG.name, Options(profile=SEEDED_PROFILE, cases_dir=tmp_path, refine=False, step_timeout=0.5)
    )
    assert result.exit_code == 1, (result.status, result.error)
    assert verdict(result, HANG.invariant) == "violated"
    assert result.duration_s < 2.5  # cut off at the timeout, not waited out (the engine sleeps 3 s)
    assert any(f["kind"] == ADAPTER_CONTRACT for f in result.findings), result.findings
    assert len(result.cases) == 1 and Path(result.cases[0]).exists()
    case = Case.load(Path(result.cases[0]))
    assert case.expected["invariant"] == HANG.invariant
    assert case.ops[-1].op == "reset_cache"
    assert len(result.failure_ops) <= HANG.max_ops


def test_a_hung_adapters_case_holds_the_ops_that_led_to_it(tmp_path: Path) -> None:
    """The case saved for a hang records the whole example: its step index is the last of its ops."""
    result = run_check(
        HANG.factory, HANG.name, Options(profile=SEEDED_PROFILE, cases_dir=tmp_path, refine=False, step_timeout=0.5)
    )
    case = Case.load(Path(result.cases[0]))
    assert case.expected["step"] == len(case.ops) - 1, (case.expected, case.ops)


@pytest.mark.parametrize(
    "name", ["floor-rounding", "lifecycle-floor-rounding", "scheduler-frees-incoming-size", "raises-on-resume"]
)
@pytest.mark.slow
def test_safety_bug_is_also_found_in_full_mode(name: str, tmp_path: Path) -> None:
    """With refinement on (the default), a safety bug still makes the check fail and its case replays."""
    bug = next(b for b in SEEDED_BUGS if b.name == name)
    assert not refines(bug)
    result = run_check(bug.factory, bug.name, Options(profile=SEEDED_PROFILE, cases_dir=tmp_path))
    assert result.exit_code == 1, (result.status, result.error)
    assert result.failure is not None
    case = Case.load(Path(result.cases[0]))
    again = replay(bug.factory, case, refine=True)
    assert again is not None and again.invariant == result.failure.invariant


def test_every_invariant_has_a_seeded_bug() -> None:
    """Each named invariant, the adapter contract included, is the target of at least one seeded bug.

    The radix invariants' bugs are seeded into SGLang's own tree (tests/sglang_bugs.py, run by
    tests/test_sglang_adapter.py where SGLang is installed), the hybrid invariants' into vLLM's hybrid
    allocator (tests/vllm_hybrid_bugs.py, run by tests/test_vllm_hybrid.py where vLLM is installed), the free
    list's into vLLM's free queue (tests/vllm_bugs.py, run by tests/test_vllm_adapters.py; the reference
    adapters show no free list); every other invariant's into a reference."""
    targeted = (
        {bug.invariant for bug in (*SEEDED_BUGS, *LONG_SEARCH_BUGS)}
        | {bug.invariant for bug in SGLANG_BUGS}
        | {bug.invariant for bug in HYBRID_BUGS}
        | {bug.invariant for bug in VLLM_BUGS}
    )
    assert set(INVARIANT_NAMES) - targeted == set()
    assert targeted <= set(INVARIANT_NAMES)
    assert {bug.named_first for bug in SEEDED_BUGS} - {""} <= set(INVARIANT_NAMES)


def test_catalogue_is_well_formed() -> None:
    """SEEDED_BUGS is every bug but the hang, names are unique, and each has a one-line description."""
    assert SEEDED_BUGS == PAGED_BUGS + LIFECYCLE_BUGS + SCHEDULER_BUGS + POLICY_BUGS
    assert HANG not in SEEDED_BUGS
    names = [bug.name for bug in (*SEEDED_BUGS, HANG)]
    assert len(names) == len(set(names))
    assert set(SEARCH_MISSES) <= {*names, *(f"{name}-incremental" for name in names)}
    for bug in (*SEEDED_BUGS, HANG):
        assert bug.description and "\n" not in bug.description, bug.name
        assert bug.max_ops >= 1 and bug.named_first != bug.invariant, bug.name
