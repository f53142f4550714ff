"""Class 3 (exit code 1 is reserved for violations): everything else a user can get wrong is exit 2 with one
line on stderr (``kvspec: FILE: what is wrong``) and no traceback: malformed case files, pools too large to
build, output paths that cannot be written (checked before the run), adapter modules that fail to import,
bad option values; and in the pytest plugin, a failing item with the reason, not an INTERNALERROR."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvspec.cli import main
from kvspec.spec.ops import MAX_CAPACITY

GOOD_CASE = {
    "kvspec_case": 1,
    "adapter": "reference",
    "config": {"capacity": 4, "block_size": 2, "bytes_per_token": 1},
    "ops": [{"op": "admit", "req": "r0", "tokens": [1, 2, 3]}, {"op": "release", "req": "r0"}],
    "expected": {},
}


def _with(path: str, value: object) -> str:
    """GOOD_CASE with the value at ``path`` (``config.capacity``, ``ops.0.tokens``) replaced, as JSON text."""
    case = json.loads(json.dumps(GOOD_CASE))
    *parents, last = path.split(".")
    node = case
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is KeyError:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return json.dumps(case)


MALFORMED: dict[str, str] = {
    "not JSON": "{'kvspec_case': 1",
    "not an object": "[1, 2, 3]",
    "empty": "",
    "NaN": _with("ops.0.tokens", [1, 2]).replace("2]", "NaN]"),
    "Infinity": _with("config.capacity", 4).replace('"capacity": 4', '"capacity": Infinity'),
    "deeply nested": "[" * 100_000 + "]" * 100_000,
    "ops missing": _with("ops", KeyError),
    "ops null": _with("ops", None),
    "ops an object": _with("ops", {}),
    "op null": _with("ops.0", None),
    "op a number": _with("ops.0.op", 7),
    "capacity a string": _with("config.capacity", "4"),
    "capacity a float": _with("config.capacity", 4.5),
    "capacity null": _with("config.capacity", None),
    "capacity zero": _with("config.capacity", 0),
    "capacity too large to build": _with("config.capacity", MAX_CAPACITY + 1),
    "capacity a list": _with("config.capacity", [4]),
    "tokens a string": _with("ops.0.tokens", "1,2,3"),
    "token a string": _with("ops.0.tokens", [1, "2"]),
    "token a float": _with("ops.0.tokens", [1, 2.5]),
    "keep a string": _with("ops.1.keep", "true"),
    "config missing": _with("config", KeyError),
    "schema version": _with("kvspec_case", 2),
    "req a number": _with("ops.0.req", 7),
}


def _one_line_error(err: str, where: str) -> None:
    assert "Traceback" not in err, err[-600:]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"kvspec: {where}"), err


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_a_malformed_case_file_could_not_run(kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    case = tmp_path / "case.json"
    case.write_text(MALFORMED[kind])
    assert main(["replay", str(case), "--adapter", "reference"]) == 2
    _one_line_error(capsys.readouterr().err, str(case))


def test_a_pool_too_large_to_build_is_refused_before_it_is_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t.jsonl"
    assert main(["trace", "record", "--capacity", str(MAX_CAPACITY + 1), "--out", str(out)]) == 2
    assert "capacity" in capsys.readouterr().err and not out.exists()


def _unwritable(tmp_path: Path) -> dict[str, list[str]]:
    folder = tmp_path / "a-folder"
    folder.mkdir()
    under_a_file = tmp_path / "a-file"
    under_a_file.write_text("")
    bad, worse = str(folder), str(under_a_file / "x.json")
    return {
        "check --report": ["check", "--report", bad],
        "check --junit": ["check", "--junit", worse],
        "bmc --report": ["bmc", "--blocks", "3", "--depth", "1", "--report", bad],
        "prove --junit": ["prove", "--blocks", "3", "--junit", worse],
        "gpu-check --json": ["gpu-check", "--json", bad],
        "bench policies --json": ["bench", "policies", "--vllm", "off", "--json", worse],
        "bench workloads --out": ["bench", "workloads", "--out", worse],
        "serve-tiny --json": ["serve-tiny", "--json", bad],
        "trace check --report": ["trace", "check", str(Path(__file__).parent / "data/traces/reference_kvspec.jsonl"),
                                 "--report", bad],
        "trace record --out": ["trace", "record", "--out", worse],
    }  # fmt: skip


@pytest.mark.parametrize(
    "name",
    [
        "check --report",
        "check --junit",
        "bmc --report",
        "prove --junit",
        "gpu-check --json",
        "bench policies --json",
        "bench workloads --out",
        "serve-tiny --json",
        "trace check --report",
        "trace record --out",
    ],
)
def test_an_output_path_that_cannot_be_written_is_refused_before_the_run(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _unwritable(tmp_path)[name]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not list((tmp_path / "a-folder").iterdir()), "nothing ran, nothing was written"


BROKEN_MODULES = {
    "syntax": "def Factory(:\n",
    "raises": "raise RuntimeError('the engine's config is missing')\n",
    "exits": "import sys\nsys.exit(3)\n",
}


@pytest.mark.parametrize("kind", list(BROKEN_MODULES))
@pytest.mark.parametrize("command", ["check", "replay", "trace record"])
def test_an_adapter_module_that_fails_to_import_could_not_run(
    kind: str, command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = f"broken_{kind}_{command.replace(' ', '_')}"
    (tmp_path / f"{module}.py").write_text(BROKEN_MODULES[kind])
    monkeypatch.syspath_prepend(str(tmp_path))
    adapter = f"{module}:Factory"
    case = tmp_path / "case.json"
    case.write_text(json.dumps(GOOD_CASE))
    argv = {
        "check": ["check", "--adapter", adapter, "--quiet"],
        "replay": ["replay", str(case), "--adapter", adapter],
        "trace record": ["trace", "record", "--adapter", adapter, "--out", str(tmp_path / "t.jsonl")],
    }[command]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert module in err


@pytest.mark.parametrize(
    "option", [["--step-timeout", "0"], ["--step-timeout", "-1"], ["--step-timeout", "nan"],
               ["--step-timeout", "inf"], ["--max-examples", "0"], ["--max-examples", "-3"]],
)  # fmt: skip
def test_bad_option_values_could_not_run(option: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", *option]) == 2
    _one_line_error(capsys.readouterr().err, option[0])


def test_the_plugin_fails_the_item_of_an_adapter_that_does_not_import(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(brokenalloc="raise RuntimeError('no engine here')\n")
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest("--kvspec-adapter=brokenalloc:Factory")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*no engine here*"])
    assert "INTERNALERROR" not in result.stdout.str()
