"""``kvspec check --workers N`` (stateful_tests/workers.py) and the report merge it ends with (kvspec/report_merge.py).

A run of N workers is the N one-process runs of the seeds the contract derives, summed; a
seeded bug is found by every worker and each keeps its own case; the merged status follows
the exit-code contract (a violation anywhere: 1; else a part that could not run: 2).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from kvspec import schemas
from kvspec.adapters.reference_paged import ReferencePagedAdapter
from kvspec.cli import main
from kvspec.report import Report, Row
from kvspec.report_merge import merge_reports, report_from_json
from kvspec.stateful_tests import Options
from kvspec.stateful_tests import workers as workers_module
from kvspec.stateful_tests.workers import base_seed, run_workers, worker_seed

QUICK = ["--quiet", "--no-scenarios", "--max-examples", "5"]


def test_the_seed_contract() -> None:
    """Worker 0 runs the run's seed; the others a 32-bit digest of (seed, worker), the same every time and distinct."""
    assert worker_seed(7, 0) == 7
    seeds = [worker_seed(7, i) for i in range(8)]
    assert len(set(seeds)) == 8 and all(0 <= s < 2**32 for s in seeds)
    assert seeds == [worker_seed(7, i) for i in range(8)]
    assert worker_seed(8, 1) != worker_seed(7, 1)
    assert base_seed(Options(profile="ci")) == 0 and base_seed(Options(seed=5)) == 5


def test_two_workers_are_the_two_single_runs_of_their_seeds(tmp_path: Path) -> None:
    """--workers 2 --seed 7: steps, examples and coverage are those of `--seed 7` and `--seed worker_seed(7, 1)`
    run alone, summed (each worker replays on its own), and the two explore differently."""
    merged = tmp_path / "m.json"
    assert main(["check", "--workers", "2", "--seed", "7", "--report", str(merged), *QUICK]) == 0
    data = json.loads(merged.read_text())
    schemas.check(data, "report")
    assert [w["seed"] for w in data["workers"]] == [7, worker_seed(7, 1)]
    assert data["seed"] == 7 and all(w["status"] == "passed" for w in data["workers"])
    alone = []
    for seed in (7, worker_seed(7, 1)):
        path = tmp_path / f"{seed}.json"
        assert main(["check", "--seed", str(seed), "--report", str(path), *QUICK]) == 0
        alone.append(json.loads(path.read_text()))
    assert alone[0]["coverage"] != alone[1]["coverage"]
    assert data["steps"] == sum(r["steps"] for r in alone) and data["examples"] == sum(r["examples"] for r in alone)
    summed = {k: alone[0]["coverage"].get(k, 0) + alone[1]["coverage"].get(k, 0) for k in data["coverage"]}
    assert data["coverage"] == summed
    assert [w["steps"] for w in data["workers"]] == [r["steps"] for r in alone]


def test_every_worker_finds_a_seeded_bug_and_keeps_its_own_case(tmp_path: Path) -> None:
    """A seeded bug under --workers 2 (the swarm engine; the Hypothesis engine's workers find one in
    test_redis_example_db.py, where their shrinking is paid once): exit 1, the invariant named, each worker's
    violation and case in the report, each case in the worker's own folder, and each replays the bug."""
    report = tmp_path / "r.json"
    args = ["check", "--adapter", "seeded_bugs:forget_decrement", "--safety-only", "--engine", "swarm"]
    args += ["--workers", "2", "--cases-dir", str(tmp_path / "cases"), "--report", str(report), *QUICK[:2]]
    assert main(args) == 1
    data = json.loads(report.read_text())
    schemas.check(data, "report")
    assert data["status"] == "violated"
    row = next(r for r in data["invariants"] if r["name"] == "ref_count_matches_references")
    assert row["verdict"] == "violated"
    assert [w["first_violated"] for w in data["workers"]] == ["ref_count_matches_references"] * 2
    for i, worker in enumerate(data["workers"]):
        (case,) = worker["cases"]
        assert Path(case).parent == tmp_path / "cases" / f"worker-{i}"
        assert main(["replay", case]) == 1
    assert data["cases"] == [w["cases"][0] for w in data["workers"]]
    assert data["seconds_to_first_failure"] == min(w["seconds_to_first_failure"] for w in data["workers"])


def test_a_worker_that_dies_is_a_part_that_could_not_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Worker 1 exits before it reports: the merged report is status error (exit 2) naming it; worker 0's
    steps are still counted."""
    work = workers_module._work

    def dies_in_worker_1(factory, name, options, conn):  # type: ignore[no-untyped-def]
        if options.seed != 3:
            os._exit(3)
        work(factory, name, options, conn)

    monkeypatch.setattr(workers_module, "_work", dies_in_worker_1)
    options = Options(seed=3, max_examples=3, scenarios=False, cases_dir=tmp_path)
    report = run_workers(ReferencePagedAdapter, "reference", options, 2)
    assert report.status == "error" and report.exit_code == 2
    assert "worker 1 exited with status 3 before it reported" in report.error
    assert report.sections["workers"][0]["status"] == "passed" and report.steps > 0


def test_workers_must_be_at_least_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--workers", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "kvspec: --workers must be at least 1, not 0\n"


def test_workers_are_at_most_four_per_usable_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    from kvspec.bounds import max_workers

    cap = max_workers()
    assert main(["check", "--workers", str(cap + 1)]) == 2
    assert capsys.readouterr().err == f"kvspec: --workers must be at most {cap} (4 per usable CPU), not {cap + 1}\n"


def test_a_worker_that_cannot_be_forked_is_a_run_that_could_not_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A process limit (fork fails with BlockingIOError) after one worker started: exit 2 with the reason, the
    started worker stopped, never a traceback read as a violation."""
    from multiprocessing.process import BaseProcess

    start = BaseProcess.start
    started: list[BaseProcess] = []

    def second_fails(self: BaseProcess) -> None:
        if self.name == "kvspec-worker-1":
            raise BlockingIOError(11, "Resource temporarily unavailable")
        if self.name == "kvspec-worker-0":
            started.append(self)
        start(self)

    monkeypatch.setattr(BaseProcess, "start", second_fails)
    options = Options(seed=3, max_examples=100000, scenarios=False, cases_dir=tmp_path)
    report = run_workers(ReferencePagedAdapter, "reference", options, 2)
    assert report.status == "error" and report.exit_code == 2
    assert report.error == "could not start worker 1 of 2: Resource temporarily unavailable"
    assert started and not started[0].is_alive()


def _part(status: str, rows: list[Row], steps: int = 10, error: str = "", seed: int = 0) -> Report:
    return Report(
        adapter="a",
        rows=rows,
        status=status,
        steps=steps,
        examples=1,
        error=error,
        seed=seed,  # type: ignore[arg-type]
        coverage={"evict": steps},
    )


HELD = Row("x", "safety", checked_steps=4)
UNTRIED = Row("x", "safety", checked_steps=0)
VIOLATED = Row("x", "safety", checked_steps=2, first_violation={"step": 1})
NOT_JUDGED = Row("x", "safety", checked_steps=3, applicable=False, reason="not observable")


@pytest.mark.parametrize(
    ("statuses", "merged"),
    [
        (["passed", "passed"], "passed"),
        (["error", "violated"], "violated"),
        (["passed", "violated"], "violated"),
        (["error", "passed"], "error"),
        (["interrupted", "error"], "error"),
        (["interrupted", "passed"], "interrupted"),
    ],
)
def test_the_merged_status_follows_the_exit_code_contract(statuses: list[str], merged: str) -> None:
    parts = [
        _part(s, [VIOLATED if s == "violated" else HELD], error=s if s in ("error", "interrupted") else "")
        for s in statuses
    ]
    report = merge_reports(parts)
    assert report.status == merged
    assert report.exit_code == {"passed": 0, "violated": 1}.get(merged, 2)
    if "error" in statuses:
        assert f"part {statuses.index('error')}: error" in report.error


def test_merged_rows_sum_steps_and_take_the_first_violation() -> None:
    """Held in one part and never tried in another: held; judged nowhere: unknown with its reason; a violation
    is the first part's that has one; steps, examples and coverage summed; a JSON round trip changes nothing."""
    first_violation = {"step": 9}
    later = Row("x", "safety", checked_steps=5, first_violation=first_violation)
    assert merge_reports([_part("passed", [UNTRIED]), _part("passed", [HELD])]).verdict("x") == "held"
    unknown = merge_reports([_part("passed", [NOT_JUDGED]), _part("passed", [UNTRIED])])
    assert unknown.verdict("x") == "unknown" and unknown.rows[0].reason == "not observable"
    violated = merge_reports([_part("passed", [HELD]), _part("violated", [later]), _part("violated", [VIOLATED])])
    assert violated.rows[0].first_violation == first_violation and violated.rows[0].checked_steps == 11
    assert violated.steps == 30 and violated.examples == 3 and violated.coverage == {"evict": 30}
    again = merge_reports([report_from_json(json.loads(json.dumps(violated.to_json())))])
    assert again.rows == violated.rows and again.status == "violated" and again.steps == 30


def test_a_merge_of_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="no reports"):
        merge_reports([])


def test_a_fleet_of_event_logs_checked_one_by_one_and_merged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two serving instances' vLLM KV event logs (a real recorded one, and the same with a block stored twice),
    each checked on its own, merged by `kvspec report merge`: exit 1 naming the second instance's violation;
    the two clean ones merge to exit 0 with their steps summed; a file that is no report is exit 2, one line."""
    from test_traces import VLLM_GOOD, load, vllm_store_twice, write

    bad_log = write(tmp_path, vllm_store_twice(load(VLLM_GOOD)))
    reports = []
    for i, log in enumerate([VLLM_GOOD, bad_log, VLLM_GOOD]):
        reports.append(tmp_path / f"instance-{i}.json")
        main(["trace", "check", str(log), "--format", "vllm-events", "--report", str(reports[-1])])
    merged = tmp_path / "fleet.json"
    assert main(["report", "merge", *map(str, reports), "-o", str(merged)]) == 1
    data = json.loads(merged.read_text())
    schemas.check(data, "report")
    assert [w["status"] for w in data["workers"]] == ["passed", "violated", "passed"]
    assert data["workers"][1]["first_violated"] is not None
    assert next(r for r in data["invariants"] if r["name"] == "stored_once")["verdict"] == "violated"
    clean = [reports[0], reports[2]]
    assert main(["report", "merge", *map(str, clean), "-o", str(merged)]) == 0
    one = json.loads(reports[0].read_text())
    assert json.loads(merged.read_text())["steps"] == 2 * one["steps"] > 0
    capsys.readouterr()
    assert main(["report", "merge", str(reports[0]), str(VLLM_GOOD)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"kvspec: {VLLM_GOOD}: ") and err.count("\n") == 1


def test_report_merge_writes_a_merge_of_reports_it_was_given(tmp_path: Path) -> None:
    """A written report read back and merged with itself: each row's steps doubled, its verdicts kept."""
    part = _part("violated", [VIOLATED], steps=4)
    path = tmp_path / "p.json"
    part.write_json(path)
    out = tmp_path / "m.json"
    assert main(["report", "merge", str(path), str(path), "-o", str(out)]) == 1
    data = json.loads(out.read_text())
    assert data["invariants"][0]["checked_steps"] == 4 and data["invariants"][0]["verdict"] == "violated"
    assert data["steps"] == 8 and len(data["workers"]) == 2


@pytest.mark.slow
def test_an_interrupted_run_of_workers_writes_what_each_had(tmp_path: Path) -> None:
    """SIGINT to `kvspec check --workers 2` while the workers run: each is told, stops and reports; the merged
    report is written with status interrupted, both workers' rows, and the command exits 2."""
    from clirun import kvspec

    report = tmp_path / "r.json"
    run = kvspec(
        "check", "--workers", "2", "--max-examples", "100000", "--no-scenarios", "--quiet",
        "--cases-dir", str(tmp_path), "--report", str(report), interrupt_after=4.0, from_held=True, limit=60,
    )  # fmt: skip
    assert run.code == 2, run.err
    data = json.loads(report.read_text())
    schemas.check(data, "report")
    assert data["status"] == "interrupted" and [w["status"] for w in data["workers"]] == ["interrupted"] * 2
    assert all(w["steps"] > 0 for w in data["workers"])
