"""Every option of every command, probed with a malformed value: generated from the parser, so a new option
without a bound fails here. The contract (README: exit codes): exit 2 with one line on stderr and no traceback,
before any work starts. An option whose every value of its type is meaningful says why in ANY_VALUE.

The malformed value by kind: a negative number (and NaN for a float), a path under a regular file (nothing can
be read or written there), a choice that is not one, a value given to a flag that takes none, an empty string.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest
from clirun import kvspec

from kvspec.cli import build_parser

ANY_VALUE: dict[tuple[str, str], str] = {
    ("check", "--seed"): "any integer seeds the run",
    ("gate", "--seed"): "any integer seeds the run",
    ("bench workloads", "--seed"): "any integer seeds the workloads",
    ("bench policies", "--seed"): "any integer seeds the workloads",
    ("bench live", "--seed"): "any integer seeds the workloads",
    ("trace record", "--seed"): "any integer seeds the run",
}
"""Options that take every value of their type, each with the reason."""

# A value each type must refuse: a negative count or length, a number that is not a number.
MALFORMED = {int: ["-1"], float: ["-1", "nan"]}


def numeric_options(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, str, type]]:
    """(command, flag, type) of every int or float option, the subcommands' too."""
    for command, action in options(parser, path):
        if action.type in MALFORMED:
            yield command, long_flag(action), action.type  # type: ignore[misc]


def options(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[str, argparse.Action]]:
    """(command, action) of every option (not --help), the subcommands' too."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from options(sub, (*path, name))
        elif action.option_strings and not isinstance(action, argparse._HelpAction):
            yield " ".join(path), action


def malformed(action: argparse.Action) -> list[str]:
    """The malformed values of an option that is not a number (see the module docstring)."""
    if action.nargs == 0:
        return ["=x"]
    if action.choices is not None:
        return ["=not-a-choice"]
    if action.type is Path:
        return ["=AFILE/x"]
    return ["="] if action.type in (None, str) else []


TESTS = Path(__file__).resolve().parent
LOG = TESTS / "data" / "kvfabric" / "real_2b_cache_pressure_lru_head.jsonl"  # a real KVFabric log
CASE = TESTS / "data" / "show" / "forget-decrement.json"  # a saved case


def required(command: str) -> list[str]:
    """What the command needs besides the probed option: real inputs, so only the probed value can be refused."""
    return {
        "replay": [str(CASE)],
        "show": [str(CASE), "--out", "case.svg"],
        "bench workloads": ["--out", "workloads"],
        "trace check": [str(LOG)],
        "trace convert": [str(LOG), "--from", "kvfabric", "--to", "side-table", "--out", "o.jsonl"],
        "trace record": ["--out", "o.jsonl"],
    }.get(command, [])


def long_flag(action: argparse.Action) -> str:
    """The option as a reader finds it in a message: its first --long spelling."""
    return next(o for o in action.option_strings if o.startswith("--"))


PROBES = [
    (command, flag, value)
    for command, flag, kind in numeric_options(build_parser())
    if (command, flag) not in ANY_VALUE
    for value in MALFORMED[kind]
]


OTHER_ANY_VALUE: dict[tuple[str, str], str] = {}
"""Options other than numbers that take every value (an empty string included), each with the reason."""

OTHER_PROBES = [
    (command, long_flag(action), value)
    for command, action in options(build_parser())
    if action.type not in MALFORMED and (command, long_flag(action)) not in OTHER_ANY_VALUE
    for value in malformed(action)
]


def test_the_probes_cover_every_numeric_option() -> None:
    options = {(c, f) for c, f, _ in numeric_options(build_parser())}
    assert len(options) > 60 and {(c, f) for c, f, _ in PROBES} | set(ANY_VALUE) == options


@pytest.mark.slow
@pytest.mark.parametrize(("command", "flag", "value"), PROBES, ids=[f"{c} {f} {v}" for c, f, v in PROBES])
def test_a_malformed_number_is_refused_in_one_line(command: str, flag: str, value: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    run = kvspec(*command.split(), *required(command), f"{flag}={value}", cwd=tmp_path, limit=30)
    lines = run.err.strip().splitlines()
    assert run.code == 2 and len(lines) == 1 and "Traceback" not in run.err, (run.code, run.err[-1500:])
    assert flag in lines[0], lines  # the message names the option it refuses


@pytest.mark.slow
@pytest.mark.parametrize(("command", "flag", "value"), OTHER_PROBES, ids=[f"{c} {f}{v}" for c, f, v in OTHER_PROBES])
def test_a_malformed_option_is_refused_in_one_line(command: str, flag: str, value: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "AFILE").write_text("")
    given = flag + value.replace("AFILE", str(tmp_path / "AFILE"))
    run = kvspec(*command.split(), *required(command), given, cwd=tmp_path, limit=30)
    lines = run.err.strip().splitlines()
    assert run.code == 2 and len(lines) == 1 and "Traceback" not in run.err, (run.code, run.err[-1500:], run.out[-500:])
