"""The ``vllm-live`` adapter: spec requests become completions on a running vLLM server.

A black box has no block ids and no ref counts, and one completion is admit, decode and release
in one: so this adapter does not implement the ledger harness's ``apply``/``observe``. It is a
*live* adapter (``Capabilities.live``, :class:`kvspec.adapter.LiveAdapter`): it sends token-id prompts
with a fixed number of generated tokens (``ignore_eos``), sequentially (exact mode) or concurrently
(load mode), and records what the outside shows - the KV event batches, each request's
``cached_tokens`` and output tokens, the gauges of /metrics, the resets - as the records of
:mod:`.recorded`. The checks are the spec's (:mod:`kvspec.spec.stream`), run over those records
by :func:`.recorded.check_recorded`.

It starts the kit's :class:`.server.TinyServer` unless :meth:`configure` gave it a ``url`` (then ``events`` and
``replay`` name the server's ZMQ endpoints, if it publishes any).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO
from urllib.error import HTTPError

from kvspec.adapter import Capabilities, Recorder, Semantics, ServerInfo, StreamResult

from .client import get_json, post_json
from .events import EventSubscriber
from .hashing import DEFAULT_NONE_HASH_SEED
from .metrics import PREEMPTIONS, Metrics, read_metrics
from .recorded import check_recorded
from .server import Endpoints, ServerConfig, TinyServer, attach

REQUEST_TIMEOUT_S = 300.0


class LiveError(RuntimeError):
    """The server answered something the adapter cannot use (not a verdict: the check cannot run)."""


class VllmLiveAdapter:
    """Drives one vLLM server through completions requests and records what it shows."""

    name = "vllm-live"
    capabilities = Capabilities(
        semantics=Semantics(granularity="block", eviction="lru", exact=False),
        ops=frozenset({"admit", "reset_cache"}),
        live=True,
    )

    def __init__(
        self, *, server_config: ServerConfig | None = None, none_hash_seed: str = DEFAULT_NONE_HASH_SEED
    ) -> None:
        self._url: str | None = None
        self._events: str | None = None
        self._replay: str | None = None
        self._record_path: Path | None = None
        self._server_config = server_config or ServerConfig()
        self._none_hash_seed = none_hash_seed
        self.server: TinyServer | None = None
        self.endpoints: Endpoints | None = None
        self.subscriber: EventSubscriber | None = None
        self._sink: TextIO | None = None
        self.recorder = Recorder()
        self.server_info: ServerInfo | None = None
        self.startup_s: float | None = None
        self._ids = itertools.count(1)

    # -- lifecycle --------------------------------------------------------------------

    def configure(
        self,
        *,
        url: str | None = None,
        events: str | None = None,
        replay: str | None = None,
        record: Path | None = None,
    ) -> None:
        """Point the adapter at a running server (``url``; None: start the tiny one) before :meth:`start`."""
        self._url, self._events, self._replay, self._record_path = url, events, replay, record

    def start(self) -> ServerInfo:
        """Start the tiny server (or attach to ``url``), subscribe to its events, read its cache shape."""
        if self._record_path is not None:
            self._record_path.parent.mkdir(parents=True, exist_ok=True)
            self._sink = self._record_path.open("w")
            self.recorder = Recorder(self._sink)
        if self._url is None:
            self.server = TinyServer(self._server_config)
            self.endpoints = self.server.start()
            self.startup_s = self.server.startup_s
        else:
            self.endpoints = attach(self._url, self._events, self._replay)
        ep = self.endpoints
        if ep.events is not None:
            own = self.server is not None  # our server: expect seq 0 first, replay what a late join missed
            self.subscriber = EventSubscriber(
                ep.events,
                ep.replay,
                topic=ep.topic if own else "",
                start_seq=0 if own else None,
                on_batch=self.recorder.add,
                on_gap=lambda first, stop: self.recorder.add({"gap": {"from": first, "to": stop}}),
            ).start()
        metrics = read_metrics(ep.url)
        block_size = metrics.block_size
        if block_size is None:
            raise LiveError("vllm:cache_config_info gives no block_size: is this a vLLM server?")
        models = get_json(ep.url, "/v1/models")["data"]
        max_model_len = int(models[0].get("max_model_len") or self._server_config.max_model_len)
        vocab = int(self.server.model_config["vocab_size"]) if self.server else 1024
        self.server_info = ServerInfo(
            can_reset=self._probe_reset(),
            has_events=self.subscriber is not None,
            block_size=block_size,
            num_gpu_blocks=metrics.num_gpu_blocks,
            max_model_len=max_model_len,
            vocab_size=vocab,
            version=self._version(),
        )
        self.recorder.add(
            {
                "config": {
                    "block_size": block_size,
                    "num_gpu_blocks": metrics.num_gpu_blocks,
                    "hash_algo": metrics.hash_algo,
                    "none_hash_seed": self._none_hash_seed,
                    "url": ep.url,
                    "events": ep.events,
                    "vllm": self.server_info.version,
                    "startup_s": self.startup_s,
                    # Followed from its start (our server): nothing unseen is cached. Else the reset probe, if the
                    # server has the endpoint, makes the index known from its moment on.
                    "initial_cache": "empty" if self.server is not None else "unknown",
                }
            }
        )
        self.snapshot(idle=True)
        return self.server_info

    def close(self) -> None:
        """Stop the subscriber and the server (if the kit started it); close the record file."""
        if self.subscriber is not None:
            self.subscriber.close()
            self.subscriber = None
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self._sink is not None:
            self._sink.close()
            self._sink = None

    def __enter__(self) -> VllmLiveAdapter:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- HTTP ----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        if self.endpoints is None:
            raise LiveError("the adapter is not started")
        return self.endpoints.url

    def _version(self) -> str:
        try:
            return str(get_json(self.url, "/version").get("version", ""))
        except (OSError, ValueError):  # OSError: urllib's URLError among them
            return ""

    def _probe_reset(self) -> bool:
        """Whether POST /reset_prefix_cache exists (the server runs with VLLM_SERVER_DEV_MODE=1)."""
        try:
            return self.reset_cache()
        except HTTPError:
            return False

    # -- what the runner drives -------------------------------------------------------

    def complete(self, prompt: Sequence[int], max_tokens: int, *, mode: str = "exact") -> dict[str, Any]:
        """One completion of ``prompt`` (token ids) generating exactly ``max_tokens``; its request record."""
        rid = f"{mode}-{next(self._ids)}"
        body = {
            "model": self.endpoints.model if self.endpoints else "",
            "prompt": list(prompt),
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
            "return_token_ids": True,
        }
        started = time.time()
        reply = post_json(self.url, "/v1/completions", body, timeout=REQUEST_TIMEOUT_S)
        finished = time.time()
        choice = reply["choices"][0]
        details = (reply.get("usage") or {}).get("prompt_tokens_details") or {}
        output = choice.get("token_ids")
        record = {
            "id": rid,
            "prompt_token_ids": list(prompt),
            "output_token_ids": None if output is None else list(output),
            "cached_tokens": details.get("cached_tokens"),
            "started": started,
            "finished": finished,
            "mode": mode,
        }
        if mode == "exact":
            record["preempted"] = False  # alone, and it fits the pool: nothing can preempt it
        self.recorder.add({"request": record})
        return record

    def complete_many(
        self, prompts: Sequence[Sequence[int]], max_tokens: int, *, concurrency: int | None = None
    ) -> list[dict[str, Any]]:
        """Send ``prompts`` at once (load mode) from ``concurrency`` threads; their request records."""
        workers = concurrency or len(prompts)
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kvspec-live") as pool:
            futures = [pool.submit(self.complete, p, max_tokens, mode="load") for p in prompts]
            return [f.result() for f in futures]

    def reset_cache(self) -> bool:
        """POST /reset_prefix_cache; recorded; True when the server emptied its prefix cache."""
        reply = post_json(self.url, "/reset_prefix_cache", timeout=REQUEST_TIMEOUT_S)
        success = bool(reply.get("success", True)) if isinstance(reply, dict) else True
        self.recorder.add({"reset": {"ts": time.time(), "success": success}})
        return success

    def snapshot(self, idle: bool) -> Metrics:
        """Read /metrics and record the gauges (``idle``: nothing is in flight now)."""
        ts = time.time()
        metrics = read_metrics(self.url)
        self.recorder.add({"metrics": metrics.snapshot(ts, idle)})
        return metrics

    def preemptions_total(self) -> float | None:
        """``vllm:num_preemptions_total`` now; the gauges recorded as an idle snapshot."""
        return self.snapshot(idle=True).get(PREEMPTIONS)

    def records(self) -> list[dict[str, Any]]:
        """Everything recorded so far, in order."""
        return list(self.recorder.records)

    def settle(self, quiet_s: float = 0.3) -> None:
        """Wait until the event stream has been quiet for ``quiet_s`` (every step's batch is in)."""
        if self.subscriber is not None:
            self.subscriber.wait_quiet(quiet_s)

    def check(self) -> StreamResult:
        """Run the stream checks over everything recorded so far."""
        return check_recorded(list(self.recorder.records))

    @property
    def gaps(self) -> list[tuple[int, int]]:
        return list(self.subscriber.gaps) if self.subscriber else []
