"""What a person reads: the result as a plain-text table, a progress line per run, and a figure.

The plot needs matplotlib, which is not a dependency of the kit: without it nothing is drawn.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from .stats import pooled
from .workload import ARMS


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def progress_line(summary: dict[str, Any]) -> str:
    """One run's summary in a line, for the progress the benchmark prints as it goes."""
    return (
        f"  {summary['ok']}/{summary['requests']} ok, TTFT p50 {_ms(summary['ttft_median_s'])} ms, "
        f"{_num(summary['requests_per_s'], 2)} req/s, cached tokens {summary['cached_tokens_usage']}"
    )


def table(result: dict[str, Any]) -> str:
    """The per-run rows, the per-arm summary and the shared/unique ratios as plain text."""
    c = result["configuration"]
    lines = [
        f"kvspec bench live: N={c['requests']} requests, P={c['prompt_tokens']} prompt tokens "
        f"(shared arm: S={c['shared_tokens']} shared + {c['prompt_tokens'] - c['shared_tokens']} unique), "
        f"O={c['output_tokens']} output tokens, C={c['concurrency']} in flight; block size {c['block_size']}, "
        f"pool {c['num_blocks']} blocks; {c['pairs']} pairs, a fresh server per run",
        "",
        f"{'run':>3} {'pair':>4} {'pos':>3} {'arm':<7} {'ok/N':>7} {'TTFT p50':>9} {'TTFT p90':>9} "
        f"{'TPOT p50':>9} {'req/s':>7} {'tok/s':>7} {'hit tok':>8} {'hits(m)':>8} {'preempt':>7} {'load':>5}",
    ]
    for run in result["runs"]:
        s, d = run["summary"], run["metrics_delta"]
        lines.append(
            f"{run['run']:>3} {run['pair']:>4} {run['position']:>3} {run['arm']:<7} "
            f"{s['ok']:>3}/{s['requests']:<3} {_ms(s['ttft_median_s']):>9} {_ms(s['ttft_p90_s']):>9} "
            f"{_ms(s['tpot_median_s']):>9} {_num(s['requests_per_s'], 2):>7} {_num(s['output_tokens_per_s'], 1):>7} "
            f"{_num(s['cached_tokens_usage']):>8} {_num(d['vllm:prefix_cache_hits_total']):>8} "
            f"{_num(d['vllm:num_preemptions_total']):>7} {_num(max(run['loadavg_1m']), 1):>5}"
        )
    lines += [
        "",
        "per arm (TTFT/TPOT over all ok requests of the arm; throughput and hit tokens: median of its runs)",
        f"{'arm':<7} {'fail':>4} {'TTFT p50':>9} {'TTFT p90':>9} {'TPOT p50':>9} {'TPOT p90':>9} "
        f"{'req/s':>7} {'tok/s':>7} {'hit tok':>8} {'hits(m)':>8}",
    ]
    for arm in ARMS:
        a = result["arms"][arm]
        lines.append(
            f"{arm:<7} {a['failures']:>4} {_ms(a['ttft_median_s']):>9} {_ms(a['ttft_p90_s']):>9} "
            f"{_ms(a['tpot_median_s']):>9} {_ms(a['tpot_p90_s']):>9} {_num(a['requests_per_s'], 2):>7} "
            f"{_num(a['output_tokens_per_s'], 1):>7} {_num(a['prefix_hit_tokens_usage']):>8} "
            f"{_num(a['prefix_cache_hits_metric']):>8}"
        )
    lines += ["", "order: TTFT p50 (ms) and req/s of each arm's runs when it ran first / second in its pair"]
    for arm in ARMS:
        pos = result["arms"][arm]["by_position"]
        lines.append(
            f"{arm:<7} first ({pos['first']['runs']} runs): {_ms(pos['first']['ttft_median_s'])} ms, "
            f"{_num(pos['first']['requests_per_s'], 2)} req/s; second ({pos['second']['runs']} runs): "
            f"{_ms(pos['second']['ttft_median_s'])} ms, {_num(pos['second']['requests_per_s'], 2)} req/s"
        )
    r = result["ratios_shared_over_unique"]
    lines.append(
        "shared/unique: "
        + ", ".join(f"{key} {_num(value, 3) if value is not None else 'n/a'}" for key, value in r.items())
    )
    lines.append(
        "times in ms; hit tok: usage.prompt_tokens_details.cached_tokens; hits(m): /metrics delta of "
        "vllm:prefix_cache_hits_total; load: the machine's 1-minute load average (max of before/after)"
    )
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> bool:
    """Draw TTFT and TPOT per arm and throughput and hit tokens per run; False when matplotlib is missing."""
    try:
        matplotlib: Any = importlib.import_module("matplotlib")
        matplotlib.use("Agg")  # no display: draw to a file only
        plt: Any = importlib.import_module("matplotlib.pyplot")
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 4, figsize=(16, 4))
    for ax, key, title in ((axes[0], "ttft_s", "TTFT (ms)"), (axes[1], "tpot_s", "TPOT (ms)")):
        data = [[v * 1000 for v in pooled([r for r in result["runs"] if r["arm"] == arm], key)] for arm in ARMS]
        ax.boxplot(data, tick_labels=list(ARMS))
        ax.set_title(title)
    labels = [f"{r['run']}:{r['arm'][0]}" for r in result["runs"]]
    colours = ["tab:blue" if r["arm"] == "unique" else "tab:orange" for r in result["runs"]]
    axes[2].bar(labels, [r["summary"]["requests_per_s"] or 0 for r in result["runs"]], color=colours)
    axes[2].set_title("requests/s per run (u: unique, s: shared)")
    axes[3].bar(labels, [r["summary"]["cached_tokens_usage"] or 0 for r in result["runs"]], color=colours)
    axes[3].set_title("prefix-hit tokens per run")
    c = result["configuration"]
    fig.suptitle(
        f"kvspec bench live: N={c['requests']} P={c['prompt_tokens']} S={c['shared_tokens']} "
        f"O={c['output_tokens']} C={c['concurrency']}, block {c['block_size']}, pool {c['num_blocks']} blocks, "
        f"model {c.get('model_shape', '?')}, {c.get('cpu_count')} CPUs"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True
