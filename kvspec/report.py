"""The kit's external contract: exit codes, verdicts, and the report every check produces.

Every check of the kit (the Hypothesis suite, the live-server runner, trace checking,
bounded model checking and k-induction) ends in one :class:`Report`: a verdict per
invariant, what was exercised, findings and saved cases. It is written as JSON (schema
``kvspec/schemas/report.schema.json``, version :data:`REPORT_SCHEMA`), as JUnit XML (one
testcase per invariant) and as the terminal table; the exit code follows from its status.

Exit codes of every ``kvspec`` command: 0 every invariant held (or, for a measurement, it
ran); 1 a violation was found; 2 the command could not run. A gate must never read 2 as a pass.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import IntEnum
from pathlib import Path
from typing import Any, Literal

from kvspec import jsonio, schemas

REPORT_SCHEMA = 1
"""Version of the report's JSON (its ``kvspec_report`` key); bumped when a key changes meaning."""

REPORT_KEYS: frozenset[str] = frozenset(schemas.schema("report")["required"])
"""The top-level keys every report has (the schema's ``required``); a kind of check may add sections."""

Verdict = Literal["held", "violated", "unknown"]
Status = Literal["passed", "violated", "error", "interrupted"]
STATUSES: tuple[Status, ...] = ("passed", "violated", "error", "interrupted")


class ExitCode(IntEnum):
    """How a ``kvspec`` command ended. ``DONE`` is ``HELD`` for commands that measure rather than judge."""

    HELD = 0
    DONE = 0
    VIOLATED = 1
    COULD_NOT_RUN = 2

    @classmethod
    def of(cls, status: str) -> ExitCode:
        """The exit code of a run's status: passed -> 0, violated -> 1, anything else (error, interrupted) -> 2."""
        return {"passed": cls.HELD, "violated": cls.VIOLATED}.get(status, cls.COULD_NOT_RUN)


def now() -> str:
    """A report's timestamp: UTC, to the second."""
    return datetime.now(UTC).isoformat(timespec="seconds")


SAMPLE_LINES = 10
"""How many violating line numbers a row keeps as its sample (:class:`Violations`): the first ones."""


@dataclass(frozen=True)
class Violations:
    """Every violation of one invariant a check counted to the end of its input (a trace check's lines).

    ``count``: the lines (or places) that broke it; ``first_line``: the first of them; ``lines``: the first
    :data:`SAMPLE_LINES` of them, in order.
    """

    count: int
    first_line: int
    lines: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"violations": self.count, "first_line": self.first_line, "lines": list(self.lines)}


@dataclass(frozen=True)
class Row:
    """One invariant's verdict.

    The one rule every check follows: ``violated`` when a first violation was recorded;
    else ``held`` when it was judged on at least one step and it applies to what was
    checked; else ``unknown`` (never exercised, or not observable here; ``reason`` may say
    which).
    """

    name: str
    kind: str
    checked_steps: int = 0
    first_violation: Mapping[str, Any] | None = None
    applicable: bool = True
    reason: str | None = None
    violations: Violations | None = None  # counted to the end (a trace check without --first); None: not counted

    @property
    def verdict(self) -> Verdict:
        if self.first_violation is not None:
            return "violated"
        return "held" if self.checked_steps and self.applicable else "unknown"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "kind": self.kind,
            "verdict": self.verdict,
            "checked_steps": self.checked_steps,
            "first_violation": None if self.first_violation is None else dict(self.first_violation),
        }
        if self.verdict == "unknown" and self.reason is not None:
            out["reason"] = self.reason
        if self.violations is not None and self.verdict == "violated":
            out.update(self.violations.to_json())
        return out


def rows(
    invariants: Iterable[tuple[str, str]],
    checked: Mapping[str, int],
    first_violation: Mapping[str, Mapping[str, Any]],
    *,
    applicable: Iterable[str] | None = None,
    reasons: Mapping[str, str] | None = None,
    violations: Mapping[str, Violations] | None = None,
) -> list[Row]:
    """The rows of ``invariants`` ((name, kind) pairs, in report order) from per-name counts and first violations.

    ``applicable``: the names that can be judged here (default: all); ``reasons``: why a name may be unknown;
    ``violations``: each violated name's count of violations, where the check counted them.
    """
    judged = None if applicable is None else frozenset(applicable)
    why = reasons or {}
    counted = violations or {}
    return [
        Row(
            name,
            kind,
            checked.get(name, 0),
            first_violation.get(name),
            judged is None or name in judged,
            why.get(name),
            counted.get(name),
        )
        for name, kind in invariants
    ]


def status_line(status: str, error: str | None) -> str:
    """The last line of a table: whether every invariant held, and why not."""
    if status == "error":
        return f"ERROR: the check could not run: {error}"
    if status == "interrupted":
        return "INTERRUPTED: the verdicts above cover only what ran"
    return "PASSED: every invariant held" if status == "passed" else "FAILED"


@dataclass
class Report:
    """What one check found: the verdict table and everything needed to act on it.

    ``sections`` are extra top-level JSON keys of one kind of check (``trace``, ``live``,
    ``formal``, ...); ``title`` and ``details`` are only rendered: the table's first line,
    and the lines between the verdicts and the status line.
    """

    adapter: str
    rows: list[Row]
    adapter_version: str = ""
    profile: str = ""
    seed: int | None = None
    started_at: str = field(default_factory=now)
    duration_s: float = 0.0
    examples: int = 0
    steps: int = 0
    status: Status = "passed"
    error: str = ""
    coverage: Mapping[str, int] = field(default_factory=dict)
    findings: list[dict[str, Any]] = field(default_factory=list)
    cases: list[str] = field(default_factory=list)
    sections: dict[str, Any] = field(default_factory=dict)
    title: str = ""
    details: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.of(self.status)

    def verdicts(self) -> list[dict[str, Any]]:
        """The rows as the JSON writes them."""
        return [row.to_json() for row in self.rows]

    def verdict(self, name: str) -> Verdict:
        return next(row.verdict for row in self.rows if row.name == name)

    def to_json(self) -> dict[str, Any]:
        return {
            "kvspec_report": REPORT_SCHEMA,
            "adapter": self.adapter,
            "adapter_version": self.adapter_version,
            "profile": self.profile,
            "seed": self.seed,
            "started_at": self.started_at,
            "duration_s": round(self.duration_s, 3),
            "examples": self.examples,
            "steps": self.steps,
            "status": self.status,
            "error": self.error,
            "invariants": self.verdicts(),
            "coverage": dict(sorted(self.coverage.items())),
            "findings": self.findings,
            "cases": self.cases,
            **self.sections,
        }

    def table(self) -> str:
        """The conformance table: invariant x kind x verdict x steps it was checked on, then details and status."""
        width = max((len(row.name) for row in self.rows), default=9)
        lines = [
            self.title,
            "",
            f"  {'invariant'.ljust(width)}  {'kind':<10}  {'verdict':<8}  {'steps':>7}",
            f"  {'-' * width}  {'-' * 10}  {'-' * 8}  {'-' * 7}",
        ]
        for row in self.rows:
            why = f"  ({row.reason})" if row.verdict == "unknown" and row.reason else ""
            lines.append(f"  {row.name.ljust(width)}  {row.kind:<10}  {row.verdict:<8}  {row.checked_steps:>7}{why}")
        return "\n".join([*lines, *self.details, status_line(self.status, self.error)])

    def write_json(self, path: Path) -> None:
        """The report as strict JSON (ValueError, and no file, for a NaN or an Infinity), written atomically."""
        jsonio.write(path, self.to_json())

    def junit_suite(self, skip: Mapping[str, str] | None = None) -> ET.Element:
        """One testcase per invariant: a failure when violated, skipped when unknown or named in ``skip``
        (invariant -> why: a gate's known violations)."""
        skip = skip or {}
        failed = [row.verdict == "violated" and row.name not in skip for row in self.rows]
        suite = ET.Element(
            "testsuite",
            name=f"kvspec[{self.adapter}]",
            tests=str(len(self.rows)),
            failures=str(sum(failed)),
            skipped=str(sum(row.verdict == "unknown" or row.name in skip for row in self.rows)),
            errors="1" if self.status == "error" else "0",
            time=f"{self.duration_s:.3f}",
        )
        for row, fails in zip(self.rows, failed, strict=True):
            case = ET.SubElement(suite, "testcase", classname=f"kvspec.{self.adapter}", name=row.name)
            if fails:
                failure = ET.SubElement(case, "failure", message=f"{row.name} violated")
                failure.text = json.dumps(row.first_violation, indent=1)
            elif row.name in skip or row.verdict == "unknown":
                message = skip.get(row.name) or row.reason or "not exercised or not observable for this adapter"
                ET.SubElement(case, "skipped", message=message)
        if self.status == "error":
            ET.SubElement(suite, "error", message=self.error)
        return suite

    def write_junit(self, path: Path) -> None:
        """The JUnit XML of :meth:`junit_suite`, written atomically."""
        text = ET.tostring(self.junit_suite(), encoding="unicode", xml_declaration=True)
        jsonio.write_text(path, text + "\n")

    def write(self, json_path: Path | None = None, junit_path: Path | None = None) -> None:
        """Write the JSON and JUnit files that were asked for."""
        if json_path is not None:
            self.write_json(json_path)
        if junit_path is not None:
            self.write_junit(junit_path)


def report_problems(data: Any) -> list[str]:
    """Every way ``data`` departs from the report schema (empty when it is a valid report)."""
    return schemas.problems(data, "report")


__all__ = [
    "REPORT_KEYS",
    "REPORT_SCHEMA",
    "SAMPLE_LINES",
    "STATUSES",
    "ExitCode",
    "Report",
    "Row",
    "Status",
    "Verdict",
    "Violations",
    "now",
    "report_problems",
    "rows",
    "status_line",
]
