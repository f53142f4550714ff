"""The suite's own guarantees: determinism of the ci profile, flaky detection, replaying given cases first."""

from __future__ import annotations

from pathlib import Path

from kvspec.adapters.reference_paged import ReferencePagedAdapter
from kvspec.reference.paged import PagedPrefixCache
from kvspec.spec import Config, Op
from kvspec.stateful_tests import PROFILES, Case, Options, run_check


def test_ci_profile_is_deterministic(tmp_path: Path) -> None:
    runs = [
        run_check(
            ReferencePagedAdapter, "reference", Options(profile=PROFILES["ci"], max_examples=40, cases_dir=tmp_path)
        )
        for _ in range(2)
    ]
    assert runs[0].tally.steps == runs[1].tally.steps > 0
    assert runs[0].tally.coverage == runs[1].tally.coverage


def test_seed_changes_the_examples(tmp_path: Path) -> None:
    a, b = (
        run_check(
            ReferencePagedAdapter,
            "reference",
            Options(profile=PROFILES["ci"], seed=s, max_examples=40, cases_dir=tmp_path),
        )
        for s in (1, 2)
    )
    assert a.status == b.status == "passed"
    assert a.tally.coverage != b.tally.coverage


class FirstInstanceLeaks(PagedPrefixCache):
    """Leaks a reference on free, but only in pools built by the first adapter instance."""

    def __init__(self, capacity: int, block_size: int, first: bool) -> None:
        super().__init__(capacity, block_size)
        self.first = first

    def free(self, req_id: str, *, keep_cached: bool = True) -> None:
        if self.first and self.req_blocks.get(req_id):
            self.req_blocks[req_id][0].ref_cnt += 1
        super().free(req_id, keep_cached=keep_cached)


class BuggyOnce(ReferencePagedAdapter):
    """The first instance ever built leaks; later ones do not. Instances are counted in a file: each adapter
    runs in its own child process, so a class attribute would start from zero in every one."""

    counter: Path

    def __init__(self) -> None:
        first = not self.counter.exists()
        self.counter.touch()
        super().__init__(lambda c: FirstInstanceLeaks(c.capacity, c.block_size, first))


def test_a_failure_that_does_not_replay_is_reported_as_flaky(tmp_path: Path) -> None:
    BuggyOnce.counter = tmp_path / "built"
    result = run_check(BuggyOnce, "buggy-once", Options(profile=PROFILES["ci"], cases_dir=tmp_path, refine=False))
    assert result.exit_code == 1
    assert any(f["kind"] == "flaky" for f in result.findings), result.findings
    assert result.cases and Path(result.cases[0]).exists()


class LeakyPool(PagedPrefixCache):
    def free(self, req_id: str, *, keep_cached: bool = True) -> None:
        if self.req_blocks.get(req_id):
            self.req_blocks[req_id][0].ref_cnt += 1
        super().free(req_id, keep_cached=keep_cached)


def test_given_cases_run_before_the_random_phase(tmp_path: Path) -> None:
    case = Case("leaky", Config(capacity=4, block_size=2), [Op("admit", "r0", (1, 2, 3)), Op("release", "r0")])
    result = run_check(
        lambda: ReferencePagedAdapter(lambda c: LeakyPool(c.capacity, c.block_size)),
        "leaky",
        Options(profile=PROFILES["ci"], cases_dir=tmp_path),
        extra_cases=[case],
    )
    assert result.exit_code == 1
    assert result.tally.examples == 1  # found by the given case, before any random example
    assert result.failure is not None and result.failure_ops == case.ops
    assert "ref_count_matches_references" in result.failure.failures


def test_a_cases_dir_given_as_a_string_keeps_the_case(tmp_path: Path) -> None:
    case = Case("leaky", Config(capacity=4, block_size=2), [Op("admit", "r0", (1, 2, 3)), Op("release", "r0")])
    folder = tmp_path / "cases"
    result = run_check(
        lambda: ReferencePagedAdapter(lambda c: LeakyPool(c.capacity, c.block_size)),
        "leaky",
        Options(profile=PROFILES["ci"], cases_dir=str(folder)),
        extra_cases=[case],
    )
    assert result.exit_code == 1
    assert result.cases and Path(result.cases[0]).parent == folder and Path(result.cases[0]).exists()
