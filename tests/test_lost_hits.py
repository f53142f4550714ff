"""Lost hits judged against what the pool holds (spec/invariants/lost_hits.py), and runs that step past a violation.

Each bug here is driven by explicit ops, so the situation it needs (two copies of one block, one held) is reached
for certain; the catalogue (tests/test_seeded_bugs.py) finds the others by search.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from seeded_bugs import (
    LONG_SEARCH_BUGS,
    DropsComputedOnFree,
    NewestForgetsCopies,
    PrefersIdleCopy,
    WrongHitBehindLeak,
    _newest,
    _paged,
)

from kvspec.adapters.reference_paged import ReferenceNewestAdapter, ReferencePagedAdapter
from kvspec.spec import Config, Op
from kvspec.stateful_tests import PROFILES, Harness, Options, Tally, replay_ops, run_check, run_swarm

POOL = Config(capacity=6, block_size=2)

# Two requests compute the same second block: two copies of one key. r2 leaves, so its copy is idle while r1 holds
# the other; r3's prompt can share r1's copy.
DUPLICATES = [
    Op("admit", "r1", (1, 2, 3)),
    Op("admit", "r2", (1, 2, 3)),
    Op("append", "r1", (4,)),
    Op("append", "r2", (4,)),
    Op("release", "r2"),
]


def test_an_idle_duplicate_taken_while_a_held_copy_is_there_is_a_needless_allocation() -> None:
    ops = [*DUPLICATES, Op("admit", "r3", (1, 2, 3, 4, 5))]
    assert replay_ops(ReferenceNewestAdapter(), POOL, ops) is None  # the correct pool shares r1's copy
    violation = replay_ops(_newest(PrefersIdleCopy)(), POOL, ops, refine=False)
    assert violation is not None and violation.invariant == "no_needless_allocation", violation
    assert violation.step == len(ops) - 1


def test_a_copy_the_index_forgot_is_a_lost_hit_whatever_duplicate_keys_declares() -> None:
    # r1's copy becomes the only one when r2's (the newest, the entry's owner) is evicted by r4's prompt, which
    # takes every block in the free queue; the forgetful index then misses r1's copy, which still holds the tokens.
    ops = [
        *DUPLICATES,
        Op("admit", "r4", (7,) * 8),
        Op("release", "r4"),
        Op("admit", "r3", (1, 2, 3, 4, 5)),
    ]
    assert replay_ops(ReferenceNewestAdapter(), POOL, ops) is None
    violation = replay_ops(_newest(NewestForgetsCopies)(), POOL, ops, refine=False)
    assert violation is not None and violation.invariant == "no_lost_hit", violation
    assert "lost hits" in str(violation)


def test_a_release_that_drops_the_last_copy_of_computed_tokens_loses_hits() -> None:
    # unkeyed: r2's second block stays unhashed (r1's holds the hash); r1 leaves and its block is evicted, so r2's
    # block holds the last copy, which its release must keep cached.
    ops = [*DUPLICATES[:4], Op("release", "r1"), Op("admit", "r4", (7, 7, 7, 7, 7)), Op("release", "r2")]
    assert replay_ops(ReferencePagedAdapter(), Config(capacity=5, block_size=2), ops) is None
    bug = _paged(DropsComputedOnFree)()
    violation = replay_ops(bug, Config(capacity=5, block_size=2), ops, refine=False)
    assert violation is not None and violation.invariant == "release_keeps_cache", violation


def test_a_plain_run_stops_at_the_first_symptom_and_keep_going_reports_the_wrong_hit_behind_it(tmp_path: Path) -> None:
    factory = _paged(WrongHitBehindLeak)
    profile = PROFILES["ci"]
    plain = run_check(factory, "wrong-hit", Options(profile=profile, cases_dir=tmp_path / "plain", refine=False))
    assert plain.failure is not None and plain.failure.invariant == "ref_count_matches_references"
    assert "cache_index_consistency" not in {v.invariant for v, _, _ in plain.more_failures}
    kept = run_check(
        factory, "wrong-hit", Options(profile=profile, cases_dir=tmp_path / "kept", refine=False, keep_going=True)
    )
    named = {kept.failure.invariant if kept.failure else "", *(v.invariant for v, _, _ in kept.more_failures)}
    assert {"ref_count_matches_references", "cache_index_consistency"} <= named, named
    counts = kept.report().to_json()["violations"]
    assert counts["ref_count_matches_references"] > counts["cache_index_consistency"] >= 1, counts
    wrong = next(
        (v, ops, c) for v, ops, c in [(kept.failure, kept.failure_ops, kept.failure_config), *kept.more_failures]
        if v is not None and v.invariant == "cache_index_consistency"
    )  # fmt: skip
    _, ops, config = wrong
    assert config is not None
    again = replay_ops(factory(), config, ops, refine=False, target="cache_index_consistency")
    assert again is not None and again.step == len(ops) - 1  # its own shrunk case, ending where it breaks
    first = replay_ops(factory(), config, ops, refine=False)
    assert first is not None and first.invariant == "ref_count_matches_references"  # masked without stepping past


def test_a_tolerated_violation_re_synchronises_the_spec_so_what_follows_is_judged_from_the_adapters_state(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # DropsComputedOnFree breaks release_keeps_cache at step 6 (and, as its own symptom there, the free capacity
    # the spec predicts). With those tolerated (a gate's baseline), the steps after it are judged from the
    # adapter's state: the spec adopts it, and nothing the bug left behind is reported again as new.
    ops = [
        *DUPLICATES[:4],
        Op("release", "r1"),
        Op("admit", "r4", (7, 7, 7, 7, 7)),
        Op("release", "r2"),
        Op("admit", "r5", (9,) * 6),
        Op("release", "r4"),
        Op("admit", "r6", (1, 2, 3, 4, 8)),
    ]
    config = Config(capacity=5, block_size=2)
    bug = _paged(DropsComputedOnFree)
    known = frozenset({"release_keeps_cache", "predicted_free_capacity"})
    tally = Tally(ignored=known)
    assert replay_ops(bug(), config, ops, tally) is None
    assert tally.checked["predicted_eviction"] == len(ops)
    monkeypatch.setattr(Harness, "_resync", lambda self, after: None)  # the spec keeps its own state
    unsynced = replay_ops(bug(), config, ops, Tally(ignored=known))
    assert unsynced is not None and unsynced.step > 6, unsynced  # a consequence, reported as if new


@pytest.mark.slow
@pytest.mark.parametrize("engine", [run_check, run_swarm], ids=["hypothesis", "swarm"])
def test_the_search_finds_the_wrong_duplicate_preferred(engine: object, tmp_path: Path) -> None:
    (bug,) = LONG_SEARCH_BUGS
    run = engine(bug.factory, bug.name, Options(profile=PROFILES["ci"], cases_dir=tmp_path, refine=False))  # type: ignore[operator]
    assert run.failure is not None and run.failure.invariant in {bug.invariant, *bug.symptoms}, run.failure
    assert len(run.failure_ops) <= bug.max_ops
    assert replay_ops(bug.correct(), run.failure_config, run.failure_ops) is None


def test_a_recorded_trace_of_a_lost_hit_is_counted_by_trace_check(tmp_path: Path) -> None:
    """Traces that show what was cached (kvspec format with observations) are judged by the same checks, to the end."""
    from clirun import kvspec

    trace = tmp_path / "short-chain.jsonl"
    recorded = kvspec(
        "trace", "record", "--adapter", "seeded_bugs:short_chain", "--out", str(trace), "--seed", "5", "--steps", "300"
    )
    assert recorded.code == 0, recorded.err
    report = tmp_path / "report.json"
    checked = kvspec("trace", "check", str(trace), "--report", str(report))
    assert checked.code == 1, checked.err
    rows = {row["name"]: row for row in json.loads(report.read_text())["invariants"]}
    lines = trace.read_text().splitlines()
    admitted = sum(
        1 for line in lines if '"status":"ok"' in line and ('"op":"admit"' in line or '"op":"resume"' in line)
    )
    assert rows["no_lost_hit"]["verdict"] == "violated" and 1 <= rows["no_lost_hit"]["violations"] <= admitted, rows[
        "no_lost_hit"
    ]
