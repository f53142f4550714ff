"""Rendering a check's result: the conformance table, the JSON report, JUnit XML."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Protocol

from .conformance import Result


def table(result: Result) -> str:
    """The conformance table: invariant x kind x verdict x steps it was checked on."""
    rows = result.verdicts()
    width = max(len(r["name"]) for r in rows)
    seed = "derandomized" if result.seed is None and result.profile == "ci" else f"seed {result.seed}"
    lines = [
        f"kvspec check: adapter {result.adapter} {result.adapter_version}, profile {result.profile}, {seed}",
        "",
        f"  {'invariant'.ljust(width)}  {'kind':<10}  {'verdict':<8}  {'steps':>7}",
        f"  {'-' * width}  {'-' * 10}  {'-' * 8}  {'-' * 7}",
    ]
    for r in rows:
        lines.append(f"  {r['name'].ljust(width)}  {r['kind']:<10}  {r['verdict']:<8}  {r['checked_steps']:>7}")
    rate = result.tally.steps / result.duration_s if result.duration_s else 0.0
    tally = result.tally
    lines += ["", f"{tally.examples} examples, {tally.steps} steps in {result.duration_s:.1f} s ({rate:.0f} steps/s)"]
    if result.given_cases:
        lines.append(f"the first {result.given_cases} examples were the bounded model's coverage cases")
    if tally.first_failure_at is not None:
        lines.append(f"first failure after {tally.first_failure_at[0]} examples; the rest were shrinking")
    cov = result.tally.coverage
    if cov:
        lines.append("exercised: " + ", ".join(f"{k} {v}" for k, v in sorted(cov.items())))
    if result.failure is not None:
        lines += ["", f"VIOLATED {result.failure.invariant} (shrunk to {len(result.failure_ops)} ops):"]
        if result.failure_config is not None:
            lines.append(f"  pool: {json.dumps(result.failure_config.to_json())}")
        for i, op in enumerate(result.failure_ops):
            marker = "  <-- " + ", ".join(sorted(result.failure.failures)) if i == result.failure.step else ""
            lines.append(f"  {i:>3}. {op}{marker}")
        for name, problems in result.failure.failures.items():
            lines += [f"  {name}: {p}" for p in problems[:3]]
    for finding in result.findings:
        lines.append(f"finding ({finding['kind']}): {finding.get('message') or finding.get('problems')}")
    for case in result.cases:
        lines.append(f"case saved: {case}  (replay: kvspec replay {case} --adapter {result.adapter})")
    lines.append(status_line(result.status, result.error))
    return "\n".join(lines)


def status_line(status: str, error: str | None) -> str:
    """The last line of a table: whether every invariant held, and why not."""
    if status == "error":
        return f"ERROR: the check could not run: {error}"
    if status == "interrupted":
        return "INTERRUPTED: the verdicts above cover only what ran"
    return "PASSED: every invariant held" if status == "passed" else "FAILED"


class Verdicts(Protocol):
    """What a JUnit file is written from: the suite's Result and the live runner's result both have it."""

    adapter: str
    status: str
    error: str
    duration_s: float

    def verdicts(self) -> list[dict[str, Any]]: ...


def write_report(result: Result, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.to_json(), indent=2) + "\n")


def write_junit(result: Verdicts, path: Path) -> None:
    """One testcase per invariant: a failure when violated, skipped when unknown."""
    rows = result.verdicts()
    suite = ET.Element(
        "testsuite",
        name=f"kvspec[{result.adapter}]",
        tests=str(len(rows)),
        failures=str(sum(r["verdict"] == "violated" for r in rows)),
        skipped=str(sum(r["verdict"] == "unknown" for r in rows)),
        errors="1" if result.status == "error" else "0",
        time=f"{result.duration_s:.3f}",
    )
    for r in rows:
        case = ET.SubElement(suite, "testcase", classname=f"kvspec.{result.adapter}", name=r["name"])
        if r["verdict"] == "violated":
            failure = ET.SubElement(case, "failure", message=f"{r['name']} violated")
            failure.text = json.dumps(r["first_violation"], indent=1)
        elif r["verdict"] == "unknown":
            ET.SubElement(case, "skipped", message="not exercised or not observable for this adapter")
    if result.status == "error":
        ET.SubElement(suite, "error", message=result.error)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suite).write(path, encoding="unicode", xml_declaration=True)
