"""A live adapter for the fake engine of :mod:`fake_live_server`, written against ``kvspec.adapter`` alone.

It implements the :class:`kvspec.adapter.LiveAdapter` protocol the way a user would for another server:
completions in, KV events out, every completion, reset, gauge reading and event batch recorded in the order
the client saw it (the record shapes of the vLLM live adapter's log), and judged by the spec's stream checks
(:class:`kvspec.adapter.StreamCheck`) with the engine's hash recipe.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import threading
import time
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any, TextIO
from urllib.request import Request, urlopen

from fake_live_server import ROOT, FakeServer, block_hash

from kvspec.adapter import (
    Capabilities,
    MetricSnapshot,
    Recorder,
    RequestRecord,
    Semantics,
    ServerInfo,
    ServerStartError,
    StreamCheck,
    StreamResult,
)


def _call(url: str, path: str, body: object | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = Request(url + path, data=data, headers={"Content-Type": "application/json"})
    with urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


class FakeHashChain:
    """The engine's block hash as the stream checks' recipe (``HashChain``): a block's state is its hash."""

    def root(self) -> Any:
        return ROOT

    def chain(self, parent: Any, blocks: Sequence[tuple[int, ...]]) -> Sequence[tuple[Hashable, Any]]:
        out = []
        for tokens in blocks:
            parent = block_hash(parent, tokens)
            out.append((parent, parent))
        return out


class FakeLiveAdapter:
    """Drives one :class:`FakeServer` (started here, or attached at ``configure(url=...)``)."""

    name = "fake-live"
    capabilities = Capabilities(
        semantics=Semantics(granularity="block", eviction="lru", exact=False),
        ops=frozenset({"admit", "reset_cache"}),
        live=True,
    )

    def __init__(self, *, num_blocks: int = 64, block_size: int = 16, forget_hits: bool = False) -> None:
        self._shape = {"num_blocks": num_blocks, "block_size": block_size}
        self._forget_hits = forget_hits
        self._url: str | None = None
        self._record_path: Path | None = None
        self._sink: TextIO | None = None
        self.server: FakeServer | None = None
        self.startup_s: float | None = None
        self._recorder = Recorder()
        self._lock = threading.RLock()  # the event cursor: complete_many calls from threads
        self._next_seq = 0
        self._gaps: list[tuple[int, int]] = []
        self._ids = itertools.count(1)
        self._info: dict[str, Any] = {}

    def configure(
        self,
        *,
        url: str | None = None,
        events: str | None = None,
        replay: str | None = None,
        record: Path | None = None,
    ) -> None:
        """``url``: attach to a running fake server; its events are always ``GET /events`` (``events`` and
        ``replay`` name other transports, which it has none of)."""
        self._url, self._record_path = url, record

    def start(self) -> ServerInfo:
        if self._record_path is not None:
            self._record_path.parent.mkdir(parents=True, exist_ok=True)
            self._sink = self._record_path.open("w")
            self._recorder = Recorder(self._sink)
        t0 = time.perf_counter()
        if self._url is None:
            self.server = FakeServer(**self._shape, forget_hits=self._forget_hits)
            self._url = self.server.start()
        try:
            self._info = _call(self.url, "/info")
        except OSError as exc:
            raise ServerStartError(f"no fake server at {self._url}: {exc}") from exc
        if self.server is not None:
            self.startup_s = round(time.perf_counter() - t0, 3)
        else:  # attached: what it cached before is not known; follow its events from now on
            self._next_seq = len(_call(self.url, "/events?since=0")["batches"])
        info = self._info
        self._add({"config": {**info, "initial_cache": "empty" if self.server is not None else "unknown"}})
        self.snapshot(idle=True)
        return ServerInfo(
            can_reset=bool(info["can_reset"]),
            has_events=True,
            block_size=int(info["block_size"]),
            num_gpu_blocks=int(info["num_blocks"]),
            max_model_len=int(info["max_model_len"]),
            vocab_size=int(info["vocab_size"]),
            version=str(info["version"]),
        )

    @property
    def url(self) -> str:
        if self._url is None:
            raise RuntimeError("the adapter is not started")
        return self._url

    def _add(self, record: dict[str, Any]) -> None:
        self._recorder.add(record)

    def _poll(self) -> None:
        """Record the batches published since the last poll, in seq order; a seq jump is a gap."""
        with self._lock:
            batches = _call(self.url, f"/events?since={self._next_seq}")["batches"]
            for batch in batches:
                if batch["seq"] > self._next_seq:
                    self._gaps.append((self._next_seq, batch["seq"]))
                self._next_seq = batch["seq"] + 1
                self._add(batch)

    def complete(self, prompt: Sequence[int], max_tokens: int, *, mode: str = "exact") -> dict[str, Any]:
        started = time.time()
        reply = _call(self.url, "/v1/completions", {"prompt": list(prompt), "max_tokens": max_tokens})
        finished = time.time()
        record = {
            "id": f"{mode}-{next(self._ids)}",
            "prompt_token_ids": list(prompt),
            "output_token_ids": reply["choices"][0]["token_ids"],
            "cached_tokens": reply["usage"]["prompt_tokens_details"]["cached_tokens"],
            "started": started,
            "finished": finished,
            "mode": mode,
        }
        if mode == "exact":
            record["preempted"] = False  # alone, and it fits the pool
        self._add({"request": record})
        self._poll()
        return record

    def complete_many(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[dict[str, Any]]:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(prompts))) as pool:
            futures = [pool.submit(self.complete, p, max_tokens, mode="load") for p in prompts]
            return [f.result() for f in futures]

    def reset_cache(self) -> bool:
        success = bool(_call(self.url, "/reset_prefix_cache", {})["success"])
        self._add({"reset": {"ts": time.time(), "success": success}})
        self._poll()
        return success

    def snapshot(self, idle: bool) -> MetricSnapshot:
        ts = time.time()
        gauges = _call(self.url, "/metrics")
        self._add({"metrics": {"ts": ts, "idle": idle, **gauges}})
        return MetricSnapshot.from_json({"ts": ts, "idle": idle, **gauges})

    def preemptions_total(self) -> float | None:
        return self.snapshot(idle=True).preemptions

    def settle(self) -> None:
        """The engine publishes a step's batch before it answers: one poll gets every batch."""
        self._poll()

    def records(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._recorder.records)

    def check(self) -> StreamResult:
        records = self.records()
        config: dict[str, Any] = {}
        for r in records:
            config.update(r.get("config", {}))
        check = StreamCheck(
            [RequestRecord.from_json(r["request"]) for r in records if "request" in r],
            [MetricSnapshot.from_json(r["metrics"]) for r in records if "metrics" in r],
            block_size=int(config["block_size"]),
            usable_blocks=int(config["num_blocks"]),
            published_hash=FakeHashChain(),
            resets=[r["reset"]["ts"] for r in records if "reset" in r and r["reset"]["success"]],
            gaps=self.gaps,
            initial_known=config.get("initial_cache") == "empty",
        )
        for r in records:
            if "seq" in r:
                check.batch(r)
        return check.close()

    @property
    def gaps(self) -> list[tuple[int, int]]:
        return list(self._gaps)

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None
        if self._sink is not None:
            self._sink.close()
            self._sink = None
