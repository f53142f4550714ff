"""``kvspec gate``: check every declared adapter, judge its violations against the baseline, one verdict.

For each adapter, in this order:

1. every baseline entry that applies to it (adapter and version) is replayed: one that still
   breaks its invariant is ``known``, one that no longer does is ``fixed`` (drop it from the
   baseline). The known entry's case is replayed again past each invariant it breaks, until it
   runs clean: every invariant found so is a symptom of the known bug;
2. the suite runs (``check_adapter``) with those symptoms counted but not judged, so the search
   goes on past the known bug; the counterexamples saved by earlier runs in the cases folder are
   replayed first and Hypothesis's example database is consulted first. Any violation found is
   ``new`` and fails the gate. A new bug that breaks only a known bug's invariants stays hidden
   until the known one is fixed; their rows say so (unknown, "a known violation").

Exit code: 1 when any adapter has a new violation; else 2 when any could not be checked
(kvspec's contract: a gate never reads 2 as a pass); else 0.
"""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvspec import jsonio
from kvspec.adapters import AdapterLoadError, load
from kvspec.adapters.isolation import IsolatedAdapter
from kvspec.case import Case
from kvspec.report import ExitCode, Report, Status, now

from .baseline import Baseline, Entry, case_fingerprint
from .config import AdapterRun, GateConfig

GATE_SCHEMA = 1
"""Version of the gate's JSON (its ``kvspec_gate`` key)."""


@dataclass
class AdapterVerdict:
    """One adapter through the gate: its last report, and its violations sorted against the baseline."""

    run: AdapterRun
    report: Report
    known: list[Entry] = field(default_factory=list)
    fixed: list[Entry] = field(default_factory=list)
    new: list[tuple[str, str, str]] = field(default_factory=list)  # (invariant, fingerprint, case path)

    @property
    def status(self) -> Status:
        if self.new:
            return "violated"
        return "passed" if self.report.status in ("passed", "violated") else self.report.status

    def to_json(self) -> dict[str, Any]:
        return {
            "adapter": self.run.name,
            "adapter_version": self.report.adapter_version,
            "status": self.status,
            "new": [{"invariant": i, "fingerprint": f, "case": c} for i, f, c in self.new],
            "known": [_entry_json(e) for e in self.known],
            "fixed": [_entry_json(e) for e in self.fixed],
            "report": self.report.to_json(),
        }


@dataclass
class GateResult:
    """Every adapter's verdict and the gate's."""

    verdicts: list[AdapterVerdict]
    started_at: str
    duration_s: float
    source: str = ""

    @property
    def exit_code(self) -> ExitCode:
        statuses = {v.status for v in self.verdicts}
        if "violated" in statuses:
            return ExitCode.VIOLATED
        return ExitCode.COULD_NOT_RUN if statuses - {"passed"} else ExitCode.HELD

    @property
    def status(self) -> Status:
        return {ExitCode.HELD: "passed", ExitCode.VIOLATED: "violated"}.get(self.exit_code, "error")  # type: ignore[return-value]

    def to_json(self) -> dict[str, Any]:
        return {
            "kvspec_gate": GATE_SCHEMA,
            "status": self.status,
            "source": self.source,
            "started_at": self.started_at,
            "duration_s": round(self.duration_s, 3),
            "adapters": [v.to_json() for v in self.verdicts],
        }

    def status_line(self) -> str:
        """One line for a CI log."""
        new = [f"{v.run.name}: {inv}" for v in self.verdicts for inv, _, _ in v.new]
        errors = [f"{v.run.name}: {v.report.error}" for v in self.verdicts if v.status not in ("passed", "violated")]
        known = sum(len(v.known) for v in self.verdicts)
        fixed = sum(len(v.fixed) for v in self.verdicts)
        head = {"passed": "PASSED", "violated": "FAILED", "error": "COULD NOT RUN"}[self.status]
        parts = [f"{len(new)} new violation{'s' * (len(new) != 1)}" + (f" ({'; '.join(new)})" if new else "")]
        if errors:
            parts.append(f"not checked: {'; '.join(errors)}")
        parts += [f"{known} known", f"{fixed} fixed"]
        return f"kvspec gate: {head}: {', '.join(parts)}; {len(self.verdicts)} adapters in {self.duration_s:.1f} s"

    def markdown(self) -> str:
        """The job-page summary: one row per adapter, then what is new, known and fixed."""
        lines = [
            f"## {self.status_line()}",
            "",
            "| adapter | version | status | new | known | fixed | examples | steps | seconds |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for v in self.verdicts:
            r = v.report
            lines.append(
                f"| {v.run.name} | {r.adapter_version or '-'} | {v.status} | {len(v.new)} | {len(v.known)} | "
                f"{len(v.fixed)} | {r.examples} | {r.steps} | {r.duration_s:.1f} |"
            )
        sections = [
            (
                "New violations (they fail the gate)",
                [
                    f"- **{v.run.name}**: `{inv}` (fingerprint `{fp}`), case `{case}`: `kvspec replay {case}`"
                    for v in self.verdicts
                    for inv, fp, case in v.new
                ],
            ),
            (
                "Known violations (baseline)",
                [
                    f"- **{v.run.name}**: `{e.invariant}` (fingerprint `{e.fingerprint}`): {e.reason}"
                    for v in self.verdicts
                    for e in v.known
                ],
            ),
            (
                "Fixed (remove these entries from the baseline)",
                [
                    f"- **{v.run.name}**: `{e.invariant}` (fingerprint `{e.fingerprint}`): {e.reason}"
                    for v in self.verdicts
                    for e in v.fixed
                ],
            ),
            (
                "Could not be checked",
                [
                    f"- **{v.run.name}**: {v.report.error}"
                    for v in self.verdicts
                    if v.status not in ("passed", "violated")
                ],
            ),
        ]
        for title, items in sections:
            if items:
                lines += ["", f"### {title}", "", *items]
        return "\n".join(lines) + "\n"

    def junit(self) -> str:
        """One testsuite per adapter, one testcase per invariant; a known violation is skipped, a fixed entry passes."""
        suites = ET.Element("testsuites", name="kvspec gate")
        for v in self.verdicts:
            known = {e.invariant: e for e in v.known}
            suite = v.report.junit_suite(skip={inv: f"known: {e.reason}" for inv, e in known.items()})
            for e in v.fixed:
                case = ET.SubElement(suite, "testcase", classname=f"kvspec.{v.run.name}.baseline", name=e.fingerprint)
                ET.SubElement(case, "system-out").text = f"fixed: {e.invariant} no longer breaks; remove the entry"
            suites.append(suite)
        return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def run_gate(config: GateConfig, baseline: Baseline) -> GateResult:
    """Check every adapter ``config`` declares against ``baseline``."""
    from kvspec.stateful_tests import not_started

    t0, started = time.perf_counter(), now()
    verdicts = []
    for run in config.adapters:
        try:
            factory = load(run.name)
        except AdapterLoadError as exc:
            verdicts.append(AdapterVerdict(run, not_started(run.name, _options(run, config), "error", str(exc))))
            continue
        verdicts.append(_check(run, factory, config, baseline))
    source = str(config.source) if config.source is not None else ""
    return GateResult(verdicts, started, time.perf_counter() - t0, source)


def _check(run: AdapterRun, factory: Any, config: GateConfig, baseline: Baseline) -> AdapterVerdict:
    from kvspec.stateful_tests import check_adapter, not_started

    options = _options(run, config)
    known: list[Entry] = []
    fixed: list[Entry] = []
    ignore: frozenset[str] = frozenset()
    if any(entry.adapter == run.name for entry in baseline.entries):  # an adapter is started only to replay them
        try:
            adapter = IsolatedAdapter(factory, run.step_timeout)
        except Exception as exc:
            return AdapterVerdict(run, not_started(run.name, options, "error", f"the adapter could not start: {exc}"))
        try:
            for entry in baseline.for_adapter(run.name, adapter.capabilities.version):
                broken = _broken_by(adapter, entry, refine=not run.safety_only)
                (known if entry.invariant in broken else fixed).append(entry)
                if entry.invariant in broken:
                    ignore |= broken
        finally:
            adapter.close()
    given = tuple(_saved_cases(config.cases_dir, run.name))
    report = check_adapter(factory, run.name, replace(options, ignore=ignore, given_cases=given))
    verdict = AdapterVerdict(run, report, known, fixed)
    if report.status == "violated":
        verdict.new.append(_failure(report) or ("flaky", "", ""))  # a flaky finding with no case: new, unmatched
    return verdict


def _broken_by(adapter: Any, entry: Entry, *, refine: bool) -> frozenset[str]:
    """Every invariant the entry's case breaks: replayed again past each one found, until it runs clean.

    These are the known bug's symptoms; the suite counts them and does not judge them.
    """
    from kvspec.stateful_tests import AdapterHung, Tally, replay_ops

    broken: frozenset[str] = frozenset()
    while True:
        try:
            violation = replay_ops(adapter, entry.case.config, entry.case.ops, Tally(ignored=broken), refine=refine)
        except AdapterHung:
            return broken | {"adapter_contract"}
        if violation is None or not set(violation.failures) - broken:
            return broken
        broken |= set(violation.failures)


def _failure(report: Report) -> tuple[str, str, str] | None:
    """The reported failure's invariant, fingerprint and case path (the last case the run saved)."""
    for path in reversed(report.cases):
        try:
            case = Case.load(Path(path))
        except (OSError, ValueError):
            continue
        if case.expected.get("invariant"):
            return str(case.expected["invariant"]), case_fingerprint(case), path
    return None


def _saved_cases(folder: Path, adapter: str) -> list[Case]:
    """The counterexamples earlier runs saved for ``adapter`` (unreadable files are skipped)."""
    cases = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            case = Case.load(path)
        except (OSError, ValueError):
            continue
        if case.adapter == adapter:
            cases.append(case)
    return cases


def _options(run: AdapterRun, config: GateConfig) -> Any:
    from kvspec.stateful_tests import PROFILES, Options

    return Options(
        profile=PROFILES[run.profile],
        seed=run.seed,
        max_examples=run.max_examples,
        cases_dir=config.cases_dir,
        step_timeout=run.step_timeout,
        refine=not run.safety_only,
        example_db=config.example_db,
        time_budget_s=run.time_budget_s,
    )


def _entry_json(entry: Entry) -> dict[str, Any]:
    return {"invariant": entry.invariant, "fingerprint": entry.fingerprint, "reason": entry.reason}


def gate_html(result: GateResult, factories: dict[str, Any] | None = None) -> str:
    """The gate as one page (kvspec[show]): per adapter its verdict on the baseline and its run's verdicts, each
    new violation's case replayed on the adapter (``factories``: loaded by name when absent) and drawn."""
    from kvspec.show import GatePart, gate_page, load_shown, versions

    parts, index = [], 0
    for v in result.verdicts:
        factory = (factories or {}).get(v.run.name)
        if factory is None and v.new:
            try:
                factory = load(v.run.name)
            except AdapterLoadError:
                factory = None
        cases = []
        for _, _, case in v.new:
            if case:
                cases.append(
                    load_shown(index, case, factory, refine=not v.run.safety_only, step_timeout=v.run.step_timeout)
                )
                index += 1
        counts = {
            "new": "; ".join(f"{inv} ({fp})" for inv, fp, _ in v.new) or "none",
            "known": "; ".join(f"{e.invariant} ({e.reason})" for e in v.known) or "none",
            "fixed": "; ".join(e.invariant for e in v.fixed) or "none",
        }
        parts.append(GatePart(v.report, v.status, counts, cases))
    return gate_page("kvspec gate", result.status_line(), parts, versions())


def write_outputs(result: GateResult, config: GateConfig, summary_env: str | None) -> None:
    """The JSON, JUnit, Markdown and HTML the config asks for; the summary is appended to ``summary_env`` too."""
    if config.html is not None:
        jsonio.write_text(config.html, gate_html(result))
    if config.report is not None:
        jsonio.write(config.report, result.to_json())
    if config.junit is not None:
        jsonio.write_text(config.junit, result.junit())
    text = result.markdown()
    if config.summary is not None:
        jsonio.write_text(config.summary, text)
    if summary_env:
        with open(summary_env, "a", encoding="utf-8") as f:  # GitHub's job summary: appended, as its docs ask
            f.write(text)


__all__ = ["GATE_SCHEMA", "AdapterVerdict", "GateResult", "gate_html", "run_gate", "write_outputs"]
