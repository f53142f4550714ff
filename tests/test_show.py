"""``kvspec show`` and ``--html``: timelines of real counterexamples, checked by what they show where.

The cases under tests/data/show/ are the kit's own shrunk counterexamples of seeded bugs
(tests/seeded_bugs.py), saved by ``run_check``: forget-decrement (a release that does not
drop the block's ref count), lost-on-reclaim (a reclaimed block that never returns to the
free count), and one each at record and entry granularity.
"""

from __future__ import annotations

import io
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from PIL import Image
from seeded_bugs import by_name

from kvspec import jsonio
from kvspec.adapters.lifecycle_sim import LifecycleSimAdapter
from kvspec.adapters.reference_paged import ReferencePagedAdapter
from kvspec.adapters.scheduler_sim import SchedulerSimAdapter
from kvspec.case import Case
from kvspec.cli import main
from kvspec.report import ExitCode, report_problems
from kvspec.show import draw, picture, replay, timelines
from kvspec.show.timeline import names
from kvspec.spec import Config, Op, Semantics

DATA = Path(__file__).parent / "data" / "show"
FORGET = DATA / "forget-decrement.json"
SVG = "{http://www.w3.org/2000/svg}"


def red(pixel: tuple[int, ...]) -> bool:
    """The highlight's red (#d62728), give or take antialiasing."""
    r, g, b = pixel[:3]
    return r > 180 and g < 90 and b < 90


def test_cells_follow_the_spec_ledger() -> None:
    """Two requests share a cached block, one releases, the other releases without keeping: held, shared, reclaimed."""
    case = Case(
        "reference",
        Config(capacity=3, block_size=2),
        [
            Op("admit", "r0", (1, 2, 3)),
            Op("admit", "r1", (1, 2, 4)),
            Op("release", "r0"),
            Op("release", "r1", keep=False),
        ],
    )
    (grid,) = timelines(replay(case, None, default=Semantics()))
    first = grid.rows.index(next(oid for oid in grid.rows if grid.cells[grid.rows.index(oid)][0].tokens == (1, 2)))
    row = grid.cells[first]
    assert [c.state if c else None for c in row] == ["held", "held", "held", "free"]
    assert row[0].holders == (("r0", 0),) and row[0].cached and row[0].ref_count == 1
    assert row[1].ref_count == 2 and row[1].shared and {h[0] for h in row[1].holders} == {"r0", "r1"}
    assert not row[2].shared and row[2].holders == (("r1", 0),)
    assert row[3].left == "reclaim"
    assert grid.free == [1, 0, 1, 3] and grid.broken is None


def test_the_adapter_panel_marks_the_violating_block_and_what_differs_from_the_spec() -> None:
    case = Case.load(FORGET)
    runs = replay(case, by_name("forget-decrement").factory)
    spec, adapter = timelines(runs)
    assert spec.broken is None
    assert adapter.broken is not None
    assert (adapter.broken.step, adapter.broken.invariant) == (2, "ref_count_matches_references")
    row = adapter.rows.index(0)  # "object 0 has ref_count 2 but 1 live references"
    assert adapter.hot_rows == (row,) and not adapter.hot_free
    assert adapter.cells[row][2].ref_count == 2 and spec.cells[spec.rows.index(0)][2].ref_count == 1
    assert (row, 2) in adapter.differs and (spec.rows.index(0), 2) in spec.differs
    assert all(col == 2 for _, col in adapter.differs)  # steps 0 and 1 agree with the spec


def test_a_free_count_violation_marks_the_free_row() -> None:
    case = Case.load(DATA / "lost-on-reclaim.json")
    spec, adapter = timelines(replay(case, by_name("lost-on-reclaim").factory))
    assert adapter.broken is not None and adapter.broken.invariant == "capacity_conservation"
    assert adapter.hot_free and adapter.hot_rows == ()
    assert 1 in adapter.free_differs and spec.free[1] == 2 and adapter.free[1] == 1


def test_the_png_is_red_where_the_violation_is_and_nowhere_else() -> None:
    case = Case.load(FORGET)
    _, grids, pic = picture(case, by_name("forget-decrement").factory)
    image = Image.open(io.BytesIO(pic.png())).convert("RGB")
    assert image.size == (round(pic.figure.bbox.width), round(pic.figure.bbox.height))
    row = grids[1].rows.index(0)
    left, top, right, bottom = pic.boxes[f"p1-violation-{row}-2"]
    assert pic.boxes[f"p1-violation-{row}-2"] == pic.boxes[f"p1-cell-{row}-2"]
    mid_y, mid_x = int((top + bottom) / 2), int((left + right) / 2)
    # The highlight's border: red on all four sides of the violating cell.
    for x, y in [(int(left) + 2, mid_y), (int(right) - 2, mid_y), (mid_x, int(top) + 2), (mid_x, int(bottom) - 2)]:
        assert any(red(image.getpixel((x + d, y))) or red(image.getpixel((x, y + d))) for d in (-2, -1, 0, 1, 2))
    # No red border on any other cell of the grid, the spec's panel included.
    for gid, (x0, y0, x1, y1) in pic.boxes.items():
        if "-cell-" not in gid or gid == f"p1-cell-{row}-2":
            continue
        border = [image.getpixel((int(x0) + 2, int((y0 + y1) / 2))), image.getpixel((int((x0 + x1) / 2), int(y0) + 2))]
        assert not any(red(p) for p in border), gid


def test_the_svg_names_each_mark_and_puts_it_on_its_cell() -> None:
    case = Case.load(FORGET)
    _, grids, pic = picture(case, by_name("forget-decrement").factory)
    root = ET.fromstring(pic.svg())
    ids = {el.get("id") for el in root.iter() if el.get("id")}
    row = grids[1].rows.index(0)
    assert f"p1-violation-{row}-2" in ids and f"p1-differs-{row}-2" in ids and "p1-share-0-1" in ids
    assert not any(i.startswith("p0-violation") for i in ids)  # the spec held
    # The mark's path lies on the cell's box (SVG units are points: 72 per inch).
    group = next(el for el in root.iter() if el.get("id") == f"p1-violation-{row}-2")
    path = next(group.iter(f"{SVG}path")).get("d") or ""
    xs = [float(v) for v in re.findall(r"[ML] ?(-?[\d.]+) (-?[\d.]+)", path) for v in v[:1]]
    left, _, right, _ = (v * 72 / pic.dpi for v in pic.boxes[f"p1-cell-{row}-2"])
    assert min(xs) == pytest.approx(left, abs=2) and max(xs) == pytest.approx(right, abs=2)


def test_a_case_that_holds_has_no_highlight() -> None:
    case = Case.load(FORGET)
    runs, grids, pic = picture(case, ReferencePagedAdapter)
    assert runs[1].broken is None and not grids[0].differs and not grids[1].differs
    assert "violation" not in pic.svg()


@pytest.mark.parametrize(
    ("name", "factory", "granularity"),
    [
        ("lifecycle-evicts-active", LifecycleSimAdapter, "record"),
        ("scheduler-frees-incoming-size", SchedulerSimAdapter, "entry"),
    ],
)
def test_record_and_entry_cases_are_drawn_too(name: str, factory: object, granularity: str) -> None:
    case = Case.load(DATA / f"{name}.json")
    bug = by_name(name)
    runs, grids, pic = picture(case, bug.factory)
    assert runs[0].semantics.granularity == granularity
    assert runs[1].broken is not None and runs[1].broken.invariant == case.expected["invariant"]
    assert grids[1].rows and any(c is not None and c.state != "free" for row in grids[1].cells for c in row)
    svg = pic.svg()
    assert "p1-violation" in svg
    # the same case on the unbugged simulator holds
    assert picture(case, factory)[0][1].broken is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "oid", "named"),
    [
        ("object 0 has ref_count 2 but 1 live references", 0, True),
        ("object 10 has ref_count 2", 1, False),
        ("block 1 of 'r0' is new object 3 although its prefix was cached as 2", 1, False),
        ("block 1 of 'r0' is new object 3 although its prefix was cached as 2", 3, True),
        ("prompt of 'r1' is held by 2 objects (4, 5)", 5, True),
        ("uncached block 7 is referenced 2 times", 7, True),
        ("free 1 + held 0 != capacity 2", 1, False),
    ],
)
def test_names_reads_the_objects_a_problem_names(text: str, oid: int, named: bool) -> None:
    assert names(text, oid) is named


@pytest.mark.parametrize("suffix", ["svg", "png", "html"])
def test_show_writes_each_format(suffix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / f"case.{suffix}"
    code = main(["show", str(FORGET), "--adapter", "seeded_bugs:forget_decrement", "--out", str(out)])
    assert code == ExitCode.DONE
    assert "VIOLATED at step 2" in capsys.readouterr().out
    data = out.read_bytes()
    if suffix == "png":
        assert Image.open(io.BytesIO(data)).size[0] > 300
    else:
        text = data.decode()
        assert "p1-violation-" in text and "<svg" in text
    if suffix == "html":
        text = data.decode()
        assert "Content-Security-Policy" in text
        assert not re.search(r"""(?:src|href)=["']?(?:https?:|//)|url\((?:https?:|//)|<script""", text)  # loads nothing
        assert 'id="case-0"' in text


def test_show_without_an_adapter_draws_the_spec_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "spec.svg"
    assert main(["show", str(FORGET), "--out", str(out)]) == ExitCode.DONE
    text = out.read_text()
    assert "p0-cell-0-0" in text and "p1-" not in text and "violation" not in text


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["show", "{case}", "--out", "{tmp}/x.txt"], "--out must end in"),
        (["show", "{tmp}/missing.json", "--out", "{tmp}/x.svg"], "missing.json"),
        (["show", "{case}", "--adapter", "no-such-adapter", "--out", "{tmp}/x.svg"], "no-such-adapter"),
        (["show", "{case}", "--out", "{tmp}/x.svg", "--step-timeout", "0"], "--step-timeout"),
    ],
)
def test_show_that_cannot_run_says_why_in_one_line(
    argv: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [a.format(case=FORGET, tmp=tmp_path) for a in argv]
    assert main(args) == ExitCode.COULD_NOT_RUN
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kvspec: ") and says in err


def test_without_matplotlib_show_and_html_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["show", str(FORGET), "--out", str(tmp_path / "x.svg")]) == ExitCode.COULD_NOT_RUN
    assert main(["check", "--html", str(tmp_path / "r.html"), "--max-examples", "1"]) == ExitCode.COULD_NOT_RUN
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all("kvspec[show]" in line for line in err)
    assert not (tmp_path / "r.html").exists()


def test_check_html_shows_the_verdicts_and_each_case_with_its_timeline(tmp_path: Path) -> None:
    html, report = tmp_path / "run.html", tmp_path / "run.json"
    argv = ["check", "--adapter", "seeded_bugs:forget_decrement", "--safety-only", "--max-examples", "30", "--quiet"]
    code = main([*argv, "--cases-dir", str(tmp_path / "cases"), "--html", str(html), "--report", str(report)])
    assert code == ExitCode.VIOLATED
    data = jsonio.load(report)
    text = html.read_text()
    assert len(data["cases"]) == 1
    for row in data["invariants"]:
        assert re.search(rf'id="verdict-{row["name"]}">.*?class="{row["verdict"]}"', text)
    assert text.count('<figure class="timeline"') == len(data["cases"]) and "p1-violation-" in text
    assert "c0p1-violation-" in text  # each case's marks are its own
    assert data["adapter"] in text and "Versions" in text


def test_a_passing_run_reports_policy_quality_over_time(tmp_path: Path) -> None:
    html, report = tmp_path / "run.html", tmp_path / "run.json"
    argv = ["check", "--max-examples", "15", "--no-scenarios", "--quiet", "--html", str(html), "--report", str(report)]
    assert main(argv) == ExitCode.HELD
    data = jsonio.load(report)
    assert report_problems(data) == []
    quality = next(f for f in data["findings"] if f["kind"] == "policy_quality")
    series = quality["series"]
    assert len(series["steps"]) == len(series["orphan_capacity_share"]) == len(series["evictions"]) >= 2
    assert series["steps"] == sorted(series["steps"]) and series["steps"][-1] == data["steps"]
    assert series["evictions"][-1] == quality["evictions"]
    text = html.read_text()
    assert 'id="quality-chart"' in text and "quality-orphans" in text and 'id="coverage-chart"' in text
    assert "<h2>Cases (0)</h2>" in text


def test_draw_keeps_every_cell_in_the_picture() -> None:
    case = Case.load(FORGET)
    grids = timelines(replay(case, by_name("forget-decrement").factory))
    pic = draw(grids, case.ops)
    w, h = pic.figure.bbox.width, pic.figure.bbox.height
    assert all(0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h for x0, y0, x1, y1 in pic.boxes.values())
