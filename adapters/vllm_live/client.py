"""The HTTP side of a vLLM server as the kit talks to it: its OpenAI-compatible API, /metrics and /health.

One client for the live adapter and the live benchmark. Requests go straight to the server, never
through a proxy named in the environment: the servers are the kit's own on 127.0.0.1 or one given by
URL, and a timed request must time the server. Errors are urllib's: :class:`urllib.error.HTTPError`
for an answer of 400 or more (a URLError, itself an OSError), URLError or OSError when the server
cannot be reached, ValueError for a body that is not JSON. :func:`stream_completion` alone never
raises: it times one streamed completion and records what went wrong.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any
from urllib.error import HTTPError, URLError

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _open(base_url: str, path: str, timeout: float, body: Mapping[str, Any] | None = None) -> http.client.HTTPResponse:
    """GET ``path`` of the server, or POST ``body`` as JSON; the open response."""
    data = None if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"Content-Type": "application/json"}
    request = urllib.request.Request(f"{base_url.rstrip('/')}{path}", data=data, headers=headers)
    response: http.client.HTTPResponse = _DIRECT.open(request, timeout=timeout)
    return response


def get_json(base_url: str, path: str, timeout: float = 30.0) -> Any:
    """GET ``path`` and decode its JSON body."""
    with _open(base_url, path, timeout) as response:
        return json.loads(response.read())


def post_json(base_url: str, path: str, body: Mapping[str, Any] | None = None, *, timeout: float) -> Any:
    """POST ``body`` (``{}`` when None) as JSON to ``path``; the decoded answer, ``{}`` for an empty one."""
    with _open(base_url, path, timeout, body or {}) as response:
        text = response.read()
    return json.loads(text) if text.strip() else {}


def served_model(base_url: str, timeout: float = 30.0) -> str:
    """The id of the first model the server lists at /v1/models (requests must name it)."""
    return str(get_json(base_url, "/v1/models", timeout)["data"][0]["id"])


def metrics_text(base_url: str, timeout: float = 10.0) -> str:
    """The server's /metrics page (Prometheus exposition text)."""
    with _open(base_url, "/metrics", timeout) as response:
        return response.read().decode("utf-8", errors="replace")


def healthy(base_url: str, timeout: float = 2.0) -> bool:
    """Whether GET /health answers 200 now; False when it answers otherwise or not at all."""
    try:
        with _open(base_url, "/health", timeout) as response:
            return response.status == 200
    except OSError:  # URLError and HTTPError among them
        return False


@dataclass
class RequestResult:
    """One streamed request as the client saw it; times are seconds from the run's start."""

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


def _status_error(status: int, body: bytes) -> str:
    return f"HTTP {status}: {body[:200].decode('utf-8', errors='replace')}"


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
        with _open(base_url, "/v1/completions", timeout, body) as response:
            result.status = response.status
            if response.status != 200:
                result.error = _status_error(response.status, response.read())
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
    except HTTPError as exc:  # urllib raises for 400 and more; other answers but 200 are refused above
        result.status = exc.code
        result.error = _status_error(exc.code, exc.read())
        return result
    except (OSError, http.client.HTTPException, ValueError) as exc:  # ValueError: bad JSON in a chunk
        # urllib wraps a failed connection in URLError: name its cause (ConnectionRefusedError: ...).
        cause = exc.reason if isinstance(exc, URLError) and isinstance(exc.reason, BaseException) else exc
        result.error = f"{type(cause).__name__}: {cause}"
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


__all__ = [
    "RequestResult",
    "get_json",
    "healthy",
    "metrics_text",
    "post_json",
    "served_model",
    "stream_completion",
]
