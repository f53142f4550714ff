"""Counterexamples a person can look at: block timelines of cases, and a run's report as one HTML page.

``kvspec show CASE --out case.svg|png|html`` replays a case on the spec (and on an adapter)
and draws objects over ops (:mod:`.replay`, :mod:`.timeline`, :mod:`.draw`); ``--html`` of
``kvspec check`` and the pytest plugin write :func:`write_report_html`. matplotlib draws;
it is the ``show`` extra and imported only when something is drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kvspec import jsonio
from kvspec.adapter import AdapterFactory
from kvspec.case import Case
from kvspec.report import Report
from kvspec.spec import Semantics

from .draw import FORMATS, Picture, draw, matplotlib_missing
from .page import GatePart, Shown, case_page, gate_page, report_page, versions
from .replay import Broken, Run, replay, semantics_of
from .timeline import Timeline, timelines
from .trace_run import TraceCheck


def picture(
    case: Case,
    factory: AdapterFactory | None = None,
    *,
    semantics: Semantics | None = None,
    refine: bool = True,
    step_timeout: float | None = 30.0,
    title: str = "",
    prefix: str = "",
) -> tuple[list[Run], list[Timeline], Picture]:
    """Replay ``case`` on the spec (under ``semantics``, or the adapter's) and on the adapter when given; draw it."""
    runs = replay(case, factory, default=semantics, refine=refine, step_timeout=step_timeout)
    grids = timelines(runs)
    return runs, grids, draw(grids, case.ops, title=title, prefix=prefix)


def verdict(runs: Sequence[Run]) -> str:
    """One line: where the adapter's replay broke, or that every invariant held."""
    broken = runs[-1].broken
    if broken is None:
        return f"every invariant held on {len(runs[-1].ops)} ops ({runs[-1].label})"
    return f"VIOLATED at step {broken.step} ({runs[-1].label}): {broken.message}"


def shown(
    name: str,
    case: Case,
    factory: AdapterFactory | None,
    *,
    refine: bool = True,
    step_timeout: float | None = 30.0,
    prefix: str = "",
) -> Shown:
    """A case as a report page shows it; a replay that could not run is said, not raised."""
    try:
        runs, _, pic = picture(case, factory, refine=refine, step_timeout=step_timeout, prefix=prefix)
    except Exception as exc:  # the adapter could not start again: the page still has the rest
        return Shown(name, case.ops, problem=f"the replay could not run: {type(exc).__name__}: {exc}")
    return Shown(name, case.ops, pic.svg(), verdict(runs))


def write_case(path: Path, name: str, runs: Sequence[Run], pic: Picture) -> None:
    """Write the picture as ``path``'s suffix says: .svg, .png, or a self-contained .html page."""
    if path.suffix == ".html":
        label = runs[-1].label
        about = versions(label)
        page = case_page(Shown(name, runs[0].ops, pic.svg(), verdict(runs)), about)
        jsonio.write_text(path, page)
    else:
        pic.save(path)


def report_html(report: Report, cases: Sequence[Shown]) -> str:
    """The run as one page: verdicts, coverage, policy quality, the cases as given (drawn or said why not)."""
    from .plots import coverage_chart, quality_chart

    quality = next((f for f in report.findings if f.get("kind") == "policy_quality" and f.get("series")), None)
    return report_page(
        report,
        cases,
        versions(report.adapter, report.adapter_version),
        coverage_svg=coverage_chart(report.coverage).svg() if report.coverage else "",
        quality_svg=quality_chart(quality["series"]).svg() if quality is not None else "",
    )


def load_shown(
    index: int, name: str, factory: AdapterFactory | None, *, refine: bool = True, step_timeout: float | None = 30.0
) -> Shown:
    """A saved case drawn (replayed on the adapter) by its path, or a live run's recorded log drawn as a trace;
    a file that cannot be read is said, not raised."""
    if name.endswith(".jsonl"):
        return recorded_log(index, Path(name))
    try:
        case = Case.load(Path(name))
    except (OSError, ValueError) as exc:
        return Shown(name, [], problem=f"the case file could not be read: {exc}")
    return shown(name, case, factory, refine=refine, step_timeout=step_timeout, prefix=f"c{index}")


def recorded_log(index: int, path: Path, *, name: str = "") -> Shown:
    """A live run's recorded log (vLLM's KV events, requests and gauges) checked and drawn as a trace."""
    from . import trace_run as trace

    return trace.shown(trace.check(path, "vllm-events"), prefix=f"c{index}", name=name or str(path))


def write_report_html(
    path: Path,
    report: Report,
    factory: AdapterFactory | None,
    *,
    refine: bool = True,
    step_timeout: float | None = 30.0,
    logs: Sequence[Path] = (),
) -> None:
    """The run as one page, every saved case drawn: a case replayed on the adapter, a live run's recorded log
    (a ``.jsonl`` case, and each of ``logs``: what ``--record`` kept) drawn from what the server published."""
    names = [*report.cases, *map(str, logs)]
    cases = [load_shown(i, name, factory, refine=refine, step_timeout=step_timeout) for i, name in enumerate(names)]
    jsonio.write_text(path, report_html(report, cases))


def write_trace_html(path: Path, traced: TraceCheck) -> None:
    """A checked trace as one page: its verdicts, coverage and findings, and its timeline (the failing window, or
    the whole trace when it holds; a long one also as an overview of every line)."""
    from . import trace_run as trace

    jsonio.write_text(path, report_html(traced.result.report(), [trace.shown(traced, prefix="c0")]))


__all__ = [
    "FORMATS",
    "GatePart",
    "gate_page",
    "versions",
    "load_shown",
    "Broken",
    "draw",
    "replay",
    "timelines",
    "Picture",
    "Run",
    "Shown",
    "Timeline",
    "matplotlib_missing",
    "picture",
    "semantics_of",
    "recorded_log",
    "report_html",
    "shown",
    "TraceCheck",
    "verdict",
    "write_case",
    "write_report_html",
    "write_trace_html",
]
