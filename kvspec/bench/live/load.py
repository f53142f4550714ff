"""One run's load: C workers send the arm's N streamed requests, closed loop, and the run's wall time."""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kvspec.adapters.vllm_live.client import RequestResult, stream_completion


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
