"""Timelines drawn with matplotlib: objects as rows, ops as columns, one panel per replay, stacked.

Every mark a reader or a test looks for carries an SVG id (matplotlib's ``gid``) built
by :func:`gid`: ``<prefix>p<panel>-cell-<row>-<col>``, ``...-free-<col>``,
``...-violation-<row>-<col>`` (``-violation-free-<col>``, ``-violation-col-<col>``),
``...-differs-<row>-<col>``, ``...-share-<row>-<col>``; :class:`Picture` keeps where each
one landed in pixels, so a test can look at the image where the violation must be.
"""

from __future__ import annotations

import io
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvspec.spec import Op

from .timeline import Cell, Timeline, cell_text

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

FORMATS = ("svg", "png", "html")
"""What ``kvspec show --out`` writes, by the file's suffix."""

VIOLATION = "#d62728"
DIFFERS = "#ff7f0e"
SHARE = "#1f3b73"
FREE = "#f2f2f2"
CACHED = "#a8d5a2"
REQUEST_COLORS = ("#9ecae1", "#fdd0a2", "#dadaeb", "#fcbba1", "#c7e9c0", "#d9d9d9", "#fde0ef", "#ffffb2")
CELL_W, CELL_H = 1.25, 0.5  # inches
LABEL_W = 1.1  # inches left of the grid for the row labels
DPI = 100


class ShowUnavailable(RuntimeError):
    """matplotlib, which draws the timelines, is not installed."""


def matplotlib_missing() -> str | None:
    """Why timelines cannot be drawn here (matplotlib is not installed), or None."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "drawing needs matplotlib: pip install 'kvspec[show]'"
    return None


def gid(prefix: str, panel: int, what: str, *where: int | str) -> str:
    """The SVG id of one mark of a picture (see the module's docstring)."""
    return "-".join([f"{prefix}p{panel}", what, *(str(w) for w in where)])


@dataclass
class Picture:
    """A drawn figure and where its marks are: SVG id -> (left, top, right, bottom) in pixels of the PNG at ``dpi``."""

    figure: Figure
    dpi: int
    boxes: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)

    def png(self) -> bytes:
        out = io.BytesIO()
        self.figure.savefig(out, format="png", dpi=self.dpi)
        return out.getvalue()

    def svg(self) -> str:
        """The figure as SVG text without the XML prolog (to inline in HTML), with no date and stable ids."""
        import matplotlib

        out = io.StringIO()
        with matplotlib.rc_context({"svg.hashsalt": "kvspec", "svg.fonttype": "path"}):
            self.figure.savefig(out, format="svg", metadata={"Date": None})
        text = out.getvalue()
        return text[text.index("<svg") :]

    def save(self, path: Path) -> None:
        """Write the picture as the suffix of ``path`` says (.svg or .png)."""
        from kvspec import jsonio

        if path.suffix == ".svg":
            jsonio.write_text(path, self.svg())
        else:
            jsonio.write_bytes(path, self.png())


def op_label(index: int, op: Op, outcome: str | None) -> str:
    """An op on the axis: its index and kind, its request and tokens, and its outcome when not ok."""
    tokens = ""
    if op.tokens:
        shown = " ".join(str(t) for t in op.tokens[:4])
        tokens = f" [{shown}{' ...' if len(op.tokens) > 4 else ''}]"
    extra = "" if op.op != "release" or op.keep else " keep=F"
    line2 = f"{op.req or ''}{tokens}{extra}".strip()
    status = "" if outcome in (None, "ok") else f"\n{outcome}"
    return f"{index}. {op.op}\n{line2}{status}" if line2 else f"{index}. {op.op}{status}"


def _label(index: int, op: Op | str, outcome: str | None) -> str:
    """A column's label: an op's (:func:`op_label`), or a trace line's own, with its outcome when not ok."""
    if isinstance(op, Op):
        return op_label(index, op, outcome)
    return op + ("" if outcome in (None, "ok") else f"\n{outcome}")


def _hatch(cell: Cell | None) -> str | None:
    """The cell's hatch: //// when it was evicted in this op, \\\\ when it was reclaimed."""
    if cell is None or cell.left is None:
        return None
    return "////" if cell.left == "evict" else "\\\\\\\\"


def _fill(cell: Cell | None, colors: dict[str, str]) -> str:
    if cell is None:
        return "white"
    if cell.state == "held":
        req = cell.holders[0][0] if cell.holders else ""
        return colors.setdefault(req, REQUEST_COLORS[len(colors) % len(REQUEST_COLORS)])
    return CACHED if cell.state == "cached" else FREE


def draw(
    grids: Sequence[Timeline], ops: Sequence[Op] | Sequence[str], *, title: str = "", prefix: str = "", dpi: int = DPI
) -> Picture:
    """Draw ``grids`` one above the other (the spec first), over the same ``ops`` (or a trace's column labels)."""
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    ncols = max(1, len(ops))
    width = LABEL_W + ncols * CELL_W + 0.3
    verdicts = [_verdict(g, panel, int((width - 0.2) * 13)) for panel, g in enumerate(grids)]  # 7 pt: ~13 an inch
    # Per panel, in cells: its label and verdict lines, its rows and the free row, the op labels below.
    heights = [len(g.rows) + 1 + 2.3 + 0.3 * len(v) for g, v in zip(grids, verdicts, strict=True)]
    titled = textwrap.wrap(title, max(int((width - 0.2) * 11), 30))  # bold 9 pt: about 11 characters an inch
    head = 0.3 + 0.2 * len(titled) if titled else 0.1  # inches above the first panel
    height = sum(h * CELL_H for h in heights) + head
    figure = Figure(figsize=(width, height), dpi=dpi)
    if titled:
        figure.text(
            0.01, 1 - 0.15 / height, "\n".join(titled), fontsize=9, weight="bold", va="top", gid=f"{prefix}title"
        )
    colors: dict[str, str] = {}
    top = 1 - head / height
    panels: list[tuple[Axes, Timeline, int]] = []
    for panel, (grid, h, lines) in enumerate(zip(grids, heights, verdicts, strict=True)):
        rows = len(grid.rows) + 1
        ax_top = top - (0.6 + 0.3 * len(lines)) * CELL_H / height
        ax_h = rows * CELL_H / height
        ax = figure.add_axes((LABEL_W / width, ax_top - ax_h, ncols * CELL_W / width, ax_h))
        top -= h * CELL_H / height
        _panel(ax, grid, ops, prefix, panel, colors, Rectangle, lines)
        panels.append((ax, grid, panel))
    picture = Picture(figure, dpi)
    figure.canvas.draw()  # fixes the transforms: the boxes below are where the marks land in the image
    for ax, grid, panel in panels:
        _boxes(picture, ax, grid, prefix, panel)
    return picture


def _verdict(grid: Timeline, panel: int, width: int) -> list[str]:
    """The panel's verdict line, wrapped to the figure's width (at most three lines)."""
    if grid.broken is not None:
        text = f"{grid.broken.at or f'step {grid.broken.step}'}: {grid.broken.message}"
    else:
        text = "the spec's replay" if panel == 0 and grid.label.startswith("spec") else "every invariant held"
    lines = textwrap.wrap(text, max(width, 30), max_lines=3, placeholder=" ...")
    return lines or [""]


def _panel(
    ax: Axes,
    grid: Timeline,
    ops: Sequence[Op] | Sequence[str],
    prefix: str,
    panel: int,
    colors: dict[str, str],
    Rect: Any,
    verdict: list[str],
) -> None:
    nrows, ncols = len(grid.rows), max(1, len(ops))
    ax.set_xlim(0, ncols)
    ax.set_ylim(nrows + 1, 0)
    ax.set_axis_off()
    ax.text(0, -0.3 - 0.32 * len(verdict), grid.label, fontsize=8, weight="bold", va="bottom", ha="left")
    ax.text(
        0,
        -0.25,
        "\n".join(verdict),
        fontsize=7,
        va="bottom",
        ha="left",
        color=VIOLATION if grid.broken else "#333333",
        gid=gid(prefix, panel, "verdict"),
    )
    for row in range(nrows):
        ax.text(-0.08, row + 0.5, grid.row_label(row), fontsize=7, ha="right", va="center", clip_on=False)
    ax.text(-0.08, nrows + 0.5, "free", fontsize=7, ha="right", va="center", style="italic", clip_on=False)
    for col in range(ncols):
        for row in range(nrows):
            cell = grid.cells[row][col] if col < len(ops) else None
            ax.add_patch(
                Rect(
                    (col + 0.03, row + 0.06),
                    0.94,
                    0.88,
                    facecolor=_fill(cell, colors),
                    edgecolor="#999999" if cell is not None and cell.cached else "#dddddd",
                    linewidth=0.6,
                    hatch=_hatch(cell),
                    gid=gid(prefix, panel, "cell", row, col),
                )
            )
            if cell is not None:
                ax.text(col + 0.5, row + 0.5, cell_text(cell), fontsize=6, ha="center", va="center", linespacing=1.1)
                if cell.shared and col > 0:
                    arrow = ax.annotate(
                        "",
                        xy=(col + 0.1, row + 0.3),
                        xytext=(col - 0.1, row + 0.3),
                        arrowprops={"arrowstyle": "-|>", "color": SHARE, "lw": 1.2},
                    )
                    if arrow.arrow_patch is not None:
                        arrow.arrow_patch.set_gid(gid(prefix, panel, "share", row, col))
        free = grid.free[col] if col < len(grid.free) else None
        ax.add_patch(
            Rect(
                (col + 0.03, nrows + 0.06),
                0.94,
                0.88,
                facecolor="white",
                edgecolor="#dddddd",
                linewidth=0.6,
                gid=gid(prefix, panel, "free", col),
            )
        )
        ax.text(
            col + 0.5,
            nrows + 0.5,
            "" if free is None else f"{free} of {grid.capacity}",
            fontsize=6,
            ha="center",
            va="center",
        )
        outcome = grid.outcomes[col] if col < len(grid.outcomes) else None
        label = _label(col, ops[col], outcome) if col < len(ops) else ""
        if outcome is None and col < len(ops):
            label += "\n(no answer)"
        hot = grid.broken is not None and grid.broken.step == col
        ax.text(
            col + 0.5,
            nrows + 1.1,
            label,
            fontsize=6,
            ha="center",
            va="top",
            clip_on=False,
            linespacing=1.15,
            color=VIOLATION if hot else ("#b35900" if col in grid.outcome_differs else "black"),
            weight="bold" if hot else "normal",
        )
    for row, col in sorted(grid.differs):
        ax.add_patch(
            Rect(
                (col + 0.06, row + 0.1),
                0.88,
                0.8,
                fill=False,
                edgecolor=DIFFERS,
                linewidth=2.0,
                linestyle="--",
                gid=gid(prefix, panel, "differs", row, col),
            )
        )
    for col in sorted(grid.free_differs):
        ax.add_patch(
            Rect(
                (col + 0.06, nrows + 0.1),
                0.88,
                0.8,
                fill=False,
                edgecolor=DIFFERS,
                linewidth=2.0,
                linestyle="--",
                gid=gid(prefix, panel, "differs-free", col),
            )
        )
    if grid.broken is not None and grid.broken.step < ncols:
        col = grid.broken.step
        ax.axvspan(col, col + 1, color=VIOLATION, alpha=0.08, gid=gid(prefix, panel, "violation-band", col))
        for row in grid.hot_rows:
            ax.add_patch(
                Rect(
                    (col + 0.01, row + 0.02),
                    0.98,
                    0.96,
                    fill=False,
                    edgecolor=VIOLATION,
                    linewidth=2.5,
                    gid=gid(prefix, panel, "violation", row, col),
                )
            )
        if grid.hot_free:
            ax.add_patch(
                Rect(
                    (col + 0.01, nrows + 0.02),
                    0.98,
                    0.96,
                    fill=False,
                    edgecolor=VIOLATION,
                    linewidth=2.5,
                    gid=gid(prefix, panel, "violation-free", col),
                )
            )
        if not grid.hot_rows and not grid.hot_free:
            ax.add_patch(
                Rect(
                    (col + 0.01, 0.02),
                    0.98,
                    nrows + 0.96,
                    fill=False,
                    edgecolor=VIOLATION,
                    linewidth=2.5,
                    gid=gid(prefix, panel, "violation-col", col),
                )
            )


def _boxes(picture: Picture, ax: Axes, grid: Timeline, prefix: str, panel: int) -> None:
    """Record where each cell, free cell and violation mark of ``grid`` landed, in pixels from the top left."""
    height = picture.figure.bbox.height

    def box(x0: float, y0: float, x1: float, y1: float) -> tuple[float, float, float, float]:
        (a, b), (c, d) = ax.transData.transform([(x0, y0), (x1, y1)])
        return (min(a, c), height - max(b, d), max(a, c), height - min(b, d))

    nrows, ncols = len(grid.rows), len(grid.columns)
    for col in range(ncols):
        for row in range(nrows):
            picture.boxes[gid(prefix, panel, "cell", row, col)] = box(col, row, col + 1, row + 1)
        picture.boxes[gid(prefix, panel, "free", col)] = box(col, nrows, col + 1, nrows + 1)
    if grid.broken is not None and grid.broken.step < ncols:
        col = grid.broken.step
        for row in grid.hot_rows:
            picture.boxes[gid(prefix, panel, "violation", row, col)] = box(col, row, col + 1, row + 1)
        if grid.hot_free:
            picture.boxes[gid(prefix, panel, "violation-free", col)] = box(col, nrows, col + 1, nrows + 1)
        if not grid.hot_rows and not grid.hot_free:
            picture.boxes[gid(prefix, panel, "violation-col", col)] = box(col, 0, col + 1, nrows + 1)


__all__ = ["FORMATS", "Picture", "ShowUnavailable", "draw", "gid", "matplotlib_missing", "op_label"]
