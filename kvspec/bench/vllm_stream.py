"""A synthetic, hash-consistent vLLM KV event stream, written as the live adapter records one.

The stream is what a vLLM server with prefix caching publishes under a steady load: one batch per
engine step, ``{"seq", "ts", "events", "dp_rank"}``, events shaped as vLLM 0.32's ``BlockStored``,
``BlockRemoved`` and ``AllBlocksCleared`` (the fields of tests/data/vllm_live_cpu.jsonl, recorded
from a real server), after a ``config`` record naming the pool. It is hash-consistent: every
published hash is vLLM's sha256 recipe over the parent's digest and the block's tokens
(adapters/vllm_live/hashing.py), so ``kvspec trace check --format vllm-events`` judges every
``hash_chain_agrees`` on it, and every stream invariant holds.

The engine modelled (the invariant the generator keeps): a pool of ``blocks`` usable blocks, a
cache index of at most that many hashes in LRU order (vLLM's free queue). A request hits the
longest cached prefix of its prompt (one prompt token always computed), stores the rest of its
prompt's full blocks in one BlockStored, then one block per decode event; before a store, the
least recently used blocks no running request holds are evicted, one BlockRemoved each. Prompts
share prefixes (a few system prompts, multi-turn sessions that extend their last turn), so hits,
evictions and re-stores of an evicted hash all happen. A preemption frees a running request's
blocks to the front of the LRU order (its last block first), pressure evicts some, and the
request recomputes them; a reset publishes AllBlocksCleared while nothing runs.

Memory is that of the live index (at most ``blocks`` entries), whatever ``events`` is.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from kvspec.adapters.vllm_live.hashing import DEFAULT_NONE_HASH_SEED, external, sha256_pickle

VOCAB = 32_000


@dataclass
class StreamShape:
    """The stream asked for: pool, length, and how often the rare events come."""

    blocks: int = 65_536
    events: int = 10_000_000
    block_size: int = 16
    seed: int = 0
    events_per_batch: int = 16  # about one engine step's worth of stores and evictions
    preempt_every: int = 50  # requests
    reset_every: int = 2_000_000  # events
    systems: int = 32  # shared system prompts
    sessions: int = 4_096  # multi-turn sessions


@dataclass
class _Request:
    keys: list[int] = field(default_factory=list)  # the published hash of each of its blocks, in order
    tokens: list[tuple[int, ...]] = field(default_factory=list)  # each block's tokens


class Engine:
    """The cache index of one vLLM server: hash -> (digest, tokens), in LRU order, at most ``blocks``."""

    def __init__(self, shape: StreamShape) -> None:
        self.shape = shape
        self.rng = random.Random(shape.seed)
        self.none_hash = sha256_pickle(DEFAULT_NONE_HASH_SEED)
        self.cached: OrderedDict[int, bytes] = OrderedDict()  # published hash -> full digest, LRU first
        self.children: dict[tuple[int | None, tuple[int, ...]], int] = {}  # (parent, tokens) -> hash
        self.parent_of: dict[int, tuple[int | None, tuple[int, ...]]] = {}
        self.pending: list[dict[str, Any]] = []
        self.held: set[int] = set()
        self.counts = {"stored": 0, "removed": 0, "cleared": 0, "preempted": 0, "requests": 0, "hits": 0}
        self.systems = [self._tokens(self.rng.randrange(2, 9) * shape.block_size) for _ in range(shape.systems)]
        self.sessions: list[tuple[int, ...]] = [() for _ in range(shape.sessions)]

    def _tokens(self, n: int) -> tuple[int, ...]:
        return tuple(self.rng.randrange(VOCAB) for _ in range(n))

    # -- the index -------------------------------------------------------------------

    def _digest(self, parent: int | None, tokens: tuple[int, ...]) -> tuple[int, bytes]:
        base = self.none_hash if parent is None else self.cached[parent]
        digest = sha256_pickle((base, tokens, None))
        return external(digest), digest

    def _evict(self, n: int) -> None:
        """Make room for ``n`` blocks: remove the least recently used unheld hashes, one event each."""
        over = len(self.cached) + n - self.shape.blocks
        if over <= 0:
            return
        victims = []
        for key in self.cached:
            if key not in self.held:
                victims.append(key)
                if len(victims) == over:
                    break
        for key in victims:
            del self.cached[key]
            self.children.pop(self.parent_of.pop(key), None)
            self.pending.append({"type": "BlockRemoved", "block_hashes": [key], "medium": "GPU", "group_idx": 0})
            self.counts["removed"] += 1

    def _store(self, request: _Request, blocks: list[tuple[int, ...]]) -> None:
        """Store ``blocks`` after the request's last block: one BlockStored event."""
        blocks = blocks[: max(0, self.shape.blocks - len(self.held))]  # a request never outgrows the pool
        if not blocks:
            return
        self._evict(len(blocks))
        parent = request.keys[-1] if request.keys else None
        first_parent, keys = parent, []
        for tokens in blocks:
            key, digest = self._digest(parent, tokens)
            self.cached[key] = digest
            self.children[(parent, tokens)] = key
            self.parent_of[key] = (parent, tokens)
            self.held.add(key)
            request.keys.append(key)
            request.tokens.append(tokens)
            keys.append(key)
            parent = key
        flat = [t for tokens in blocks for t in tokens]
        self.pending.append(
            {
                "type": "BlockStored",
                "block_hashes": keys,
                "parent_block_hash": first_parent,
                "token_ids": flat,
                "block_size": self.shape.block_size,
                "lora_id": None,
                "medium": "GPU",
                "lora_name": None,
                "extra_keys": [None] * len(keys),
                "group_idx": 0,
                "kv_cache_spec_kind": "full_attention",
            }
        )
        self.counts["stored"] += len(keys)

    def _admit(self, prompt: tuple[int, ...]) -> _Request:
        """Hit the longest cached prefix (one token computed), store the remaining full blocks."""
        bs, request = self.shape.block_size, _Request()
        whole = [prompt[i : i + bs] for i in range(0, len(prompt) - bs + 1, bs)]
        limit = (len(prompt) - 1) // bs
        parent: int | None = None
        for tokens in whole[:limit]:
            key = self.children.get((parent, tokens))
            if key is None:
                break
            self.cached.move_to_end(key)
            self.held.add(key)
            request.keys.append(key)
            request.tokens.append(tokens)
            parent = key
        self.counts["hits"] += len(request.keys)
        self._store(request, whole[len(request.keys) :])
        return request

    def _release(self, request: _Request, *, preempted: bool = False) -> None:
        """Free a request's blocks: to the LRU tail when it finished, to the head (last block first) if preempted."""
        for key in request.keys:
            self.held.discard(key)
        if preempted:
            for key in request.keys:
                if key in self.cached:
                    self.cached.move_to_end(key, last=False)

    def run(self) -> Iterator[list[dict[str, Any]]]:
        """Events in engine steps of about ``events_per_batch``, until ``events`` were published."""
        shape, rng, bs = self.shape, self.rng, self.shape.block_size
        published = 0
        next_reset = shape.reset_every
        while published < shape.events:
            self.counts["requests"] += 1
            session = rng.randrange(shape.sessions)
            history = self.sessions[session]
            if not history or rng.random() < 0.3 or len(history) > 64 * bs:
                history = self.systems[rng.randrange(len(self.systems))]
            prompt = history + self._tokens(rng.randrange(1, 6 * bs))
            request = self._admit(prompt)
            output = self._tokens(rng.randrange(bs, 6 * bs))
            full = prompt + output
            done = len(request.keys) * bs
            for end in range(done + bs, len(full) + 1, bs):  # decode: one block each time one fills
                self._store(request, [full[end - bs : end]])
            if self.counts["requests"] % shape.preempt_every == 0 and len(request.keys) > 1:
                self.counts["preempted"] += 1
                self._release(request, preempted=True)
                # Pressure takes its last blocks (a suffix: they lead the LRU order), then it recomputes them.
                self._evict(rng.randrange(1, len(request.keys)) + shape.blocks - len(self.cached))
                self._admit(full[: len(request.keys) * bs + 1])  # recompute what was evicted
                self.held.clear()
            else:
                self._release(request)
            self.sessions[session] = full
            self.held.clear()
            if published + len(self.pending) >= next_reset:
                self.pending.append({"type": "AllBlocksCleared"})
                self.counts["cleared"] += 1
                self.cached.clear()
                self.children.clear()
                self.parent_of.clear()
                next_reset += shape.reset_every
            while len(self.pending) >= shape.events_per_batch or (
                self.pending and published + len(self.pending) >= shape.events
            ):
                batch, self.pending = self.pending[: shape.events_per_batch], self.pending[shape.events_per_batch :]
                batch = batch[: shape.events - published]
                published += len(batch)
                yield batch
                if published >= shape.events:
                    return


def write_stream(out: BinaryIO, shape: StreamShape) -> dict[str, Any]:
    """Write the config record and every batch as JSON lines (msgspec's encoder); what was written."""
    import msgspec

    encode = msgspec.json.Encoder().encode
    engine = Engine(shape)
    config = {
        "block_size": shape.block_size,
        "num_gpu_blocks": shape.blocks + 1,  # vLLM keeps one null block
        "hash_algo": "sha256",
        "none_hash_seed": DEFAULT_NONE_HASH_SEED,
        "vllm": "synthetic (kvspec.bench.vllm_stream)",
        "initial_cache": "empty",
    }
    out.write(encode({"config": config}) + b"\n")
    batches = events = 0
    ts = 1_800_000_000.0
    for seq, batch in enumerate(engine.run()):
        ts += 0.001
        out.write(encode({"seq": seq, "ts": ts, "events": batch, "dp_rank": 0}) + b"\n")
        batches, events = batches + 1, events + len(batch)
    return {"batches": batches, "events": events, **engine.counts, "blocks": shape.blocks}


def generate(path: Path, shape: StreamShape) -> dict[str, Any]:
    """Write the stream to ``path``; the counts of what it holds."""
    with path.open("wb") as out:
        return write_stream(out, shape)
