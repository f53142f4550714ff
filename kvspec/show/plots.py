"""The run report's charts: how often each situation was reached, policy quality over the run, a trace's overview."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any

from .draw import CACHED, FREE, REQUEST_COLORS, VIOLATION, Picture
from .timeline import in_order


def coverage_chart(coverage: Mapping[str, int], *, dpi: int = 100) -> Picture:
    """A horizontal bar per situation reached (``admit:ok``, ``evict``, ``bad_input:...``), longest first."""
    from matplotlib.figure import Figure

    items = sorted(coverage.items(), key=lambda kv: (-kv[1], kv[0]))
    figure = Figure(figsize=(7.5, 0.6 + 0.22 * max(1, len(items))), dpi=dpi, layout="constrained")
    ax = figure.add_subplot()
    names = [name for name, _ in items][::-1]
    counts = [count for _, count in items][::-1]
    ax.barh(names, counts, color="#6baed6", gid="coverage-bars")
    ax.set_xscale("symlog")
    ax.set_xlabel("times reached (symmetric log scale)", fontsize=8)
    ax.tick_params(labelsize=7)
    for y, count in enumerate(counts):
        ax.text(count, y, f" {count}", va="center", fontsize=6)
    return Picture(figure, dpi)


def quality_chart(series: Mapping[str, Sequence[float]], *, dpi: int = 100) -> Picture:
    """Orphaned cached capacity (share of capacity) and evictions, as they accumulated over the run's steps."""
    from matplotlib.figure import Figure

    steps = list(series.get("steps", ()))
    figure = Figure(figsize=(7.5, 2.6), dpi=dpi, layout="constrained")
    ax = figure.add_subplot()
    ax.plot(steps, [100 * s for s in series.get("orphan_capacity_share", ())], color="#d62728", gid="quality-orphans")
    ax.set_xlabel("steps checked", fontsize=8)
    ax.set_ylabel("orphaned cached capacity (%)", fontsize=8, color="#d62728")
    ax.tick_params(labelsize=7)
    other = ax.twinx()
    other.plot(steps, list(series.get("evictions", ())), color="#1f77b4", linestyle="--", gid="quality-evictions")
    other.set_ylabel("evictions (cumulative)", fontsize=8, color="#1f77b4")
    other.tick_params(labelsize=7)
    return Picture(figure, dpi)


OVERVIEW_PIXELS = (600, 1800)
"""At most this many rows and columns of the overview's raster: a longer log's lines (or a larger pool's objects)
are taken in buckets, each showing the strongest look in it (leaving, then held, then cached)."""

LEFT = "#444444"
"""An object that left the cache (evicted, reclaimed) on that line."""


def _shrunk(grid: Any, most: tuple[int, int]) -> Any:
    """``grid`` with rows and columns taken in buckets so that it has at most ``most`` of each (max per bucket)."""
    import numpy as np

    for axis, limit in enumerate(most):
        size = grid.shape[axis]
        if size <= limit:
            continue
        bucket = -(-size // limit)
        pad = [(0, 0), (0, 0)]
        pad[axis] = (0, bucket * -(-size // bucket) - size)
        padded = np.pad(grid, pad)
        shape = (
            (padded.shape[0] // bucket, bucket, padded.shape[1])
            if axis == 0
            else (padded.shape[0], padded.shape[1] // bucket, bucket)
        )
        grid = padded.reshape(shape).max(axis=1 if axis == 0 else 2)
    return grid


def overview_chart(
    lines: Sequence[int],
    changes: Sequence[Mapping[Hashable, int]],
    window: tuple[int, int],
    violation: int | None,
    *,
    prefix: str = "",
    dpi: int = 100,
) -> Picture:
    """Every replayed line of a trace as a column one pixel wide and every object as a row: free, cached, held,
    or leaving the cache on that line (``changes``: per line, the objects whose code it changed, 0 when gone);
    the window drawn cell by cell framed, the violating line (an index into ``lines``) in red."""
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure

    seen: dict[Hashable, None] = {}
    for change in changes:
        for oid in change:
            seen.setdefault(oid, None)
    rows = {oid: i for i, oid in enumerate(in_order(list(seen)))}
    grid = np.zeros((max(len(rows), 1), max(len(lines), 1)), dtype=np.int8)
    for col, change in enumerate(changes):
        if col:
            grid[:, col] = grid[:, col - 1]
        for oid, code in change.items():
            grid[rows[oid], col] = code
    figure = Figure(figsize=(9.0, min(1.4 + 0.02 * len(rows), 6.0)), dpi=dpi, layout="constrained")
    ax = figure.add_subplot()
    colors = ListedColormap([FREE, CACHED, REQUEST_COLORS[0], LEFT])
    extent = (-0.5, grid.shape[1] - 0.5, grid.shape[0] - 0.5, -0.5)  # axes in lines and objects, however shrunk
    ax.imshow(
        _shrunk(grid, OVERVIEW_PIXELS),
        aspect="auto",
        interpolation="nearest",
        cmap=colors,
        vmin=0,
        vmax=3,
        extent=extent,
        gid=f"{prefix}overview-grid",
    )
    ax.set_title(
        f"every replayed line ({len(lines)}) over every object ({len(rows)}): free, cached, held, leaving the cache",
        fontsize=8,
    )
    ax.set_xlabel("replayed line (trace line numbers below)", fontsize=8)
    ax.set_ylabel("object", fontsize=8)
    ticks = list(range(0, len(lines), max(1, len(lines) // 8)))
    ax.set_xticks(ticks, [str(lines[t]) for t in ticks])
    ax.tick_params(labelsize=7)
    start, stop = window
    ax.axvspan(start - 0.5, stop - 0.5, fill=False, edgecolor="#1f3b73", linewidth=1.2, gid=f"{prefix}overview-window")
    if violation is not None:
        ax.axvline(violation, color=VIOLATION, linewidth=1.5, gid=f"{prefix}overview-violation")
    return Picture(figure, dpi)


__all__ = ["coverage_chart", "overview_chart", "quality_chart"]
