"""`kvspec trace check` and `trace record` keep the kit's contract on any input: one test per defect found.

The contract: exit 0 every invariant held, 1 a violation, 2 the command could not run, with one line
on stderr (``kvspec: FILE:LINE: what is wrong``) and never a traceback. A malformed value is exit 2
naming its line, never a verdict, and the report (when asked for) is strict JSON with status error.
"""

from __future__ import annotations

import errno
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvspec import jsonio
from kvspec.cli import main
from kvspec.report import Report

DATA = Path(__file__).parent / "data"
KVSPEC_GOOD = DATA / "traces" / "reference_kvspec.jsonl"
SIDE_GOOD = DATA / "traces" / "reference_side_table.jsonl"
SHARED_AWARE = DATA / "traces" / "shared_aware_side_table.jsonl"
VLLM_GOOD = DATA / "vllm_live_cpu.jsonl"

Lines = list[dict[str, Any]]


def load(path: Path) -> Lines:
    return [json.loads(line) for line in path.read_text().split("\n") if line.strip()]


def write(tmp_path: Path, lines: Lines, name: str = "trace.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def check(
    tmp_path: Path, path: Path, fmt: str, capsys: pytest.CaptureFixture[str]
) -> tuple[int, dict[str, Any] | None, str]:
    """``kvspec trace check``: the exit code, the report (strict JSON; None when none was written), stderr."""
    report = tmp_path / "report.json"
    report.unlink(missing_ok=True)
    code = main(["trace", "check", str(path), "--format", fmt, "--report", str(report)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, jsonio.load(report) if report.exists() else None, err


def assert_could_not_run(code: int, report: dict[str, Any] | None, err: str, where: str) -> None:
    """Exit 2, one line on stderr starting ``kvspec: WHERE:``, and a report that says error."""
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith(f"kvspec: {where}:"), err
    assert report is not None and report["status"] == "error", report
    assert not any(row["verdict"] == "violated" for row in report["invariants"])


# -- 1. lines are split on \n only ----------------------------------------------------------------


def test_line_separators_inside_json_strings_parse(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """U+2028, U+2029 and U+0085 are valid inside JSON strings; CRLF endings are JSON whitespace.

    Failed before: str.splitlines() cut the line at U+2028 (exit 2, "not JSON").
    """
    lines = load(SIDE_GOOD)
    lines[2]["note"] = "paragraph\u2028line\u2029next\u0085line"
    text = "".join(json.dumps(line, ensure_ascii=False) + "\r\n" for line in lines)
    path = tmp_path / "separators.jsonl"
    path.write_bytes(text.encode())
    code, report, err = check(tmp_path, path, "side-table", capsys)
    assert code == 0 and report is not None and report["steps"] == len(lines) - 1, err
    # Line numbers count \n-separated lines: a broken line 6 after the separators is reported as line 6.
    broken = text.split("\n")
    broken[5] = "{not json"
    path.write_bytes("\n".join(broken).encode())
    code, report, err = check(tmp_path, path, "side-table", capsys)
    assert_could_not_run(code, report, err, f"{path}:6")
    assert report is not None and report["trace"]["error_line"] == 6


# -- 2. a line that is not UTF-8 is exit 2 with its number -----------------------------------------


def test_line_that_is_not_utf8_names_its_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Failed before: the whole file failed to decode (no line number: "cannot read ... utf-8 codec")."""
    raw = SIDE_GOOD.read_bytes().split(b"\n")
    raw[3] = raw[3].replace(b'"state"', b'"st\xffate"')
    path = tmp_path / "latin.jsonl"
    path.write_bytes(b"\n".join(raw))
    code, report, err = check(tmp_path, path, "side-table", capsys)
    assert_could_not_run(code, report, err, f"{path}:4")
    assert "UTF-8" in err and report is not None and report["trace"]["error_line"] == 4


# -- 3. strict JSON: no NaN or Infinity, no deep nesting -------------------------------------------

NOT_STRICT_JSON = {
    "NaN": "NaN",
    "Infinity": "Infinity",
    "-Infinity": "-Infinity",
    "overflowing": "1e999",
    "nested-deeply": "[" * 200 + "]" * 200,
    "nested-past-the-parser": "[" * 100_000 + "]" * 100_000,
    "lone-surrogate": '"\\ud800"',
}


@pytest.mark.parametrize("value", NOT_STRICT_JSON.values(), ids=NOT_STRICT_JSON.keys())
@pytest.mark.parametrize("field", ["ts", "vendor_extension"])
def test_values_that_are_not_strict_json_name_their_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str, field: str
) -> None:
    """Failed before: a NaN ts compared false with every other ts and the log passed (exit 0); a lone
    surrogate passed too, and one in the header's source crashed printing the table (UnicodeEncodeError)."""
    text = SHARED_AWARE.read_text().split("\n")
    line = json.loads(text[4])
    line[field] = "@"
    text[4] = json.dumps(line).replace('"@"', value)
    path = tmp_path / "nan.jsonl"
    path.write_text("\n".join(text))
    code, report, err = check(tmp_path, path, "side-table", capsys)
    assert_could_not_run(code, report, err, f"{path}:5")
    assert report is not None and report["trace"]["error_line"] == 5


# -- 4. a value of the wrong type is exit 2 with its line, never a verdict --------------------------


def to(value: Any) -> Callable[[Any], Any]:
    return lambda _old: value


def each(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda old: [convert(x) for x in old]


def _first(path: Path, test: Callable[[dict[str, Any]], bool]) -> int:
    return next(i for i, line in enumerate(load(path)) if test(line))


KV, SIDE, VLLM = (KVSPEC_GOOD, "kvspec"), (SHARED_AWARE, "side-table"), (VLLM_GOOD, "vllm-events")
_ADMIT = _first(KVSPEC_GOOD, lambda line: line.get("op", {}).get("op") == "admit")
_RELEASE = _first(KVSPEC_GOOD, lambda line: line.get("op", {}).get("op") == "release")
_EVICTED = _first(SHARED_AWARE, lambda line: line.get("event") == "block_evicted")
_RANKED = _first(SHARED_AWARE, lambda line: line.get("event") == "eviction_candidates_ranked")
_REQUEST = _first(VLLM_GOOD, lambda line: "request" in line)
_METRICS = _first(VLLM_GOOD, lambda line: "metrics" in line)
_CONFIG = _first(VLLM_GOOD, lambda line: "config" in line)
_BATCH = _first(VLLM_GOOD, lambda line: "seq" in line)

# (trace, format, line index, the place of the value in that line, what it becomes)
WRONG_TYPES: dict[str, tuple[Path, str, int, tuple[str | int, ...], Callable[[Any], Any]]] = {
    "kvspec tokens as strings": (*KV, _ADMIT, ("op", "tokens"), each(str)),
    "kvspec tokens as floats": (*KV, _ADMIT, ("op", "tokens"), each(float)),
    "kvspec tokens as booleans": (*KV, _ADMIT, ("op", "tokens"), each(lambda t: t > 1)),
    "kvspec tokens as one string": (*KV, _ADMIT, ("op", "tokens"), lambda t: "".join(map(str, t))),
    "kvspec req as a number": (*KV, _ADMIT, ("op", "req"), lambda r: int(r[1:])),
    "kvspec keep as a string": (*KV, _RELEASE, ("op", "keep"), to("no")),
    "kvspec message as a number": (*KV, _ADMIT, ("outcome", "message"), to(0)),
    "kvspec capacity as a float": (*KV, 0, ("config", "capacity"), float),
    "kvspec capacity as a boolean": (*KV, 0, ("config", "capacity"), to(True)),
    "kvspec block_size as a float": (*KV, 0, ("config", "block_size"), float),
    "kvspec capacity negative": (*KV, 0, ("config", "capacity"), to(-6)),
    "kvspec capacity absurd": (*KV, 0, ("config", "capacity"), to(2**62)),
    "kvspec header version true": (*KV, 0, ("kvspec_trace",), to(True)),
    "kvspec anchor blocks as a string": (*KV, 0, ("semantics", "admission_anchor_blocks"), to("2")),
    "kvspec observed tokens as strings": (*KV, _ADMIT, ("observation", "requests", 0, "tokens"), each(str)),
    "kvspec index as an object": (*KV, _ADMIT, ("observation", "index"), to({"ab": 1})),
    "side num_blocks as a float": (*SIDE, 0, ("num_blocks",), float),
    "side num_blocks absurd": (*SIDE, 0, ("num_blocks",), to(2**62)),
    "side header version true": (*SIDE, 0, ("kvspec_side_table",), to(True)),
    "side unknown policy": (*SIDE, 0, ("policy",), to("fifo")),
    "side source as a number": (*SIDE, 0, ("source",), to(7)),
    "side unknown eviction reason": (*SIDE, _EVICTED, ("reason",), to("gc")),
    "side unknown event": (*SIDE, 3, ("event",), to("block_teleported")),
    "side protected as a string": (*SIDE, _RANKED, ("candidates", 0, "protected"), to("no")),
    "side retain_score as a string": (*SIDE, _RANKED, ("candidates", 0, "retain_score"), str),
    "vllm prompt tokens as strings": (*VLLM, _REQUEST, ("request", "prompt_token_ids"), each(str)),
    "vllm cached_tokens as a float": (*VLLM, _REQUEST, ("request", "cached_tokens"), float),
    "vllm started as a string": (*VLLM, _REQUEST, ("request", "started"), str),
    "vllm preempted as a string": (*VLLM, _REQUEST, ("request", "preempted"), to("no")),
    "vllm idle as a string": (*VLLM, _METRICS, ("metrics", "idle"), to("yes")),
    "vllm num_gpu_blocks absurd": (*VLLM, _CONFIG, ("config", "num_gpu_blocks"), to(2**62)),
    "vllm hash_algo as a number": (*VLLM, _CONFIG, ("config", "hash_algo"), to(256)),
    "vllm block hash as a float": (*VLLM, _BATCH, ("events", -1, "block_hashes"), each(float)),
    "vllm ts too large for a float": (*VLLM, _BATCH, ("ts",), to(10**400)),
}


@pytest.mark.parametrize(("path", "fmt", "at", "place", "change"), WRONG_TYPES.values(), ids=WRONG_TYPES.keys())
def test_value_of_the_wrong_type_names_its_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    path: Path,
    fmt: str,
    at: int,
    place: tuple[str | int, ...],
    change: Callable[[Any], Any],
) -> None:
    """Failed before: tokens as strings were read as ints (exit 0 PASSED); an unknown policy left
    policy_conformance unknown (exit 0); a float capacity was rounded down."""
    lines = load(path)
    target: Any = lines[at]
    for key in place[:-1]:
        target = target[key]
    key = place[-1]
    target[key] = change(target.get(key) if isinstance(target, dict) else target[key])
    bad = write(tmp_path, lines)
    code, report, err = check(tmp_path, bad, fmt, capsys)
    assert_could_not_run(code, report, err, f"{bad}:{at + 1}")
    assert report is not None and report["trace"]["error_line"] == at + 1


# -- 5. NaN and Infinity never reach the report --------------------------------------------------


def test_report_is_strict_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Failed before: a violated line carrying 1e999 put Infinity in first_violation.event (not JSON),
    and Report.write_json wrote NaN where a writer passed one."""
    text = SHARED_AWARE.read_text().split("\n")
    evicted = json.loads(text[_EVICTED])
    evicted["ref_count"] = 5  # a violation on this line: the recorded ref_count disagrees with the replay
    text[_EVICTED] = json.dumps(evicted)[:-1] + ', "weight": 1e999}'
    path = tmp_path / "inf.jsonl"
    path.write_text("\n".join(text))
    code, report, err = check(tmp_path, path, "side-table", capsys)  # check() reads the report strictly
    assert_could_not_run(code, report, err, f"{path}:{_EVICTED + 1}")
    out = tmp_path / "nan-report.json"
    with pytest.raises(ValueError):
        Report(adapter="x", rows=[], findings=[{"ratio": float("nan")}]).write_json(out)
    assert not out.exists()


# -- 6. a trace of another format, an empty file, a missing file, a folder --------------------------

OTHER_FORMAT = [
    (SIDE_GOOD, "kvspec"),
    (VLLM_GOOD, "kvspec"),
    (KVSPEC_GOOD, "side-table"),
    (VLLM_GOOD, "side-table"),
    (KVSPEC_GOOD, "vllm-events"),
    (SIDE_GOOD, "vllm-events"),
]


@pytest.mark.parametrize(("path", "fmt"), OTHER_FORMAT, ids=[f"{p.stem}-as-{f}" for p, f in OTHER_FORMAT])
def test_trace_of_another_format_is_not_a_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], path: Path, fmt: str
) -> None:
    """Failed before: exit 0 PASSED on a kvspec trace read as vllm-events (its header has a config)."""
    code, report, err = check(tmp_path, path, fmt, capsys)
    assert_could_not_run(code, report, err, str(path))
    assert f"nothing in this file is a {fmt} record" in err


def _empty(tmp_path: Path) -> Path:
    (tmp_path / "empty.jsonl").write_text("")
    return tmp_path / "empty.jsonl"


def _blank(tmp_path: Path) -> Path:
    (tmp_path / "blank.jsonl").write_text("\n  \n\r\n")
    return tmp_path / "blank.jsonl"


def _folder(tmp_path: Path) -> Path:
    (tmp_path / "folder").mkdir()
    return tmp_path / "folder"


NO_TRACE: dict[str, Callable[[Path], Path]] = {
    "empty": _empty,
    "blank": _blank,
    "missing": lambda tmp_path: tmp_path / "missing.jsonl",
    "folder": _folder,
}


@pytest.mark.parametrize("fmt", ["auto", "kvspec"])
@pytest.mark.parametrize("make", NO_TRACE.values(), ids=NO_TRACE.keys())
def test_no_trace_is_exit_2_with_a_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Callable[[Path], Path], fmt: str
) -> None:
    """Failed before: with --format auto an empty file exited 2 without writing the report it was asked for."""
    path = make(tmp_path)
    code, report, err = check(tmp_path, path, fmt, capsys)
    assert_could_not_run(code, report, err, str(path))


def test_unwritable_report_is_exit_2_before_the_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Failed before: a --report under a file raised NotADirectoryError after the check (a traceback)."""
    (tmp_path / "file").write_text("")
    code = main(["trace", "check", str(SIDE_GOOD), "--report", str(tmp_path / "file" / "report.json")])
    captured = capsys.readouterr()
    assert code == 2 and captured.err.count("\n") == 1 and "report" in captured.err, captured.err
    assert "PASSED" not in captured.out


# -- 7. trace record: a malformed --ops file, an unwritable --out, an atomic write ---------------

BAD_OPS = {
    "not JSON": "{",
    "not an object": "[]",
    "ops not a list": '{"ops": 3}',
    "op not an object": '{"ops": [[1]]}',
    "unknown op": '{"ops": [{"op": "teleport"}]}',
    "tokens as strings": '{"ops": [{"op": "admit", "req": "a", "tokens": ["1", "2"]}]}',
    "tokens as floats": '{"ops": [{"op": "admit", "req": "a", "tokens": [1.5]}]}',
    "req as a number": '{"ops": [{"op": "admit", "req": 1, "tokens": [1]}]}',
    "keep as a string": '{"ops": [{"op": "release", "req": "a", "keep": "no"}]}',
    "NaN": '{"ops": [{"op": "admit", "req": "a", "tokens": [NaN]}]}',
    "capacity overflowing": '{"config": {"capacity": 1e999}, "ops": []}',
    "capacity as a float": '{"config": {"capacity": 4.5}, "ops": []}',
    "block_size true": '{"block_size": true, "ops": []}',
}


@pytest.mark.parametrize("text", BAD_OPS.values(), ids=BAD_OPS.keys())
def test_record_rejects_a_malformed_ops_file(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    """Failed before: tokens ["1", "2"] were read as ints (exit 0) and capacity 1e999 raised OverflowError."""
    ops = tmp_path / "ops.json"
    ops.write_text(text)
    out = tmp_path / "out.jsonl"
    code = main(["trace", "record", "--ops", str(ops), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and str(ops) in err and "Traceback" not in err, err
    assert not out.exists()


def _under_a_file(tmp_path: Path) -> Path:
    (tmp_path / "file").write_text("")
    return tmp_path / "file" / "out.jsonl"


@pytest.mark.parametrize("make", [_folder, _under_a_file], ids=["a folder", "under a file"])
def test_record_checks_out_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Callable[[Path], Path]
) -> None:
    """Failed before: the adapter ran first, then writing raised IsADirectoryError (a traceback).

    The adapter named here does not exist: the --out error comes first, so --out was checked first.
    """
    out = make(tmp_path)
    code = main(["trace", "record", "--adapter", "no-such-adapter", "--out", str(out), "--steps", "3"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and str(out) in err and "adapter" not in err, err


class _DiskFull(io.TextIOWrapper):
    """A text file that takes half of what is written to it, then fails as a full disk would."""

    def write(self, text: str) -> int:
        super().write(text[: len(text) // 2])
        self.flush()
        raise OSError(errno.ENOSPC, "No space left on device")


class _DiskFullBytes(io.RawIOBase):
    """A binary file that takes half of what is written to it, then fails as a full disk would."""

    def __init__(self, handle: Any) -> None:
        super().__init__()
        self.handle = handle

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.handle.write(bytes(data)[: len(data) // 2])
        self.handle.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    def close(self) -> None:
        self.handle.close()
        super().close()


def test_record_writes_the_trace_atomically(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails half-way leaves the trace that was there whole and exits 2 with one line.

    Failed before: the trace was written in place (truncated to half) and the OSError was a traceback.
    """
    out = tmp_path / "out.jsonl"
    assert main(["trace", "record", "--out", str(out), "--steps", "5"]) == 0
    before = out.read_bytes()
    real_open = io.open

    def half_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = real_open(file, mode, *args, **kwargs)
        if "w" not in mode:
            return handle
        return _DiskFullBytes(handle) if "b" in mode else _DiskFull(handle.detach(), encoding="utf-8")

    monkeypatch.setattr(io, "open", half_open)
    code = main(["trace", "record", "--out", str(out), "--steps", "9"])
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and str(out) in err and "Traceback" not in err, err
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]
