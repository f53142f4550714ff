"""The verdict on one trace, shared by every format: per invariant held, violated or unknown.

A trace is checked line by line and stops at the first violation: the state
after a broken step is not one the spec can say anything about. The result
names that violation with its line number, the event, and the lines before it;
every other invariant keeps the count of lines it was checked on.
"""

from __future__ import annotations

import json
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvspec.report import ExitCode, Report, Status, now, rows

from .lines import Line
from .quality import TraceQuality
from .seen import Watch


@dataclass(frozen=True)
class TraceOptions:
    """What the command line says about the pool where the log does not (``--capacity``, ``--policy``).

    ``capacity``: usable blocks in the pool (vLLM's num_gpu_blocks less its null block).
    Formats that cannot use an option ignore it (docs/traces.md says which read them).
    """

    capacity: int | None = None
    policy: str | None = None


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
    started_at: str = field(default_factory=now)
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
    interrupted: bool = False
    # Events a check could not judge (invariant -> how many), and event names the format does not know.
    unjudged: Counter[str] = field(default_factory=Counter)
    unknown_events: Counter[str] = field(default_factory=Counter)
    quality: TraceQuality | None = None

    @property
    def status(self) -> Status:
        if self.interrupted:
            return "interrupted"
        if self.error:
            return "error"
        return "violated" if self.violation is not None else "passed"

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.of(self.status)

    def _first_violation(self, name: str) -> dict[str, Any] | None:
        v = self.violation
        if v is not None and name in v.failures:
            return v.to_json() | {"problems": v.failures[name][:5]}
        return self.later_violations.get(name)

    def report(self) -> Report:
        """The check as the kit's report, with a ``trace`` section for where it came from."""
        reasons = {
            inv.name: self.unknown_reasons.get(inv.name, "not exercised by this trace") for inv in self.invariants
        }
        firsts = {inv.name: first for inv in self.invariants if (first := self._first_violation(inv.name)) is not None}
        error = self.error
        if error and self.error_line is not None:
            error = f"line {self.error_line}: {error}"
        findings: list[dict[str, Any]] = []
        if self.quality is not None:
            findings.append({"kind": "trace_quality", "format": self.fmt, **self.quality.to_json()})
        if self.unknown_events:
            findings.append(
                {
                    "kind": "unknown_events",
                    "message": "events of names this format does not know: counted, not judged",
                    "events": dict(sorted(self.unknown_events.items())),
                }
            )
        return Report(
            adapter=self.adapter,
            findings=findings,
            rows=rows([(inv.name, inv.kind) for inv in self.invariants], self.checked, firsts, reasons=reasons),
            adapter_version=self.adapter_version,
            profile="trace",
            started_at=self.started_at,
            duration_s=self.duration_s,
            examples=1,
            steps=self.steps,
            status=self.status,
            error=error,
            coverage=self.coverage,
            sections={
                "trace": {
                    "path": self.path,
                    "format": self.fmt,
                    "lines": self.lines,
                    "error_line": self.error_line,
                    "violated": None if self.violation is None else self.violation.invariant,
                    "violated_line": None if self.violation is None else self.violation.line,
                    "unjudged": dict(sorted(self.unjudged.items())),
                    "unknown_events": dict(sorted(self.unknown_events.items())),
                    "quality": None if self.quality is None else self.quality.to_json(),
                }
            },
            title=f"kvspec trace check: {self.path} ({self.fmt}), adapter {self.adapter or '-'}",
            details=self._details(),
        )

    def _details(self) -> list[str]:
        """What the table says below the verdicts: lines replayed, coverage, the first violation in context."""
        lines = ["", f"{self.lines} lines, {self.steps} steps replayed"]
        if self.coverage:
            lines.append("exercised: " + ", ".join(f"{k} {v}" for k, v in sorted(self.coverage.items())))
        if self.unknown_events:
            lines.append(
                "unknown events (counted, not judged): "
                + ", ".join(f"{k} {v}" for k, v in sorted(self.unknown_events.items()))
            )
        if self.unjudged:
            lines.append(
                "events a check could not judge: " + ", ".join(f"{k} {v}" for k, v in sorted(self.unjudged.items()))
            )
        if self.quality is not None:
            lines += ["", *self.quality.lines()]
        v = self.violation
        if v is not None:
            lines += ["", f"VIOLATED {v.invariant} at line {v.line} (step {v.step}):"]
            lines += [f"  {n:>6}  {text}" for n, text in v.context]
            lines.append(f"  {v.line:>6}> {json.dumps(v.event)}")
            for name, problems in v.failures.items():
                lines += [f"  {name}: {p}" for p in problems[:3]]
        return lines


class Judge:
    """Counts each invariant's checks line by line and keeps the first violation.

    ``judge`` takes one line's results (invariant name -> None when it did not
    apply, else its problems, empty when it held) and returns True when the line
    broke something, so that the caller stops replaying.
    """

    def __init__(
        self,
        result: TraceResult,
        lines: Sequence[Line],
        context: int = 3,
        options: TraceOptions | None = None,
        watch: Watch | None = None,
    ) -> None:
        self.result, self.context = result, context
        self.options = options or TraceOptions()
        self.watch = watch  # a picture wants each line's state: formats call it when it is set
        self._position = {line.number: i for i, line in enumerate(lines)}
        self._lines = lines
        self._order = [inv.name for inv in result.invariants]
        self.current: int | None = None
        self._recent: deque[Line] = deque(maxlen=context)  # a streamed trace's last lines, for the context
        result.lines = len(lines)

    def reset_lines(self, lines: Sequence[Line]) -> None:
        """The trace turned out to be read whole after all (a streaming format fell back)."""
        self._position = {line.number: i for i, line in enumerate(lines)}
        self._lines = lines
        self.result.lines = len(lines)

    def passed(self, line: Line) -> None:
        """A streamed line was replayed: it is context for what comes next, and counted."""
        self._recent.append(line)
        if not self._lines:
            self.result.lines += 1

    def unknown(self, name: str, reason: str) -> None:
        """Say why ``name`` cannot be judged on this trace (shown while it has no checks)."""
        self.result.unknown_reasons.setdefault(name, reason)

    def cannot_judge(self, name: str, reason: str) -> None:
        """One event that ``name`` could not judge (counted in the report), and why, while it has no verdict."""
        self.result.unjudged[name] += 1
        self.unknown(name, reason)

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
        if self._lines:
            at = self._position.get(line.number, 0)
            before = list(self._lines[max(0, at - self.context) : at])
        else:  # streamed: the lines replayed just before this one
            before = [b for b in self._recent if b.number < line.number]
            self.result.lines += 1
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
