"""The verdict on one trace, shared by every format: per invariant held, violated or unknown.

A trace is checked line by line and stops at the first violation: the state
after a broken step is not one the spec can say anything about. The result
names that violation with its line number, the event, and the lines before it;
every other invariant keeps the count of lines it was checked on.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from kvspec.stateful_tests.conformance import REPORT_SCHEMA

from .lines import Line

Verdict = Literal["held", "violated", "unknown"]
EXIT_HELD, EXIT_VIOLATED, EXIT_COULD_NOT_RUN = 0, 1, 2


@dataclass(frozen=True)
class TraceInvariant:
    """An invariant a format checks. ``kind``: safety, refinement, policy, or trace (the log's own order)."""

    name: str
    kind: str
    doc: str


@dataclass(frozen=True)
class TraceViolation:
    """The first broken invariant: where (line, 0-based step), on what event, with the lines before it."""

    invariant: str
    line: int
    step: int
    event: dict[str, Any]
    problems: list[str]
    context: list[tuple[int, str]]
    failures: dict[str, list[str]]  # every invariant broken on that line, the named one included

    def to_json(self) -> dict[str, Any]:
        return {
            "line": self.line,
            "step": self.step,
            "event": self.event,
            "problems": self.problems[:5],
            "context": [{"line": n, "text": text} for n, text in self.context],
        }


@dataclass
class TraceResult:
    """What a trace check found. ``exit_code`` follows the kit's contract (0 held, 1 violated, 2 could not run)."""

    path: str
    fmt: str
    invariants: tuple[TraceInvariant, ...]
    adapter: str = ""
    adapter_version: str = ""
    started_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    duration_s: float = 0.0
    lines: int = 0
    steps: int = 0
    checked: Counter[str] = field(default_factory=Counter)
    unknown_reasons: dict[str, str] = field(default_factory=dict)
    coverage: Counter[str] = field(default_factory=Counter)
    violation: TraceViolation | None = None
    # Checkers that do not stop at the first violation (the vLLM stream ledger): later ones, name -> first.
    later_violations: dict[str, dict[str, Any]] = field(default_factory=dict)
    error: str = ""
    error_line: int | None = None

    @property
    def status(self) -> str:
        if self.error:
            return "error"
        return "violated" if self.violation is not None else "passed"

    @property
    def exit_code(self) -> int:
        return {"passed": EXIT_HELD, "violated": EXIT_VIOLATED}.get(self.status, EXIT_COULD_NOT_RUN)

    def verdict(self, name: str) -> Verdict:
        if (self.violation is not None and name in self.violation.failures) or name in self.later_violations:
            return "violated"
        return "held" if self.checked.get(name, 0) else "unknown"

    def verdicts(self) -> list[dict[str, Any]]:
        """One row per invariant, in the format's order; an unknown one says why."""
        rows = []
        for inv in self.invariants:
            verdict = self.verdict(inv.name)
            first = None
            if verdict == "violated" and self.violation is not None and inv.name in self.violation.failures:
                first = self.violation.to_json() | {"problems": self.violation.failures[inv.name][:5]}
            elif verdict == "violated":
                first = self.later_violations[inv.name]
            row: dict[str, Any] = {
                "name": inv.name,
                "kind": inv.kind,
                "verdict": verdict,
                "checked_steps": self.checked.get(inv.name, 0),
                "first_violation": first,
            }
            if verdict == "unknown":
                row["reason"] = self.unknown_reasons.get(inv.name, "not exercised by this trace")
            rows.append(row)
        return rows

    def to_json(self) -> dict[str, Any]:
        """The report of `kvspec check` (DESIGN.md), with a ``trace`` section for where it came from."""
        return {
            "kvspec_report": REPORT_SCHEMA,
            "adapter": self.adapter,
            "adapter_version": self.adapter_version,
            "profile": "trace",
            "seed": None,
            "started_at": self.started_at,
            "duration_s": round(self.duration_s, 3),
            "examples": 1,
            "steps": self.steps,
            "status": self.status,
            "error": self.error,
            "invariants": self.verdicts(),
            "coverage": dict(sorted(self.coverage.items())),
            "findings": [],
            "cases": [],
            "trace": {
                "path": self.path,
                "format": self.fmt,
                "lines": self.lines,
                "error_line": self.error_line,
                "violated": None if self.violation is None else self.violation.invariant,
                "violated_line": None if self.violation is None else self.violation.line,
            },
        }

    def table(self) -> str:
        """The conformance table of `kvspec check`, for a trace."""
        rows = self.verdicts()
        width = max((len(r["name"]) for r in rows), default=9)
        lines = [
            f"kvspec trace check: {self.path} ({self.fmt}), adapter {self.adapter or '-'}",
            "",
            f"  {'invariant'.ljust(width)}  {'kind':<10}  {'verdict':<8}  {'steps':>7}",
            f"  {'-' * width}  {'-' * 10}  {'-' * 8}  {'-' * 7}",
        ]
        for r in rows:
            why = f"  ({r['reason']})" if r["verdict"] == "unknown" else ""
            lines.append(
                f"  {r['name'].ljust(width)}  {r['kind']:<10}  {r['verdict']:<8}  {r['checked_steps']:>7}{why}"
            )
        lines += ["", f"{self.lines} lines, {self.steps} steps replayed"]
        if self.coverage:
            lines.append("exercised: " + ", ".join(f"{k} {v}" for k, v in sorted(self.coverage.items())))
        v = self.violation
        if v is not None:
            lines += ["", f"VIOLATED {v.invariant} at line {v.line} (step {v.step}):"]
            lines += [f"  {n:>6}  {text}" for n, text in v.context]
            lines.append(f"  {v.line:>6}> {json.dumps(v.event)}")
            for name, problems in v.failures.items():
                lines += [f"  {name}: {p}" for p in problems[:3]]
        if self.status == "error":
            where = f" at line {self.error_line}" if self.error_line is not None else ""
            lines.append(f"ERROR: the trace could not be checked{where}: {self.error}")
        else:
            lines.append("PASSED: every invariant held" if self.status == "passed" else "FAILED")
        return "\n".join(lines)

    def write_report(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")


class Judge:
    """Counts each invariant's checks line by line and keeps the first violation.

    ``judge`` takes one line's results (invariant name -> None when it did not
    apply, else its problems, empty when it held) and returns True when the line
    broke something, so that the caller stops replaying.
    """

    def __init__(self, result: TraceResult, lines: Sequence[Line], context: int = 3) -> None:
        self.result, self.context = result, context
        self._position = {line.number: i for i, line in enumerate(lines)}
        self._lines = lines
        self._order = [inv.name for inv in result.invariants]
        self.current: int | None = None
        result.lines = len(lines)

    def unknown(self, name: str, reason: str) -> None:
        """Say why ``name`` cannot be judged on this trace (shown while it has no checks)."""
        self.result.unknown_reasons.setdefault(name, reason)

    def at(self, line: Line) -> None:
        """The line being read now, for an error that no format check foresaw."""
        self.current = line.number

    def judge(self, line: Line, step: int, results: Mapping[str, list[str] | None]) -> bool:
        failures: dict[str, list[str]] = {}
        for name, problems in results.items():
            if problems is None:
                continue
            self.result.checked[name] += 1
            if problems:
                failures[name] = list(problems)
        if not failures:
            return False
        first = min(failures, key=lambda n: self._order.index(n) if n in self._order else len(self._order))
        at = self._position.get(line.number, 0)
        before = self._lines[max(0, at - self.context) : at]
        self.result.violation = TraceViolation(
            first,
            line.number,
            step,
            line.data,
            failures[first],
            [(b.number, b.text) for b in before],
            {n: failures[n] for n in sorted(failures, key=lambda n: self._order.index(n) if n in self._order else 99)},
        )
        return True
