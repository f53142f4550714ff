"""The second round of reliability probes (the contract of README's exit codes): each command here broke it
before its fix: a traceback, a false pass, or a result dropped without a word."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from clirun import kvspec

from kvspec.cli import main

TESTS = Path(__file__).resolve().parent


def one_line_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, (code, err)
    return err


@pytest.fixture
def case(tmp_path: Path) -> Path:
    """A saved case: two ops on the reference adapter."""
    path = tmp_path / "case.json"
    ops = [{"op": "admit", "req": "r1", "tokens": [0, 0, 1, 0]}, {"op": "release", "req": "r1"}]
    data = {"kvspec_case": 1, "adapter": "reference", "config": {"capacity": 4, "block_size": 2}, "ops": ops}
    path.write_text(json.dumps({**data, "expected": {}}))
    return path


def test_an_example_database_that_is_a_file_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Hypothesis's folder database on a regular file keeps nothing: the run would pass and drop its failures."""
    afile = tmp_path / "afile"
    afile.write_text("")
    err = one_line_exit_2(capsys, ["check", "--example-db", str(afile), "--max-examples", "2"])
    assert "is a file" in err


@pytest.mark.parametrize("tool", ["tool = 3", 'tool = ["kvspec"]'])
@pytest.mark.parametrize("command", [["gate"], ["baseline", "add", "CASE", "--reason", "r"]])
def test_a_tool_key_that_is_not_a_table_is_one_line(
    tool: str, command: list[str], case: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "pyproject.toml").write_text(tool + "\n")
    monkeypatch.chdir(tmp_path)
    err = one_line_exit_2(capsys, [str(case) if a == "CASE" else a for a in command])
    assert "'tool' must be a table" in err


def test_blank_versions_are_not_every_version(case: Path, tmp_path: Path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    err = one_line_exit_2(capsys, ["baseline", "add", str(case), "--reason", "r", "--versions", "   "])
    assert "--versions is blank" in err and not (tmp_path / "kvspec-baseline.json").exists()


def test_a_replay_whose_close_raises_is_the_adapter_s_finding(case: Path) -> None:
    run = kvspec("replay", str(case), "--adapter", "faulty_adapters:RaiseClose")
    assert run.code == 1 and "Traceback" not in run.err, run.err
    assert "adapter_contract: close() raised RuntimeError: close failed" in run.out


@pytest.mark.parametrize(
    ("adapter", "said"),
    [
        ("ApplyReturnsNone", "at step 0 (admit("),
        ("ObserveReturnsNone", "before the first step: observe() returned None, not an Observation"),
    ],
)
def test_trace_record_with_malformed_answers_is_one_line(adapter: str, said: str, tmp_path: Path) -> None:
    out = tmp_path / "run.jsonl"
    run = kvspec("trace", "record", "--adapter", f"faulty_adapters:{adapter}", "--steps", "5", "--out", str(out))
    assert run.code == 2 and run.err.count("\n") == 1 and "Traceback" not in run.err, run.err
    assert said in run.err


def test_reports_are_written_with_the_process_umask(tmp_path: Path) -> None:
    """Not mkstemp's 0600: a CI step of another user must read the artefacts it uploads."""
    report = tmp_path / "r.json"
    old = os.umask(0o022)
    try:
        assert main(["check", "--max-examples", "2", "--no-scenarios", "--quiet", "--report", str(report)]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(report.stat().st_mode) == 0o644


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["bmc", "--depth", "-1"], "--depth must be at least 1, not -1"),
        (["prove", "--max-k", "-1"], "--max-k must be at least 1, not -1"),
        (["explore", "--blocks", "1000000000"], "--blocks must be at most 32"),
        (["bmc", "--blocks", "1000000000"], "--blocks must be at most 32"),
        (["explore", "--blocks", "2", "--requests", "1000000000"], "--requests must be at most 16"),
    ],
)
def test_formal_commands_check_their_bounds_first(argv: list[str], said: str, capsys) -> None:  # type: ignore[no-untyped-def]
    assert said in one_line_exit_2(capsys, argv)


def test_a_vllm_events_line_nested_too_deep_is_its_own_line_in_one_line(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "deep.jsonl"
    deep = '{"seq": 1, "ts": 2.0, "events": ' + "[" * 100_000 + "]" * 100_000 + "}"
    config = json.dumps({"config": {"block_size": 16, "num_gpu_blocks": 64}})
    log.write_text("\n".join([config, json.dumps({"seq": 0, "ts": 1.0, "events": []}), deep]) + "\n")
    err = one_line_exit_2(capsys, ["trace", "check", str(log), "--format", "vllm-events"])
    assert err == f"kvspec: {log}:3: not JSON the kit reads: nested too deeply\n"


def test_a_block_id_beyond_64_bits_is_a_malformed_line(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "side.jsonl"
    header = {"kvspec_side_table": 1, "source": "x", "block_size": 4}
    alloc = {"event": "block_allocated", "seq": 1, "step": 0, "block_id": 10**40, "ref_count": 1, "state": "allocated"}
    log.write_text(json.dumps(header) + "\n" + json.dumps(alloc) + "\n")
    err = one_line_exit_2(capsys, ["trace", "check", str(log)])
    assert "field 'block_id' must be a 64-bit integer, not one of 41 digits" in err


@pytest.mark.parametrize("command", [["check"], ["replay", "CASE"], ["explore"], ["gate"]])
def test_a_step_timeout_below_the_round_trip_is_refused(command: list[str], case: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    err = one_line_exit_2(capsys, [str(case) if a == "CASE" else a for a in command] + ["--step-timeout", "0.01"])
    assert "--step-timeout must be at least 0.1 s" in err


def long_case(path: Path, count: int) -> Path:
    """A case of ``count`` random valid ops on a pool of 16 blocks of 4 tokens."""
    from kvspec.spec import Config
    from kvspec.spec.ledger import LedgerModel
    from kvspec.spec.ops import Semantics
    from kvspec.traces.record import RandomOps

    config = Config(capacity=16, block_size=4)
    model, ops = LedgerModel(config, Semantics()), []
    draw = RandomOps(1, config, frozenset({"admit", "append", "release", "preempt", "resume"}), "block").next
    for _ in range(count):
        op = draw(model.observe())
        model.step(op)
        ops.append(op.to_json())
    case = {"kvspec_case": 1, "adapter": "reference", "config": {"capacity": 16, "block_size": 4}, "ops": ops}
    path.write_text(json.dumps({**case, "expected": {}}))
    return path


def test_show_draws_a_long_case_as_the_window_up_to_its_first_violation(tmp_path: Path) -> None:
    """3,000 ops whose adapter breaks at step 50: the picture is the 40 ops up to it (it took minutes drawn whole),
    labelled with their own step numbers, and the violation with its true step."""
    case = long_case(tmp_path / "long.json", 3000)
    out = tmp_path / "long.svg"
    run = kvspec("show", str(case), "--adapter", "faulty_adapters:FreeOffAfter50", "--out", str(out), limit=120)
    assert run.code == 0 and "VIOLATED at step 50" in run.out, run.out + run.err
    svg = out.read_text()
    assert "ops 11 to 50 drawn" in svg and "step 50: capacity_conservation" in svg
    assert "50. " in svg and "10. " not in svg and "51. " not in svg


@pytest.mark.parametrize("command", [["replay"], ["trace", "check"], ["show", "--out", "x.svg"]])
def test_a_fifo_with_no_writer_is_refused_not_waited_on(command: list[str], tmp_path: Path) -> None:
    fifo = tmp_path / "case.json"
    os.mkfifo(fifo)
    run = kvspec(*command, str(fifo), cwd=tmp_path, limit=30)
    assert run.code == 2 and "not a regular file but a FIFO" in run.err and run.err.count("\n") == 1, run.err
