"""A tiny fake serving engine over HTTP, with a real prefix cache, for the live-adapter protocol tests.

A pool of ``num_blocks`` blocks of ``block_size`` tokens. A full block is keyed by a hash chained over
its parent's hash and its own tokens (:func:`block_hash`). Unreferenced blocks sit in an LRU free queue
(a request's blocks join its tail, tail blocks first, as vLLM frees them); allocation pops the head and
evicts the cached block it holds. A completion is one step under a lock (exact mode: one request at a
time): it looks up the longest cached prefix of whole prompt blocks (capped so one prompt token is
computed), takes the hit blocks, allocates the rest, caches its full computed blocks (prompt plus all
output but the last token) whose hash is not already cached, releases everything and answers with the
cached tokens it really reused. Each step publishes one batch of KV events (BlockRemoved, BlockStored,
AllBlocksCleared) that ``GET /events?since=N`` lists.

Endpoints: ``POST /v1/completions`` ({prompt, max_tokens}), ``POST /reset_prefix_cache``, ``GET /info``
(the cache's shape), ``GET /metrics`` (usage and preemption gauges), ``GET /events?since=N``.

``forget_hits=True`` is a bug: the lookup of a prompt longer than two blocks ignores the cache index, so the
request recomputes (and reports 0 cached tokens for) a prefix that is cached.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

ROOT = "root"  # the chain state of the empty prefix (the first block's parent)
VERSION = "fake-0.1"


def block_hash(parent: str, tokens: Sequence[int]) -> str:
    """The published hash of a block after ``parent``'s hash (``ROOT`` for the first block)."""
    return hashlib.sha256(f"{parent}|{','.join(map(str, tokens))}".encode()).hexdigest()[:16]


class FakeEngine:
    """The prefix cache and its event log; every public method holds the lock (one step at a time)."""

    def __init__(self, num_blocks: int, block_size: int, max_model_len: int, vocab_size: int, forget_hits: bool):
        if num_blocks * block_size < max_model_len:
            raise ValueError("the pool must hold one request of max_model_len tokens")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.max_model_len, self.vocab_size = max_model_len, vocab_size
        self.forget_hits = forget_hits
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # head: evicted first
        self.refs = [0] * num_blocks
        self.hash_of: dict[int, str] = {}  # cached block -> its hash
        self.index: dict[str, int] = {}  # hash -> the cached block holding it
        self.batches: list[dict[str, Any]] = []
        self.lock = threading.Lock()

    def _publish(self, events: list[dict[str, Any]]) -> None:
        if events:
            self.batches.append({"seq": len(self.batches), "ts": time.time(), "events": events})

    def _chain(self, tokens: Sequence[int]) -> list[str]:
        bs, parent, hashes = self.block_size, ROOT, []
        for start in range(0, len(tokens) - bs + 1, bs):
            parent = block_hash(parent, tokens[start : start + bs])
            hashes.append(parent)
        return hashes

    def complete(self, prompt: list[int], max_tokens: int) -> tuple[list[int], int]:
        """Run one request to completion: its output tokens and the prompt tokens it took from the cache."""
        bs = self.block_size
        if not prompt or max_tokens < 1 or len(prompt) + max_tokens > self.max_model_len:
            raise ValueError(f"{len(prompt)} prompt + {max_tokens} new tokens do not fit {self.max_model_len}")
        seed = int(hashlib.sha256(repr(prompt).encode()).hexdigest()[:8], 16)
        output = [3 + (seed + 7919 * i) % (self.vocab_size - 3) for i in range(max_tokens)]
        with self.lock:
            hashes = self._chain(prompt + output[:-1])  # the KV of the last sampled token is never computed
            hits: list[int] = []
            if not (self.forget_hits and len(prompt) > 2 * bs):
                for key in hashes[: (len(prompt) - 1) // bs]:
                    if key not in self.index:
                        break
                    hits.append(self.index[key])
            need = -(-(len(prompt) + max_tokens) // bs) - len(hits)
            if need > len(self.free) - sum(1 for b in hits if b in self.free):
                raise ValueError("the pool is too small for this request")
            for b in hits:
                self.refs[b] += 1
                self.free.pop(b, None)
            events: list[dict[str, Any]] = []
            removed, table = [], list(hits)
            for _ in range(need):
                b, _ = self.free.popitem(last=False)
                if b in self.hash_of:
                    removed.append(self.hash_of.pop(b))
                    del self.index[removed[-1]]
                self.refs[b] = 1
                table.append(b)
            if removed:
                events.append({"type": "BlockRemoved", "block_hashes": removed})
            for i in range(len(hits), len(hashes)):
                if hashes[i] in self.index:  # cached in another block: this copy stays uncached
                    continue
                self.index[hashes[i]], self.hash_of[table[i]] = table[i], hashes[i]
                tokens = (prompt + output)[i * bs : (i + 1) * bs]
                parent = hashes[i - 1] if i else None
                events.append(
                    {
                        "type": "BlockStored",
                        "block_hashes": [hashes[i]],
                        "parent_block_hash": parent,
                        "token_ids": tokens,
                    }
                )
            for b in reversed(table):  # released: the request's tail blocks are evicted first
                self.refs[b] -= 1
                if self.refs[b] == 0:
                    self.free[b] = None
            self._publish(events)
        return output, len(hits) * bs

    def reset(self) -> bool:
        """Empty the prefix cache; refused while a block is referenced."""
        with self.lock:
            if any(self.refs):
                return False
            self.index.clear()
            self.hash_of.clear()
            self._publish([{"type": "AllBlocksCleared"}])
            return True

    def metrics(self) -> dict[str, float]:
        with self.lock:
            used = sum(1 for r in self.refs if r)
            return {"kv_cache_usage_perc": used / self.num_blocks, "num_preemptions_total": 0.0}

    def info(self) -> dict[str, Any]:
        keys = ("num_blocks", "block_size", "max_model_len", "vocab_size")
        return {"version": VERSION, "can_reset": True, **{k: getattr(self, k) for k in keys}}

    def events(self, since: int) -> list[dict[str, Any]]:
        with self.lock:
            return self.batches[since:]


class FakeServer:
    """:class:`FakeEngine` behind a threaded HTTP server on 127.0.0.1 (an ephemeral port)."""

    def __init__(
        self,
        num_blocks: int = 64,
        block_size: int = 16,
        max_model_len: int = 512,
        vocab_size: int = 1000,
        *,
        forget_hits: bool = False,
    ) -> None:
        self.engine = FakeEngine(num_blocks, block_size, max_model_len, vocab_size, forget_hits)
        engine = self.engine

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self, code: int, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                url = urlparse(self.path)
                if url.path == "/events":
                    since = int(parse_qs(url.query).get("since", ["0"])[0])
                    self._answer(200, {"batches": engine.events(since)})
                elif url.path in ("/info", "/metrics"):
                    self._answer(200, engine.info() if url.path == "/info" else engine.metrics())
                else:
                    self._answer(404, {"error": url.path})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if self.path == "/reset_prefix_cache":
                    self._answer(200, {"success": engine.reset()})
                elif self.path != "/v1/completions":
                    self._answer(404, {"error": self.path})
                else:
                    try:
                        output, cached = engine.complete([int(t) for t in body["prompt"]], int(body["max_tokens"]))
                    except (KeyError, TypeError, ValueError) as exc:
                        self._answer(400, {"error": str(exc)})
                        return
                    usage = {"prompt_tokens": len(body["prompt"]), "prompt_tokens_details": {"cached_tokens": cached}}
                    self._answer(200, {"choices": [{"token_ids": output}], "usage": usage})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="fake-live-server", daemon=True)

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> str:
        self.thread.start()
        return self.url

    def stop(self) -> None:
        if self.thread.is_alive():
            self.httpd.shutdown()
            self.thread.join(timeout=5)
        self.httpd.server_close()
