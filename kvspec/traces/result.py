"""The verdict on one trace, shared by every format: per invariant held, violated or unknown.

A trace is checked line by line to its end: after a line that breaks something the format's
replay takes what the line records as its state (docs/traces.md says what each format adopts)
and goes on, so every violation is counted. The result names the first violation with its line
number, the event and the lines before it; each violated invariant carries its count of
violating lines, its first line and a sample of them (:class:`kvspec.report.Violations`); every
invariant keeps the count of lines it was checked on. With ``first`` (``--first``) the check
stops at the first violating line instead, and the report is the one it always was.
"""

from __future__ import annotations

import json
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvspec.report import SAMPLE_LINES, ExitCode, Report, Status, Violations, now, rows

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
class Tally:
    """The lines that broke one invariant: how many, the first, and the first :data:`SAMPLE_LINES` of them."""

    count: int = 0
    lines: list[int] = field(default_factory=list)
    last: int | None = None

    def add(self, line: int) -> None:
        """One more violating line (a line that breaks the invariant twice counts once)."""
        if line == self.last:
            return
        self.count += 1
        self.last = line
        if len(self.lines) < SAMPLE_LINES:
            self.lines.append(line)

    def violations(self) -> Violations:
        return Violations(self.count, self.lines[0], tuple(self.lines))


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
    # The first violation of each invariant first broken after the line of ``violation``: name -> first.
    later_violations: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Each violated invariant's violating lines, counted to the end of the trace (not with ``first``).
    tallies: dict[str, Tally] = field(default_factory=dict)
    first: bool = False  # --first: the check stopped at the first violating line; the report carries no counts
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
        counts = {} if self.first else {name: tally.violations() for name, tally in self.tallies.items() if tally.count}
        return Report(
            adapter=self.adapter,
            findings=findings,
            rows=rows(
                [(inv.name, inv.kind) for inv in self.invariants],
                self.checked,
                firsts,
                reasons=reasons,
                violations={name: counts[name] for name in firsts if name in counts},
            ),
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
        lines += self._counts()
        v = self.violation
        if v is not None:
            lines += ["", f"VIOLATED {v.invariant} at line {v.line} (step {v.step}):"]
            lines += [f"  {n:>6}  {text}" for n, text in v.context]
            lines.append(f"  {v.line:>6}> {json.dumps(v.event)}")
            for name, problems in v.failures.items():
                lines += [f"  {name}: {p}" for p in problems[:3]]
        return lines

    def _counts(self) -> list[str]:
        """Each violated invariant's count of violating lines, its first line and the first lines (not --first)."""
        names = [inv.name for inv in self.invariants]
        counted = sorted(
            ((name, tally) for name, tally in self.tallies.items() if tally.count and self._first_violation(name)),
            key=lambda item: names.index(item[0]) if item[0] in names else len(names),
        )
        if self.first or not counted:
            return []
        width = max(len(name) for name, _ in counted)
        out = ["", f"violations to the end of the trace (lines that broke each invariant; the first {SAMPLE_LINES}):"]
        for name, tally in counted:
            more = " ..." if tally.count > len(tally.lines) else ""
            sample = ", ".join(str(n) for n in tally.lines)
            out.append(f"  {name.ljust(width)}  {tally.count:>7} line(s), first line {tally.lines[0]}: {sample}{more}")
        return out


class Judge:
    """Counts each invariant's checks line by line, keeps the first violation and counts every later one.

    ``judge`` takes one line's results (invariant name -> None when it did not
    apply, else its problems, empty when it held) and returns True when the line
    broke something. With ``first`` (``--first``) the caller then stops replaying;
    without it, the caller takes what the line records as its state (the format's
    adoption, docs/traces.md) and goes on. ``watch`` is called by
    the formats for each line up to and including the first violating one (a picture
    shows the trace up to there), and no more after it.
    """

    def __init__(
        self,
        result: TraceResult,
        lines: Sequence[Line],
        context: int = 3,
        options: TraceOptions | None = None,
        watch: Watch | None = None,
        *,
        first: bool = False,
    ) -> None:
        self.result, self.context = result, context
        self.options = options or TraceOptions()
        self.watch = watch  # a picture wants each line's state: formats call it when it is set
        self.first = result.first = first
        self._position = {line.number: i for i, line in enumerate(lines)}
        self._lines = lines
        self._order = [inv.name for inv in result.invariants]
        self.current: int | None = None
        self._recent: deque[Line] = deque(maxlen=context)  # a streamed trace's last lines, for the context
        self._counted: int | None = None  # the streamed line counted last (a line judged twice counts once)
        result.lines = len(lines)

    def reset_lines(self, lines: Sequence[Line]) -> None:
        """The trace turned out to be read whole after all (a streaming format fell back)."""
        self._position = {line.number: i for i, line in enumerate(lines)}
        self._lines = lines
        self.result.lines = len(lines)

    def _count(self, line: Line) -> None:
        if not self._lines and line.number != self._counted:
            self._counted = line.number
            self.result.lines += 1

    def passed(self, line: Line) -> None:
        """A streamed line was replayed: it is context for what comes next, and counted."""
        if not self._recent or self._recent[-1].number != line.number:
            self._recent.append(line)
        self._count(line)

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

    def _rank(self, name: str) -> int:
        return self._order.index(name) if name in self._order else len(self._order)

    def _before(self, line: Line) -> list[Line]:
        """The ``context`` lines before ``line``."""
        if self._lines:
            at = self._position.get(line.number, 0)
            return list(self._lines[max(0, at - self.context) : at])
        return [b for b in self._recent if b.number < line.number]  # streamed: the lines replayed just before

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
        result = self.result
        for name in failures:
            result.tallies.setdefault(name, Tally()).add(line.number)
        self._count(line)
        if result.violation is None:
            before = [(b.number, b.text) for b in self._before(line)]
            first = min(failures, key=self._rank)
            result.violation = TraceViolation(
                first,
                line.number,
                step,
                line.data,
                failures[first],
                before,
                {n: failures[n] for n in sorted(failures, key=self._rank)},
            )
            self.watch = None  # a picture ends at the first violation
            return True
        for name, problems in failures.items():  # a later line: the first violation of each invariant not yet broken
            if name not in result.violation.failures and name not in result.later_violations:
                result.later_violations[name] = {
                    "line": line.number,
                    "step": step,
                    "event": line.data,
                    "problems": problems[:5],
                    "context": [{"line": b.number, "text": b.text} for b in self._before(line)],
                }
        return True
