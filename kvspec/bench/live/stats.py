"""The figures of the result: percentiles, one run's summary, one arm's summary over its runs, shared/unique.

Latency figures count only the requests that succeeded; failures are counted apart. Runs and arms
are the JSON dicts the result holds, so a saved result can be summarised again from its raw records.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from .load import LoadResult

RATIO_KEYS = (
    "ttft_median_s",
    "ttft_p90_s",
    "tpot_median_s",
    "tpot_p90_s",
    "requests_per_s",
    "output_tokens_per_s",
    "prefix_hit_tokens_usage",
    "prefix_cache_hits_metric",
)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0 < q < 100) by linear interpolation between order statistics; None if empty."""
    if not values:
        return None
    if len(values) == 1:
        return float(values[0])
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _median(values: Sequence[float]) -> float | None:
    return float(statistics.median(values)) if values else None


def _median_of(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return _median(present) if present else None


def summarise_run(load: LoadResult) -> dict[str, Any]:
    """Latency percentiles over the run's ok requests; throughput over the run's wall time.

    Failed requests count in ``failures`` and in no latency or throughput figure.
    """
    ok = [r for r in load.requests if r.ok]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
    output_tokens = sum(r.output_tokens or 0 for r in ok)
    cached = [r.cached_tokens for r in ok if r.cached_tokens is not None]
    return {
        "requests": len(load.requests),
        "ok": len(ok),
        "failures": len(load.requests) - len(ok),
        "failure_reasons": sorted({r.error for r in load.requests if r.error}),
        "wall_s": load.wall_s,
        "requests_per_s": len(ok) / load.wall_s if load.wall_s > 0 else None,
        "output_tokens_per_s": output_tokens / load.wall_s if load.wall_s > 0 else None,
        "output_tokens": output_tokens,
        "ttft_median_s": _median(ttft),
        "ttft_p90_s": percentile(ttft, 90),
        "tpot_median_s": _median(tpot),
        "tpot_p90_s": percentile(tpot, 90),
        # None when the server reports no prompt token details (flag off): unavailable, not zero.
        "cached_tokens_usage": sum(cached) if cached else None,
        # Requests whose tokens came in fewer chunks than tokens: their TPOT understates the token gap.
        "merged_chunk_requests": sum(1 for r in ok if r.output_tokens and r.chunks < r.output_tokens),
    }


def pooled(runs: Sequence[dict[str, Any]], key: str) -> list[float]:
    """``key`` (``ttft_s``, ``tpot_s``) of every ok request of ``runs``, where it has one."""
    return [r[key] for run in runs for r in run["requests"] if r["ok"] and r[key] is not None]


def summarise_arm(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One arm over its runs: TTFT/TPOT pooled over every ok request; throughput and hits per run, median.

    ``by_position`` splits the arm's runs by their place in the pair (first, second): when an arm's
    figures move with its position more than between arms, the difference is an order effect.
    """
    ttft, tpot = pooled(runs, "ttft_s"), pooled(runs, "tpot_s")
    by_position = {}
    for position, name in enumerate(("first", "second")):
        here = [run for run in runs if run.get("position") == position]
        by_position[name] = {
            "runs": len(here),
            "ttft_median_s": _median(pooled(here, "ttft_s")),
            "requests_per_s": _median_of([run["summary"]["requests_per_s"] for run in here]),
        }
    return {
        "runs": len(runs),
        "requests": sum(run["summary"]["requests"] for run in runs),
        "failures": sum(run["summary"]["failures"] for run in runs),
        "ttft_median_s": _median(ttft),
        "ttft_p90_s": percentile(ttft, 90),
        "tpot_median_s": _median(tpot),
        "tpot_p90_s": percentile(tpot, 90),
        "requests_per_s": _median_of([run["summary"]["requests_per_s"] for run in runs]),
        "output_tokens_per_s": _median_of([run["summary"]["output_tokens_per_s"] for run in runs]),
        "prefix_hit_tokens_usage": _median_of([run["summary"]["cached_tokens_usage"] for run in runs]),
        "prefix_cache_hits_metric": _median_of([run["metrics_delta"]["vllm:prefix_cache_hits_total"] for run in runs]),
        "prompt_tokens_cached_metric": _median_of(
            [run["metrics_delta"]["vllm:prompt_tokens_cached_total"] for run in runs]
        ),
        "preemptions_metric": _median_of([run["metrics_delta"]["vllm:num_preemptions_total"] for run in runs]),
        "by_position": by_position,
    }


def ratios(unique: dict[str, Any], shared: dict[str, Any]) -> dict[str, float | None]:
    """shared / unique for each figure; None where either is missing or unique is 0 (no finite ratio)."""
    out: dict[str, float | None] = {}
    for key in RATIO_KEYS:
        a, b = unique.get(key), shared.get(key)
        out[key] = None if a is None or b is None or a == 0 else b / a
    return out
