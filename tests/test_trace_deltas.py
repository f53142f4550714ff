"""Version-2 kvspec traces: deltas between full snapshots, read back exactly, checked as a stream.

A delta trace must give the checker the same observations as a full one (the verdicts and checks
agree, and each delta applied to the observation before is the observation after); a delta that
does not fit the observation before is exit 2 with one line; and the streaming check keeps a
bounded number of observations and lines, however long the trace (counted, not timed).
"""

from __future__ import annotations

import json
import weakref
from pathlib import Path
from typing import Any

import pytest

from kvspec.cli import main
from kvspec.traces import check_trace, kvspec_format
from kvspec.traces import lines as lines_module
from kvspec.traces.trace_delta import Base, diff


def record(tmp_path: Path, name: str, steps: int, every: int, capacity: int = 16) -> Path:
    out = tmp_path / name
    argv = ["trace", "record", "--adapter", "reference", "--seed", "3", "--steps", str(steps)]
    argv += ["--capacity", str(capacity), "--snapshot-every", str(every), "--out", str(out)]
    assert main(argv) == 0
    return out


def load(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_delta_trace_gives_the_checker_the_same_observations_as_a_full_one(tmp_path: Path) -> None:
    full, deltas = record(tmp_path, "full.jsonl", 120, 1), record(tmp_path, "delta.jsonl", 120, 10)
    full_lines, delta_lines = load(full), load(deltas)
    assert full_lines[0]["kvspec_trace"] == 1 and delta_lines[0]["kvspec_trace"] == 2
    assert delta_lines[0]["snapshot_every"] == 10
    assert [("observation" in line, "delta" in line) for line in delta_lines[1:4]] == [
        (True, False),
        (False, True),
    ] * 1 + [(False, True)]
    base = Base(delta_lines[0]["observation"])
    for number, (whole, line) in enumerate(zip(full_lines[1:], delta_lines[1:], strict=True), start=2):
        assert line["op"] == whole["op"]
        got = base.apply(line["delta"], number) if "delta" in line else line["observation"]
        if "observation" in line:
            base.reset(line["observation"])
        assert kvspec_format.observation_from_json(got) == kvspec_format.observation_from_json(whole["observation"])
    assert deltas.stat().st_size < full.stat().st_size / 2
    a, b = check_trace(full, "auto"), check_trace(deltas, "auto")
    assert a.exit_code == b.exit_code == 0 and a.checked == b.checked and a.steps == b.steps == 120


def test_diff_and_apply_round_trip_on_changes_of_every_kind() -> None:
    before = {
        "capacity": 8,
        "free": 6,
        "objects": [{"oid": 1, "tokens": 4}, {"oid": 2, "tokens": 4}],
        "requests": [{"req": "a", "objects": [1]}],
        "index": [[[1, 2], [1]]],
    }
    after = {
        "capacity": 8,
        "free": 5,
        "objects": [{"oid": 2, "tokens": 3}, {"oid": 3, "tokens": 1}],
        "requests": [],
        "index": None,
    }
    delta = diff(before, after)
    assert delta["objects"] == {"put": [{"oid": 2, "tokens": 3}, {"oid": 3, "tokens": 1}], "drop": [1]}
    assert Base(before).apply(delta, 2) == after
    assert diff(after, after) == {}


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda d: d.setdefault("objects", {"put": [], "drop": []})["drop"].append({"no": "such oid"}),
        lambda d: d.update({"objects": {"put": [{"size": 1}], "drop": []}}),
        lambda d: d.update({"colour": "blue"}),
    ],
    ids=["drops-an-absent-object", "puts-an-object-without-oid", "unknown-field"],
)
def test_a_corrupted_delta_cannot_be_checked_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], corrupt: Any
) -> None:
    path = record(tmp_path, "t.jsonl", 30, 10)
    lines = load(path)
    corrupt(lines[5]["delta"])
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    capsys.readouterr()
    assert main(["trace", "check", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"kvspec: {path}:6: malformed delta"), err


def test_a_delta_in_a_version_1_trace_is_refused(tmp_path: Path) -> None:
    path = record(tmp_path, "t.jsonl", 12, 4)
    lines = load(path)
    lines[0]["kvspec_trace"] = 1
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = check_trace(path, "kvspec")
    assert result.exit_code == 2 and "version 1" in result.error


def test_the_streaming_check_retains_a_bounded_number_of_observations_and_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The most observations and trace lines alive at once while checking: the same for 40 and 240 steps."""
    alive = {"observations": 0, "lines": 0}
    most = dict(alive)

    def counted(kind: str, make: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            made = make(*args, **kwargs)
            alive[kind] += 1
            most[kind] = max(most[kind], alive[kind])
            weakref.finalize(made, lambda: alive.__setitem__(kind, alive[kind] - 1))
            return made

        return wrapper

    monkeypatch.setattr(
        kvspec_format, "observation_from_json", counted("observations", kvspec_format.observation_from_json)
    )
    monkeypatch.setattr(lines_module, "parse_line", counted("lines", lines_module.parse_line))

    peaks = []
    for steps in (40, 240):
        path = record(tmp_path, f"t{steps}.jsonl", steps, 16)
        for kind in most:
            most[kind] = alive[kind] = 0
        result = check_trace(path, "kvspec")
        assert result.exit_code == 0 and result.steps == steps, result.error
        peaks.append(dict(most))
    assert peaks[0] == peaks[1] and peaks[1]["observations"] <= 3 and peaks[1]["lines"] <= 8, peaks
