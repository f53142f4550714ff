"""The run report's two charts: how often each situation was reached, and policy quality over the run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .draw import Picture


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


__all__ = ["coverage_chart", "quality_chart"]
