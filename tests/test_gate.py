"""The CI gate end to end on a fixture engine repository (tests/data/engine_repo), as docs/ci.md runs it.

The fixture is a tiny allocator package that registers its adapter by entry point and declares
its gate in [tool.kvspec]. It is installed with pip into a folder of its own (its entry point is
found there); its source folder comes first on PYTHONPATH, so editing it is a code change.
Stages: the gate passes; a change introduces a bug and the gate fails naming the invariant;
the case goes into the baseline and the gate passes with it known; the bug is fixed and the
gate reports the entry fixed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from clirun import Run, kvspec

from kvspec.case import Case
from kvspec.gate import Baseline, Entry, GateConfigError, case_fingerprint, fingerprint
from kvspec.gate import config as gate_config
from kvspec.report import report_problems
from kvspec.schemas import problems
from kvspec.spec import Config, Op

ENGINE = Path(__file__).parent / "data" / "engine_repo"
FREE_LINE = '                self.evictions.append(("reclaim", block.block_id, block.block_hash))\n'
BUGGY_LINE = "                pass  # the reclaim goes unreported\n"


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture repository, copied, and installed into its own site folder (the entry point lives there)."""
    root = tmp_path_factory.mktemp("engine")
    repo = root / "repo"
    shutil.copytree(ENGINE, repo)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(root / "site"), str(repo)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return repo


def gate(repo: Path, *args: str, summary: Path | None = None) -> Run:
    """``kvspec ARGS`` (default: ``gate``) in the fixture repository, with it installed."""
    args = args or ("gate",)
    env = {"PYTHONPATH": f"{repo}:{repo.parent / 'site'}"}
    if summary is not None:
        env["GITHUB_STEP_SUMMARY"] = str(summary)
    return kvspec(*args, cwd=repo, env=env, limit=600)


def outputs(repo: Path) -> tuple[dict, ET.Element, str]:
    result = json.loads((repo / ".kvspec" / "gate.json").read_text())
    assert problems(result, "gate") == []
    for adapter in result["adapters"]:
        assert report_problems(adapter["report"]) == []
    junit = ET.parse(repo / ".kvspec" / "gate.xml").getroot()
    return result, junit, (repo / ".kvspec" / "gate.md").read_text()


@pytest.mark.slow
def test_the_gate_through_its_four_stages(engine: Path, tmp_path: Path) -> None:
    allocator = engine / "tinyengine" / "allocator.py"
    source = allocator.read_text()
    assert FREE_LINE in source

    # 1. the engine as it is: the gate passes
    run = gate(engine)
    assert run.code == 0, run.err
    result, junit, _ = outputs(engine)
    assert result["status"] == "passed" and result["adapters"][0]["adapter"] == "tinyengine"
    assert result["adapters"][0]["report"]["steps"] > 0
    assert not junit.findall(".//failure")
    assert "kvspec gate: PASSED" in run.out.splitlines()[-1]

    # 2. a change drops the reclaim event: the gate fails, naming the invariant, in every output
    allocator.write_text(source.replace(FREE_LINE, BUGGY_LINE))
    summary = tmp_path / "step-summary.md"
    run = gate(engine, summary=summary)
    assert run.code == 1, run.err
    result, junit, markdown = outputs(engine)
    [new] = result["adapters"][0]["new"]
    invariant = new["invariant"]
    assert result["status"] == "violated" and invariant in run.out.splitlines()[-1]
    assert [f.get("message") for f in junit.findall(".//failure")] == [f"{invariant} violated"]
    assert f"`{invariant}`" in markdown and "New violations" in markdown
    assert summary.read_text() == markdown  # $GITHUB_STEP_SUMMARY gets the same summary
    case = Path(new["case"])
    assert case_fingerprint(Case.load(case)) == new["fingerprint"]

    # 3. the case goes into the baseline: the gate passes and reports it known
    add = gate(engine, "baseline", "add", str(case), "--reason", "tinyengine#14: reclaim unreported")
    assert add.code == 0, add.err
    baseline = Baseline.load(engine / "kvspec-baseline.json")
    assert [(e.invariant, e.fingerprint) for e in baseline.entries] == [(invariant, new["fingerprint"])]
    run = gate(engine)
    assert run.code == 0, run.out[-3000:]
    result, junit, markdown = outputs(engine)
    verdict = result["adapters"][0]
    assert verdict["status"] == "passed" and verdict["new"] == []
    assert [k["fingerprint"] for k in verdict["known"]] == [new["fingerprint"]]
    row = next(r for r in verdict["report"]["invariants"] if r["name"] == invariant)
    assert row["verdict"] == "unknown" and "known violation" in row["reason"]
    skipped = {c.get("name"): c.find("skipped") for c in junit.iter("testcase")}
    assert skipped[invariant] is not None and "tinyengine#14" in skipped[invariant].get("message", "")
    assert "1 known" in run.out.splitlines()[-1] and "Known violations" in markdown

    # 4. the bug is fixed: the gate passes and says the entry can go
    allocator.write_text(source)
    run = gate(engine)
    assert run.code == 0, run.err
    result, _, markdown = outputs(engine)
    assert [f["fingerprint"] for f in result["adapters"][0]["fixed"]] == [new["fingerprint"]]
    assert result["adapters"][0]["known"] == [] and "remove these entries" in markdown


def test_fingerprint_is_the_shape_of_the_ops() -> None:
    def shape(ops: list[Op], invariant: str = "inv", step: int | None = None) -> str:
        return fingerprint(invariant, ops, step, block_size=2)

    ops = [Op("admit", "a", (7, 7, 9)), Op("admit", "b", (7, 7)), Op("release", "a", keep=False)]
    renamed = [Op("admit", "x", (1, 1)), Op("admit", "y", (1, 1, 4)), Op("release", "x", keep=False)]
    assert shape(ops) == shape(renamed)  # other names, other token values, a partial block more or less
    assert shape(ops) != shape(ops, "other")
    shared_differently = [Op("admit", "a", (7, 7, 9)), Op("admit", "b", (9, 9)), Op("release", "a", keep=False)]
    assert shape(ops) != shape(shared_differently)
    assert shape(ops) != shape([*ops[:2], Op("release", "a", keep=True)])
    assert shape(ops) != shape([ops[1], ops[0], ops[2]])  # another request holds the block first
    # ops after the violating step do not count
    assert shape([*ops, Op("reset_cache")], step=2) == shape(ops)


def test_baseline_round_trip_and_rejections(tmp_path: Path) -> None:
    case = Case("tinyengine", Config(4, 2), [Op("admit", "a", (1, 2))], {"invariant": "inv", "step": 0})
    baseline = Baseline()
    assert baseline.add(Entry.from_case(case, "why", versions=">=0.1,<0.2"))
    assert not baseline.add(Entry.from_case(case, "again"))  # one entry per adapter and fingerprint
    path = tmp_path / "b.json"
    baseline.save(path)
    loaded = Baseline.load(path)
    assert loaded.for_adapter("tinyengine", "tinyengine 0.1.0") == loaded.entries
    assert loaded.for_adapter("tinyengine", "tinyengine 0.2.0") == []
    with pytest.raises(ValueError, match="not a version specifier"):
        Entry.from_case(case, "why", versions="0.1.*,")
    with pytest.raises(ValueError, match="names no broken invariant"):
        Entry.from_case(Case("a", Config(), []), "why")
    data = json.loads(path.read_text())
    data["entries"][0]["fingerprint"] = "not hex"
    with pytest.raises(ValueError, match="fingerprint"):
        Baseline.from_json(data)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[tool.kvspec]\nadapters = ['reference']\nprofle = 'ci'\n", "unknown key 'profle'"),
        ("[tool.kvspec]\nadapters = []\n", "at least one adapter"),
        ("[tool.kvspec]\nadapters = ['reference']\nseed = '1'\n", "seed must be an integer"),
        ("[tool.kvspec]\nadapters = ['reference']\ntime-budget = -1\n", "time-budget must be a positive"),
        ("[tool.kvspec]\nadapters = [{name = 'reference', junk = 1}]\n", "junk is not a per-adapter key"),
        ("[tool.kvspec]\nadapters = ['reference']\nprofile = 'fast'\n", "profile must be one of"),
        ("[tool.kvspec\n", "not valid TOML"),
    ],
)
def test_a_bad_declaration_is_exit_2_with_one_line(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "pyproject.toml").write_text(text)
    with pytest.raises(GateConfigError, match=message):
        gate_config.load(tmp_path / "pyproject.toml")
    run = kvspec("gate", cwd=tmp_path)
    assert run.code == 2 and "Traceback" not in run.err
    assert len(run.err.strip().splitlines()) == 1 and message in run.err


def test_gate_without_a_declaration_says_where_to_declare(tmp_path: Path) -> None:
    run = kvspec("gate", cwd=tmp_path)
    assert run.code == 2 and "[tool.kvspec]" in run.err and "docs/ci.md" in run.err


def test_a_malformed_baseline_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "known.json").write_text('{"kvspec_baseline": 1, "entries": [{"adapter": "x"}]}')
    run = kvspec("gate", "--adapter", "reference", "--baseline", "known.json", cwd=tmp_path)
    assert run.code == 2 and run.err.startswith("kvspec: known.json:") and "Traceback" not in run.err


def test_time_budget_stops_the_search(tmp_path: Path) -> None:
    run = kvspec(
        "gate",
        "--adapter",
        "reference",
        "--profile",
        "thorough",
        "--time-budget",
        "3",
        "--no-example-db",
        "--report",
        "g.json",
        cwd=tmp_path,
        limit=300,
    )
    assert run.code == 0, run.err
    report = json.loads((tmp_path / "g.json").read_text())["adapters"][0]["report"]
    assert report["budget_spent"] is True and report["examples"] < 3000
    assert report["duration_s"] < 60  # the thorough profile's 3,000 examples take minutes


@pytest.mark.slow
def test_the_example_database_replays_a_failure_first(tmp_path: Path) -> None:
    """A counterexample found once is tried first by the next run, whatever that run's seed."""
    from seeded_bugs import ShareCopies, _paged

    from kvspec.stateful_tests import PROFILES, Options, run_check

    def check(seed: int) -> Any:
        return run_check(
            _paged(ShareCopies),
            "share-copies",
            Options(
                profile=PROFILES["thorough"],
                seed=seed,
                max_examples=300,
                cases_dir=tmp_path / "cases",
                example_db=tmp_path / "db",
            ),
        )

    first = check(1)
    assert first.status == "violated" and first.tally.first_failure_at is not None
    assert first.tally.first_failure_at[0] > 1  # the first run had to search for it
    assert any((tmp_path / "db").rglob("*")), "nothing was kept in the example database"
    second = check(2)
    assert second.status == "violated" and second.failure is not None
    assert second.tally.first_failure_at == (1, second.tally.first_failure_at[1])  # its very first example
    assert second.failure.invariant == first.failure.invariant


def test_gate_html_draws_each_new_violation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``kvspec gate --html``: one page with the adapter's verdict on the baseline and its new violation's case
    replayed on the adapter and drawn, the violating cell marked; a known one is listed and not drawn."""
    from kvspec.cli import main

    monkeypatch.chdir(tmp_path)
    page = tmp_path / "gate.html"
    argv = ["gate", "--adapter", "seeded_bugs:forget_decrement", "--max-examples", "30", "--safety-only"]
    argv += ["--no-example-db", "--html", str(page)]
    assert main(argv) == 1
    result = json.loads((tmp_path / ".kvspec" / "gate.json").read_text())
    [new] = result["adapters"][0]["new"]
    text = page.read_text()
    assert f"{new['invariant']} ({new['fingerprint']})" in text and "New violations (1)" in text
    assert text.count('<figure class="timeline"') == 1 and "c0p1-violation-" in text
    assert f'id="a0-verdict-{new["invariant"]}"><td>{new["invariant"]}</td>' in text

    assert main(["baseline", "add", new["case"], "--reason", "seeded", "--baseline", "base.json"]) == 0
    assert main([*argv, "--baseline", "base.json"]) == 0
    text = page.read_text()
    assert "New violations (0)" in text and '<figure class="timeline"' not in text and "seeded" in text
