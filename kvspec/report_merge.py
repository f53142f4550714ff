"""Many reports of one kind of check merged into one: the workers of ``kvspec check --workers N``, or the
live checkers of a fleet of serving instances (``kvspec report merge A.json B.json -o M.json``).

The merged report keeps the report contract (kvspec/report.py, kvspec/schemas/report.schema.json):

- **status** and so the exit code: ``violated`` (1) when any part found a violation; else ``error``
  (2) when any part could not run (an error counts above an interruption); else ``interrupted``
  (2) when any part was interrupted; else ``passed`` (0). A part that could not run never hides
  another part's violation, and a merged pass means every part passed.
- **rows**: one per invariant, in the first part's order (names only later parts have come
  after): steps checked summed; the first violation is the first part's (in the parts' order)
  that has one; a row is judged (held) when any part judged it, so an invariant one part never
  exercised and another held reads held.
- **examples, steps, coverage** summed; findings and cases of every part, in order; each part's
  error as ``part i: ...`` (``worker i: ...``); ``started_at`` the earliest; ``duration_s`` as given (a run's wall
  time), else the longest part's.
- a ``workers`` section: one row per part (its seed, status, examples, steps, seconds, the
  invariant it found violated first, its seconds to first failure, its cases, its error), and
  the top-level ``seconds_to_first_failure`` / ``examples_to_first_failure`` of the part that
  failed first in time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvspec.report import REPORT_KEYS, Report, Row, Status

_ORDER: tuple[Status, ...] = ("violated", "error", "interrupted", "passed")
"""Which part's status the merged report takes: the first in this order that any part has."""


def row_from_json(data: Mapping[str, Any]) -> Row:
    """The :class:`Row` a report's ``invariants`` entry was written from (its verdict decides ``applicable``)."""
    verdict = data["verdict"]
    checked = int(data["checked_steps"])
    return Row(
        name=data["name"],
        kind=data["kind"],
        checked_steps=checked,
        first_violation=data.get("first_violation"),
        applicable=verdict != "unknown" or checked == 0,
        reason=data.get("reason"),
    )


def report_from_json(data: Mapping[str, Any]) -> Report:
    """The :class:`Report` a report JSON was written from (keys outside the contract become its sections)."""
    return Report(
        adapter=data["adapter"],
        rows=[row_from_json(row) for row in data["invariants"]],
        adapter_version=data["adapter_version"],
        profile=data["profile"],
        seed=data["seed"],
        started_at=data["started_at"],
        duration_s=float(data["duration_s"]),
        examples=int(data["examples"]),
        steps=int(data["steps"]),
        status=data["status"],
        error=data["error"],
        coverage=dict(data["coverage"]),
        findings=list(data["findings"]),
        cases=list(data["cases"]),
        sections={key: value for key, value in data.items() if key not in REPORT_KEYS and key != "kvspec_report"},
    )


def _one(values: Sequence[str]) -> str:
    """The value every part shares, or each distinct one joined by ', '."""
    return ", ".join(dict.fromkeys(values))


def _rows(parts: Sequence[Report]) -> list[Row]:
    by_name: dict[str, list[Row]] = {}
    for part in parts:
        for row in part.rows:
            by_name.setdefault(row.name, []).append(row)
    merged = []
    for name, same in by_name.items():
        violated = next((row.first_violation for row in same if row.first_violation is not None), None)
        judged = [row for row in same if row.checked_steps and row.applicable]
        reason = next((row.reason for row in same if row.reason is not None), None)
        merged.append(
            Row(
                name=name,
                kind=same[0].kind,
                checked_steps=sum(row.checked_steps for row in same),
                first_violation=violated,
                applicable=bool(judged) or violated is not None or not any(row.checked_steps for row in same),
                reason=None if judged else reason,
            )
        )
    return merged


def _first_violated(part: Report) -> str | None:
    return next((row.name for row in part.rows if row.first_violation is not None), None)


def worker_row(index: int, part: Report) -> dict[str, Any]:
    """What the ``workers`` section says of one part."""
    return {
        "worker": index,
        "seed": part.seed,
        "status": part.status,
        "examples": part.examples,
        "steps": part.steps,
        "duration_s": round(part.duration_s, 3),
        "first_violated": _first_violated(part),
        "seconds_to_first_failure": part.sections.get("seconds_to_first_failure"),
        "examples_to_first_failure": part.sections.get("examples_to_first_failure"),
        "kept_cases": part.sections.get("kept_cases"),
        "cases": list(part.cases),
        "error": part.error,
    }


def merge_reports(
    parts: Sequence[Report],
    *,
    seed: int | None = None,
    duration_s: float | None = None,
    title: str = "",
    sections: Mapping[str, Any] | None = None,
    label: str = "part",
) -> Report:
    """One report of ``parts`` (at least one), by the rules of this module's docstring.

    ``seed``: the merged run's seed (None: the first part's); ``duration_s``: the wall time of the whole
    run (None: the longest part's); ``sections``: added to the merged report's own; ``label``: what the table calls
    a part (``worker`` for ``--workers``).
    """
    if not parts:
        raise ValueError("no reports to merge")
    statuses = {part.status for part in parts}
    status = next(s for s in _ORDER if s in statuses)
    coverage: dict[str, int] = {}
    for part in parts:
        for key, count in part.coverage.items():
            coverage[key] = coverage.get(key, 0) + count
    workers = [worker_row(i, part) for i, part in enumerate(parts)]
    timed = [w for w in workers if w["seconds_to_first_failure"] is not None]
    first = min(timed, key=lambda w: w["seconds_to_first_failure"]) if timed else None
    own: dict[str, Any] = {
        key: value for key, value in parts[0].sections.items() if key in ("engine", "given_cases", "time_budget_s")
    }
    kept = [w["kept_cases"] for w in workers if w["kept_cases"] is not None]
    if kept:
        own["kept_cases"] = max(kept)
    own |= {
        "seconds_to_first_failure": None if first is None else first["seconds_to_first_failure"],
        "examples_to_first_failure": None if first is None else first["examples_to_first_failure"],
        "workers": workers,
        **(sections or {}),
    }
    errors = [f"{label} {i}: {part.error}" for i, part in enumerate(parts) if part.error]
    lines = [""] + [
        f"{label} {w['worker']}"
        + ("" if w["seed"] is None else f" (seed {w['seed']})")
        + f": {w['status']}, {w['examples']} examples, {w['steps']} steps"
        + (f", {w['first_violated']} violated first" if w["first_violated"] else "")
        for w in workers
    ]
    for part in parts:
        lines += [line for line in part.details if line.startswith(("VIOLATED", "  ", "case saved", "finding"))]
    return Report(
        adapter=_one([part.adapter for part in parts]),
        rows=_rows(parts),
        adapter_version=_one([part.adapter_version for part in parts]),
        profile=_one([part.profile for part in parts]),
        seed=parts[0].seed if seed is None else seed,
        started_at=min(part.started_at for part in parts),
        duration_s=max(part.duration_s for part in parts) if duration_s is None else duration_s,
        examples=sum(part.examples for part in parts),
        steps=sum(part.steps for part in parts),
        status=status,
        error="; ".join(errors),
        coverage=coverage,
        findings=[finding for part in parts for finding in part.findings],
        cases=[case for part in parts for case in part.cases],
        sections=own,
        title=title or f"kvspec: {len(parts)} reports merged ({_one([part.adapter for part in parts])})",
        details=lines,
    )


__all__ = ["merge_reports", "report_from_json", "row_from_json", "worker_row"]
