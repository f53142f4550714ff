"""The HTML pages as a person sees them: rendered by a real headless Chromium (Debian's ``chromium`` package),
driven by Playwright with that browser (``executable_path``: nothing is downloaded).

Without Chromium these tests skip, saying so, unless ``KVSPEC_REQUIRE_BROWSER=1`` (set by .ci/run, which
installs Chromium), where a missing browser fails them. ``KVSPEC_UPDATE_REFERENCE=1`` rewrites the
reference screenshot (tests/data/show/forget-decrement-timeline.png) and fails, so a rewrite is never a pass.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageChops

from kvspec import jsonio
from kvspec.cli import main
from kvspec.report import ExitCode

DATA = Path(__file__).parent / "data" / "show"
FORGET = DATA / "forget-decrement.json"
REFERENCE = DATA / "forget-decrement-timeline.png"
CHROMIUM = os.environ.get("KVSPEC_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if CHROMIUM is None:
        if os.environ.get("KVSPEC_REQUIRE_BROWSER") == "1":
            pytest.fail("KVSPEC_REQUIRE_BROWSER=1 but no chromium on PATH (apt-get install -y chromium)")
        pytest.skip("no chromium on PATH: apt-get install -y chromium (KVSPEC_REQUIRE_BROWSER=1 makes this a failure)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


class Page:
    """A page opened from a file, with every console error and uncaught exception it produced."""

    def __init__(self, browser: Any, path: Path) -> None:
        self.page = browser.new_page(viewport={"width": 1400, "height": 1000}, device_scale_factor=1)
        self.errors: list[str] = []
        self.page.on(
            "console", lambda m: self.errors.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None
        )
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        self.page.on("requestfailed", lambda r: self.errors.append(f"request failed: {r.url}"))
        self.page.goto(path.as_uri())
        self.page.wait_for_load_state("load")

    def box(self, selector: str) -> dict[str, float]:
        box: dict[str, float] | None = self.page.locator(selector).first.bounding_box()
        assert box is not None, f"{selector} is not rendered"
        return box


def on(mark: dict[str, float], cell: dict[str, float]) -> bool:
    """The mark frames the cell: the same centre (within 3 px), at most a third larger, no smaller."""
    centre = [(b["x"] + b["width"] / 2, b["y"] + b["height"] / 2) for b in (mark, cell)]
    same_centre = abs(centre[0][0] - centre[1][0]) < 3 and abs(centre[0][1] - centre[1][1]) < 3
    return same_centre and all(cell[d] <= mark[d] <= 1.34 * cell[d] for d in ("width", "height"))


@pytest.mark.slow
def test_the_run_report_renders_every_case_with_no_console_error(browser: Any, tmp_path: Path) -> None:
    html, report = tmp_path / "run.html", tmp_path / "run.json"
    argv = ["check", "--adapter", "seeded_bugs:forget_decrement", "--safety-only", "--max-examples", "30", "--quiet"]
    argv += ["--cases-dir", str(tmp_path / "cases"), "--html", str(html), "--report", str(report)]
    assert main(argv) == ExitCode.VIOLATED
    cases = jsonio.load(report)["cases"]
    page = Page(browser, html)
    assert page.errors == []
    assert page.page.locator("figure.timeline").count() == len(cases) >= 1
    for i in range(len(cases)):
        svg = page.box(f"figure#case-{i} svg")
        assert svg["width"] > 200 and svg["height"] > 200
    # The violation mark is drawn on the violating cell, in the adapter's panel (p1), of the first case (c0).
    mark = page.page.locator("[id^='c0p1-violation-']:not([id*='band'])").first
    mark_id = mark.get_attribute("id")
    assert mark_id is not None
    row, col = mark_id.rsplit("-", 2)[1:]
    assert on(page.box(f"[id='{mark_id}']"), page.box(f"[id='c0p1-cell-{row}-{col}']"))
    assert not on(page.box(f"[id='{mark_id}']"), page.box(f"[id='c0p1-cell-{row}-{int(col) - 1}']"))
    assert page.page.locator("#verdict-ref_count_matches_references .violated").count() == 1
    assert page.box("#coverage-chart svg")["height"] > 50


def test_a_case_page_matches_its_reference_screenshot(browser: Any, tmp_path: Path) -> None:
    html = tmp_path / "case.html"
    argv = ["show", str(FORGET), "--adapter", "seeded_bugs:forget_decrement", "--out", str(html)]
    assert main(argv) == ExitCode.DONE
    page = Page(browser, html)
    assert page.errors == []
    shot = tmp_path / "shot.png"
    page.page.locator("figure#case-0 svg").screenshot(path=str(shot))
    if os.environ.get("KVSPEC_UPDATE_REFERENCE") == "1":
        shutil.copy(shot, REFERENCE)
        pytest.fail(f"reference rewritten: {REFERENCE}; review and commit it")
    got, want = Image.open(shot).convert("RGB"), Image.open(REFERENCE).convert("RGB")
    assert abs(got.size[0] - want.size[0]) <= 2 and abs(got.size[1] - want.size[1]) <= 2, (got.size, want.size)
    size = (min(got.size[0], want.size[0]), min(got.size[1], want.size[1]))
    diff = ImageChops.difference(got.crop((0, 0, *size)), want.crop((0, 0, *size))).convert("L")
    histogram = diff.histogram()
    pixels = size[0] * size[1]
    mean = sum(level * n for level, n in enumerate(histogram)) / pixels
    far = sum(histogram[48:]) / pixels
    # Antialiasing may differ between Chromium builds; a moved or missing mark does not fit these bounds.
    assert mean < 1.0 and far < 0.002, f"mean difference {mean:.2f}, {far:.2%} of pixels far off"


@pytest.mark.slow
def test_a_trace_page_renders_its_window_and_overview_with_no_console_error(browser: Any, tmp_path: Path) -> None:
    """A real live log with one stored block taken out: its page shows the overview of every line (an image inside
    the SVG, allowed by the page's CSP as data:) and the failing window, the mark on the removed hash's cell."""
    import json

    records = [json.loads(line) for line in (DATA.parent / "vllm_live_cpu.jsonl").read_text().splitlines()]
    removed = {
        h for r in records for e in r.get("events", ()) if e["type"] == "BlockRemoved" for h in e["block_hashes"]
    }
    record = next(r for r in records if any(set(e.get("block_hashes", ())) & removed for e in r.get("events", ())))
    record["events"] = [
        e for e in record["events"] if not (e["type"] == "BlockStored" and set(e["block_hashes"]) & removed)
    ]
    log, html = tmp_path / "live.jsonl", tmp_path / "trace.html"
    log.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["trace", "check", str(log), "--html", str(html)]) == ExitCode.VIOLATED
    page = Page(browser, html)
    assert page.errors == []
    assert page.page.locator("figure.timeline").count() == 1
    overview = page.box("figure#case-0-overview svg")
    assert overview["width"] > 400 and overview["height"] > 100
    shot = tmp_path / "overview.png"
    page.page.locator("figure#case-0-overview svg").screenshot(path=str(shot))
    data = Image.open(shot).convert("RGB").tobytes()
    rgb = zip(data[0::3], data[1::3], data[2::3], strict=True)
    cached = sum(1 for r, g, b in rgb if abs(r - 0xA8) < 12 and abs(g - 0xD5) < 12 and abs(b - 0xA2) < 12)
    assert cached > 500  # the raster of every line (a data: image) was loaded and drawn, not blocked
    mark = page.page.locator("[id^='c0p0-violation-']:not([id*='band'])").first
    mark_id = mark.get_attribute("id")
    assert mark_id is not None and not mark_id.startswith("c0p0-violation-col")
    row, col = mark_id.rsplit("-", 2)[1:]
    assert on(page.box(f"[id='{mark_id}']"), page.box(f"[id='c0p0-cell-{row}-{col}']"))
    assert page.page.locator("#verdict-removed_was_cached .violated").count() == 1
