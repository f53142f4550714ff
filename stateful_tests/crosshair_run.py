"""Run CrossHair on the reference simulators' contracts, within a time budget.

The reference modules carry PEP 316 contracts in their docstrings (``inv:``
on the classes, ``pre:``/``post:``/``raises:`` on the public methods).
``crosshair check`` searches symbolically for inputs that satisfy the
preconditions and break an invariant or a postcondition; it prints one
``file:line: error: ...`` line per counterexample and exits 1 when it found any.
This module runs it as a subprocess (CrossHair patches the interpreter while it
works) with a per-condition timeout and a total budget.

Exit codes follow the kit's contract: 0 no counterexample, 1 a counterexample,
2 CrossHair could not run or did not finish within the budget (a gate must not
read an unfinished analysis as a pass).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

REFERENCE_TARGETS: tuple[str, ...] = (
    "kvspec.reference.lifecycle",
    "kvspec.reference.scheduler",
    "kvspec.reference.paged",
)


@dataclass
class CrossHairResult:
    targets: list[str]
    exit_code: int
    seconds: float
    counterexamples: list[str] = field(default_factory=list)
    output: str = ""
    timed_out: bool = False

    @property
    def verdict(self) -> str:
        return {0: "no counterexample", 1: "counterexample found"}.get(self.exit_code, "could not run")


def crosshair_command(targets: Sequence[str], per_condition_timeout: float) -> list[str]:
    """The ``crosshair check`` command line (``python -m crosshair``, so the right interpreter runs it)."""
    return [
        sys.executable,
        "-m",
        "crosshair",
        "check",
        "--per_condition_timeout",
        f"{per_condition_timeout:g}",
        *targets,
    ]


def run_crosshair(
    targets: Sequence[str] = REFERENCE_TARGETS,
    *,
    per_condition_timeout: float = 2.0,
    budget: float = 600.0,
    cwd: str | None = None,
) -> CrossHairResult:
    """Check the contracts of ``targets`` (modules, classes, functions or files); at most ``budget`` seconds."""
    command = crosshair_command(targets, per_condition_timeout)
    t0 = time.monotonic()
    env = dict(os.environ, PYTHONHASHSEED="0")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=budget, cwd=cwd, env=env, check=False)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout if isinstance(exc.stdout, str) else (exc.stdout or b"").decode(errors="replace")
        return CrossHairResult(list(targets), 2, time.monotonic() - t0, _errors(out), out, timed_out=True)
    except OSError as exc:
        return CrossHairResult(list(targets), 2, time.monotonic() - t0, output=str(exc))
    output = done.stdout + done.stderr
    errors = _errors(done.stdout)
    code = 1 if errors else (0 if done.returncode == 0 else 2)
    return CrossHairResult(list(targets), code, time.monotonic() - t0, errors, output)


def _errors(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if ": error: " in line]
