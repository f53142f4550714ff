"""The A/B driver: every run on a fresh server from a launcher, its /metrics read before and after its load.

A launcher is a context manager factory: each call starts a fresh server, yields its base URL and
stops it on leaving. :class:`~.launcher.TinyVllmLauncher` starts the kit's tiny vLLM server; the
tests pass a fake one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any
from urllib.error import HTTPError

from kvspec.adapters.vllm_live.client import metrics_text, served_model
from kvspec.adapters.vllm_live.metrics import Metrics, counter_deltas, parse_metrics

from .load import run_load
from .render import progress_line
from .stats import ratios, summarise_arm, summarise_run
from .workload import ARMS, WorkloadShape, make_prompts

# Counters of vLLM's /metrics whose change over a run is recorded (summed over label sets).
COUNTERS = (
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:prompt_tokens_cached_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:num_preemptions_total",
    "vllm:request_success_total",
)

PROBE_TIMEOUT_S = 10.0  # GET /v1/models and /metrics

# A server launcher: a context manager factory that starts a fresh server and yields its base URL.
Launcher = Callable[[], AbstractContextManager[str]]


class ServerDidNotStart(RuntimeError):
    """The server under test did not come up; ``log_tail`` holds the end of its log."""

    def __init__(self, reason: str, log_tail: str = "") -> None:
        super().__init__(reason)
        self.log_tail = log_tail


def run_order(pairs: int) -> list[tuple[int, int, str]]:
    """(pair, position, arm) for every run: pair 0 runs unique then shared, pair 1 the reverse, ..."""
    order: list[tuple[int, int, str]] = []
    for pair in range(pairs):
        arms = ARMS if pair % 2 == 0 else tuple(reversed(ARMS))
        order.extend((pair, position, arm) for position, arm in enumerate(arms))
    return order


def _served_model(url: str) -> str:
    try:
        return served_model(url, PROBE_TIMEOUT_S)
    except HTTPError as exc:
        body = exc.read().decode("utf-8", errors="replace")
        raise ServerDidNotStart(f"GET /v1/models answered {exc.code}: {body[:200]}") from exc


def _parsed(metrics: str) -> Metrics:
    """The page parsed; empty (every counter unavailable) without prometheus-client, a dependency of vLLM's."""
    try:
        return parse_metrics(metrics)
    except ImportError:
        return Metrics()


def run_one(
    launcher: Launcher,
    arm: str,
    prompts: Sequence[Sequence[int]],
    shape: WorkloadShape,
    *,
    request_timeout: float,
    settle_s: float,
) -> dict[str, Any]:
    """Start a fresh server, read /metrics, run the arm's load, read /metrics again, stop the server.

    Raises ServerDidNotStart when the server does not come up; request failures are counted.
    """
    started = time.perf_counter()
    with launcher() as url:
        startup_s = time.perf_counter() - started
        load_before = os.getloadavg()[0]  # the machine's 1-minute load: other work competes for the cores
        model = _served_model(url)
        before = metrics_text(url, PROBE_TIMEOUT_S)
        load = run_load(url, model, prompts, shape.output_tokens, shape.concurrency, request_timeout)
        # vLLM's frontend logs a step's stats as its outputs arrive; let the last step's land.
        time.sleep(settle_s)
        after = metrics_text(url, PROBE_TIMEOUT_S)
        load_after = os.getloadavg()[0]
    parsed_before, parsed_after = _parsed(before), _parsed(after)
    before_counters, after_counters = parsed_before.counters(COUNTERS), parsed_after.counters(COUNTERS)
    return {
        "arm": arm,
        "served_model": model,
        "startup_s": startup_s,
        "loadavg_1m": [load_before, load_after],
        "summary": summarise_run(load),
        "metrics_before": {"counters": before_counters, "raw": before},
        "metrics_after": {"counters": after_counters, "raw": after},
        "metrics_delta": counter_deltas(before_counters, after_counters),
        "cache_config": dict(parsed_after.cache_config),
        "requests": [r.to_json() for r in load.requests],
    }


def run_ab(
    launcher: Launcher,
    shape: WorkloadShape,
    pairs: int,
    *,
    request_timeout: float = 120.0,
    settle_s: float = 1.0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every run of the A/B (see run_order) on a fresh server; the runs, per-arm summaries and ratios.

    Raises ServerDidNotStart when a server fails to start, KeyboardInterrupt on Ctrl-C; either carries
    the runs done so far in ``partial``.
    """
    say = progress or (lambda line: None)
    prompts = {arm: make_prompts(arm, shape) for arm in ARMS}
    runs: list[dict[str, Any]] = []
    for number, (pair, position, arm) in enumerate(run_order(pairs)):
        say(f"run {number + 1}/{2 * pairs}: pair {pair}, {arm} ({'first' if position == 0 else 'second'})")
        try:
            run = run_one(launcher, arm, prompts[arm], shape, request_timeout=request_timeout, settle_s=settle_s)
        except (ServerDidNotStart, KeyboardInterrupt) as exc:
            exc.partial = runs  # type: ignore[union-attr]  # the caller still writes the runs done so far
            raise
        run |= {"run": number, "pair": pair, "position": position}
        say(progress_line(run["summary"]))
        runs.append(run)
    arms = {arm: summarise_arm([r for r in runs if r["arm"] == arm]) for arm in ARMS}
    return {"runs": runs, "arms": arms, "ratios_shared_over_unique": ratios(arms["unique"], arms["shared"])}
