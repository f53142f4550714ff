"""Every command of the CLI: its --help exits 0, and a bad invocation exits 2 with one line on stderr, no traceback.

The commands are listed from the parser itself, so a command added without a case here fails the test.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from kvspec.cli import GROUPS, build_parser, main
from kvspec.report import ExitCode

# One invocation per command that cannot run: bad usage, a missing file, an unknown adapter, a bad size.
ERROR_CASES: dict[str, list[str]] = {
    "check": ["check", "--adapter", "no-such-adapter"],
    "gate": ["gate", "--config", "{tmp}/missing.toml"],
    "baseline add": ["baseline", "add", "{tmp}/missing.json", "--reason", "r", "--baseline", "{tmp}/b.json"],
    "replay": ["replay", "{tmp}/missing.json"],
    "show": ["show", "{tmp}/missing.json", "--out", "{tmp}/case.svg"],
    "adapters": ["adapters", "--bogus"],
    "gpu-check": ["gpu-check", "--repeats", "0"],
    "bmc": ["bmc", "--blocks", "0"],
    "prove": ["prove", "--blocks", "0"],
    "explore": ["explore", "--adapter", "no-such-adapter"],
    "scenarios": ["scenarios", "--blocks", "0"],
    "crosshair": ["crosshair", "no_such_module_for_kvspec", "--budget", "60"],
    "serve-tiny": ["serve-tiny", "--block-size", "0"],
    "bench workloads": ["bench", "workloads", "--out", "{tmp}/w", "--block-size", "0"],
    "bench policies": ["bench", "policies", "--policies", "no-such-policy", "--vllm", "off"],
    "bench live": ["bench", "live", "--pairs", "0"],
    "trace check": ["trace", "check", "{tmp}/missing.jsonl"],
    "trace record": ["trace", "record", "--adapter", "no-such-adapter", "--out", "{tmp}/t.jsonl"],
    "report merge": ["report", "merge", "{tmp}/missing.json", "-o", "{tmp}/m.json"],
    "trace convert": ["trace", "convert", "{tmp}/missing.jsonl", "--to", "side-table", "--out", "{tmp}/s.jsonl"],
}


def commands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every runnable command path of ``parser`` (``("bench", "live")``, ...), from its subparsers."""
    found: list[tuple[str, ...]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += commands(sub, (*prefix, name)) or [(*prefix, name)]
    return found


COMMANDS = [" ".join(path) for path in commands(build_parser())]


def test_every_command_has_an_error_case() -> None:
    assert sorted(COMMANDS) == sorted(ERROR_CASES)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_exits_0(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*command.split(), "--help"])
    assert exit_.value.code == 0
    assert f"usage: kvspec {command}" in capsys.readouterr().out


def test_top_level_help_lists_every_group(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert all(name in out for name in {c.split()[0] for c in COMMANDS})


@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_invocation_could_not_run(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [arg.format(tmp=tmp_path) for arg in ERROR_CASES[command]]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    assert code == ExitCode.COULD_NOT_RUN
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip(), "a command that could not run says why on stderr"


@pytest.mark.parametrize("group", GROUPS)
def test_each_group_registers_the_commands_groups_names(group: str) -> None:
    """``GROUPS`` says which module to import for a command: it must name exactly what the module registers."""
    sub = argparse.ArgumentParser().add_subparsers()
    importlib.import_module(f"kvspec.cli.{group}").register(sub)
    assert tuple(sub.choices) == GROUPS[group]


def test_a_command_imports_only_its_own_group(tmp_path: Path) -> None:
    """A real run of ``kvspec trace check`` in a fresh process: it works without the other groups' modules."""
    log = Path(__file__).parent / "data" / "vllm_live_cpu.jsonl"
    argv = ["trace", "check", str(log), "--format", "vllm-events", "--report", str(tmp_path / "r.json")]
    code = (
        f"import sys\nfrom kvspec.cli import main\ncode = main({argv!r})\n"
        "print(sorted(m for m in sys.modules if m.startswith('kvspec.cli.')))\nsys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "['kvspec.cli.common', 'kvspec.cli.trace']"
    assert (tmp_path / "r.json").exists()
