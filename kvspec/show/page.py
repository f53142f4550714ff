"""Self-contained HTML pages: one case's timeline, and a whole run's report.

A page needs nothing but itself: styles are inline, pictures are inline SVG, there is
no script, and a Content-Security-Policy forbids loading anything, so it reads the
same from a CI artefact opened offline as on the machine that wrote it. Every case's
timeline is an element ``<figure class="timeline" id="case-N">``.
"""

from __future__ import annotations

import html
import json
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from kvspec.report import Report, status_line
from kvspec.spec import Op
from kvspec.vllm_env import vllm_version

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
STYLE = """
body { font-family: sans-serif; margin: 1.5em; color: #222; max-width: 100em; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.85em; } td, th { border: 1px solid #ddd; padding: 2px 8px; }
th { background: #f4f4f4; text-align: left; } td.n { text-align: right; }
.held { color: #1a7f37; } .violated { color: #d62728; font-weight: bold; } .unknown { color: #777; }
.status-passed { color: #1a7f37; } .status-violated, .status-error, .status-interrupted { color: #d62728; }
figure.timeline, figure.overview { margin: 1em 0; overflow-x: auto; }
figure.timeline svg, figure.overview svg { display: block; }
pre { font-size: 0.8em; background: #f8f8f8; padding: 0.5em; overflow-x: auto; }
.legend span { display: inline-block; padding: 1px 6px; margin-right: 6px; border: 1px solid #bbb; font-size: 0.8em; }
"""
LEGEND = (
    '<p class="legend"><span style="background:#9ecae1">held by a request: r x ref_count (# cached)</span>'
    '<span style="background:#a8d5a2">cached, unreferenced</span><span style="background:#f2f2f2">free</span>'
    "<span>//// evicted, \\\\\\\\ reclaimed in that op</span><span>&rarr; shared (a request took a reference)</span>"
    '<span style="border:2px solid #d62728">where the invariant broke</span>'
    '<span style="border:2px dashed #ff7f0e">differs between the spec and the adapter</span></p>'
)


@dataclass(frozen=True)
class Shown:
    """One case as a page shows it: where it came from, its ops, its timeline (SVG) or why there is none."""

    name: str
    ops: Sequence[Op] | Sequence[str]  # a trace's: its drawn lines' labels
    svg: str = ""
    verdict: str = ""
    problem: str = ""  # why no timeline could be drawn
    overview: str = ""  # a long trace: every line as a pixel column (SVG), the drawn window marked


def versions(adapter: str = "", adapter_version: str = "") -> dict[str, str]:
    """What produced a page: the kit, Python, matplotlib, vLLM where installed, and the adapter."""
    found = {"kvspec": _version("kvspec"), "python": platform.python_version(), "matplotlib": _version("matplotlib")}
    vllm = vllm_version()
    if vllm is not None:
        found["vllm"] = vllm
    if adapter:
        found["adapter"] = f"{adapter} {adapter_version}".strip()
    return found


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _e(value: object) -> str:
    return html.escape(str(value))


def _page(title: str, body: list[str]) -> str:
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
            f"<title>{_e(title)}</title><style>{STYLE}</style></head><body>",
            *body,
            "</body></html>",
            "",
        ]
    )


def _table(pairs: Mapping[str, object]) -> str:
    rows = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in pairs.items())
    return f"<table>{rows}</table>"


def _case(index: int, shown: Shown) -> str:
    ops = "\n".join(op.replace("\n", " ") if isinstance(op, str) else f"{i:>3}. {op}" for i, op in enumerate(shown.ops))
    parts = [f'<h3 id="case-{index}-title">{_e(shown.name)}</h3>']
    if shown.verdict:
        parts.append(f'<p class="{"violated" if "VIOLATED" in shown.verdict else "held"}">{_e(shown.verdict)}</p>')
    if shown.overview:
        parts.append(f'<figure class="overview" id="case-{index}-overview">{shown.overview}</figure>')
    if shown.svg:
        parts.append(f'<figure class="timeline" id="case-{index}">{shown.svg}</figure>')
    else:
        parts.append(f'<p class="unknown" id="case-{index}">no timeline: {_e(shown.problem)}</p>')
    parts.append(f"<details><summary>ops ({len(shown.ops)})</summary><pre>{_e(ops)}</pre></details>")
    return "\n".join(parts)


def case_page(shown: Shown, about: Mapping[str, str]) -> str:
    """A page of one case: its timeline, its verdict, its ops, and what drew it."""
    return _page(
        f"kvspec show: {shown.name}",
        [f"<h1>kvspec show: {_e(shown.name)}</h1>", LEGEND, _case(0, shown), "<h2>Versions</h2>", _table(about)],
    )


def report_page(
    report: Report,
    cases: Sequence[Shown],
    about: Mapping[str, str],
    *,
    coverage_svg: str = "",
    quality_svg: str = "",
) -> str:
    """A whole run: the verdict table, coverage, policy quality, every case with its timeline, and what ran."""
    run = {
        "adapter": f"{report.adapter} {report.adapter_version}".strip(),
        "profile": report.profile,
        "seed": "derandomized" if report.seed is None else report.seed,
        "started at": report.started_at,
        "duration": f"{report.duration_s:.1f} s",
        "examples": report.examples,
        "steps": report.steps,
    }
    body = [
        f"<h1>{_e(report.title or 'kvspec report')}</h1>",
        f'<p class="status-{_e(report.status)}" id="status">{_e(status_line(report.status, report.error))}</p>',
        _table(run),
        "<h2>Verdicts</h2>",
        _verdicts(report),
        "<h2>Coverage</h2>",
        _coverage(report.coverage, coverage_svg),
        *_quality(report.findings, quality_svg),
        *_findings(report.findings),
        f"<h2>Cases ({len(cases)})</h2>",
        LEGEND if any(c.svg for c in cases) else "",
        *(_case(i, shown) for i, shown in enumerate(cases)),
        *_sections(report),
        "<h2>Versions</h2>",
        _table(about),
    ]
    return _page(report.title or "kvspec report", [b for b in body if b])


def _verdicts(report: Report, prefix: str = "") -> str:
    head = "<tr><th>invariant</th><th>kind</th><th>verdict</th><th>steps</th><th>first violation / reason</th></tr>"
    rows = []
    for row in report.rows:
        first = row.first_violation
        if first is not None:
            problems = "; ".join(str(p) for p in first.get("problems", [])[:3])
            detail = f"step {first.get('step')}: {json.dumps(first.get('op'))}: {problems}"
            if row.violations is not None:  # counted to the end (a trace check without --first)
                v = row.violations
                more = " ..." if v.count > len(v.lines) else ""
                detail += f" ({v.count} violating line(s): {', '.join(map(str, v.lines))}{more})"
        else:
            detail = row.reason or ""
        rows.append(
            f'<tr id="{prefix}verdict-{_e(row.name)}"><td>{_e(row.name)}</td><td>{_e(row.kind)}</td>'
            f'<td class="{row.verdict}">{row.verdict}</td><td class="n">{row.checked_steps}</td>'
            f"<td>{_e(detail)}</td></tr>"
        )
    return f'<table id="{prefix}verdicts">{head}{"".join(rows)}</table>'


def _coverage(coverage: Mapping[str, int], svg: str) -> str:
    if not coverage:
        return "<p>nothing was exercised</p>"
    rows = "".join(
        f'<tr><td>{_e(k)}</td><td class="n">{v}</td></tr>' for k, v in sorted(coverage.items(), key=lambda kv: -kv[1])
    )
    chart = f'<figure id="coverage-chart">{svg}</figure>' if svg else ""
    return f'{chart}<details><summary>as a table</summary><table id="coverage">{rows}</table></details>'


def _quality(findings: Sequence[Mapping[str, Any]], svg: str) -> list[str]:
    quality = next((f for f in findings if f.get("kind") == "policy_quality"), None)
    if quality is None:
        return []
    figures = {k: v for k, v in quality.items() if k not in ("kind", "message", "series")}
    chart = f'<figure id="quality-chart">{svg}</figure>' if svg else ""
    return ["<h2>Policy quality</h2>", f"<p>{_e(quality.get('message', ''))}</p>", _table(figures), chart]


def _findings(findings: Sequence[Mapping[str, Any]]) -> list[str]:
    shown = [f for f in findings if f.get("kind") != "policy_quality"]
    if not shown:
        return []
    items = "".join(f"<li><b>{_e(f.get('kind'))}</b>: {_e(f.get('message') or f.get('problems'))}</li>" for f in shown)
    return ["<h2>Findings</h2>", f"<ul>{items}</ul>"]


def _sections(report: Report) -> list[str]:
    """A kind of check's own sections (trace, live, formal, ...), as the JSON writes them."""
    if not report.sections:
        return []
    return ["<h2>Details</h2>", f"<pre>{_e(json.dumps(report.sections, indent=1, default=str))}</pre>"]


@dataclass(frozen=True)
class GatePart:
    """One adapter through the gate, as its page shows it: its verdict on the baseline, its run, its new cases."""

    report: Report
    status: str
    counts: Mapping[str, object]  # new, known, fixed, and which
    cases: Sequence[Shown]


def gate_page(title: str, status: str, parts: Sequence[GatePart], about: Mapping[str, str]) -> str:
    """The gate as one page: its status line, then per adapter its verdict on the baseline, its verdict table,
    and each new violation's case drawn (known violations are listed, not drawn: they fail nothing)."""
    body = [f"<h1>{_e(title)}</h1>", f'<p id="status">{_e(status)}</p>']
    if any(c.svg for part in parts for c in part.cases):
        body.append(LEGEND)
    index = 0
    for k, part in enumerate(parts):
        report = part.report
        body += [
            f'<h2 id="adapter-{k}">{_e(report.adapter)} {_e(report.adapter_version)}: '
            f'<span class="status-{_e(part.status)}">{_e(part.status)}</span></h2>',
            _table({**part.counts, "profile": report.profile, "examples": report.examples, "steps": report.steps}),
            _verdicts(report, f"a{k}-"),
            f"<h3>New violations ({len(part.cases)})</h3>",
        ]
        for shown in part.cases:
            body.append(_case(index, shown))
            index += 1
    body += ["<h2>Versions</h2>", _table(about)]
    return _page(title, body)


__all__ = ["GatePart", "Shown", "case_page", "gate_page", "report_page", "versions"]
