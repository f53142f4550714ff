"""Adapter for nano-vllm's paged allocator (``nanovllm/engine/block_manager.py``), driven as its Scheduler does.

Install: ``pip install 'kvspec[nanovllm]'`` and ``pip install --no-deps nano-vllm-fork`` (the engine modules
need only xxhash and numpy; the package's ``__init__`` imports torch and is never run). Both API generations
of upstream nano-vllm are told apart by feature detection:

==================  =====================================================  =====================================
spec                generation 1 (``can_allocate -> bool``, PyPI fork)     generation 2 (``hash_blocks``)
==================  =====================================================  =====================================
admit / resume      ``can_allocate(seq)``, then ``allocate(seq)``, which   ``n = can_allocate(seq)`` (-1: refused),
                    hashes the prompt's full blocks itself                 ``allocate(seq, n)``, ``hash_blocks``
append(tokens)      the blocks needed checked once (free_block_ids), then  the same, with ``hash_blocks`` after
                    per token: ``append_token``, ``may_append``            each token is computed
release / preempt   ``deallocate(seq)``; a preempted Sequence keeps its tokens and is admitted again on resume;
                    declared misuse contract ``repeated``: ``deallocate`` called again on the freed Sequence
==================  =====================================================  =====================================

nano-vllm has no reset and no way to drop a request's cache on release: ``reset_cache`` is not among the ops
and ``release(keep=False)`` is declined. A block's key is its ``hash``; the index is ``hash_to_block_id``
less stale entries (a block freed and reused keeps its old entry in generation 1; the lookup's own
``token_ids`` guard misses on them unless the block holds the same tokens under another prefix, which shows
as a hit of the wrong block). Evictions are derived from successive observations (kvspec/adapter/toolkit.py).
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path
from typing import Any

from kvspec.adapter import (
    Capabilities,
    Config,
    Event,
    ObjectView,
    Observation,
    Op,
    Outcome,
    RequestState,
    RequestView,
    Semantics,
    append_atomically,
    blocks_for,
    derived_events,
    import_without_init,
)


class NanoVllmAdapter:
    """nano-vllm's BlockManager, with this adapter in the role of its Scheduler (check, then act)."""

    name = "nano-vllm"

    def __init__(self) -> None:
        self.bm_mod, self.seq_mod = import_without_init("nanovllm", "engine.block_manager", "engine.sequence")
        self.gen = 2 if hasattr(self.bm_mod.BlockManager, "hash_blocks") else 1
        semantics = Semantics(eviction="lru", hit_cap=self.gen == 2, duplicate_keys="newest", exact=True)
        self.capabilities = Capabilities(
            semantics=semantics,
            ops=frozenset({"admit", "append", "release", "preempt", "resume"}),
            declines=frozenset({"release_drop"}),
            checks_input=False,
            contracts=frozenset({"release:repeated", "preempt:repeated"}),
            version=f"{_version(self.bm_mod)} (API generation {self.gen})",
        )
        self.reset(Config())

    def reset(self, config: Config) -> None:
        self.seq_mod.Sequence.block_size = config.block_size  # a class attribute: every Sequence reads it
        self.bm = self.bm_mod.BlockManager(config.capacity, config.block_size)
        self.seqs: dict[str, Any] = {}
        self.prompt_len: dict[str, int] = {}
        self.preempted: set[str] = set()
        self._events: list[Event] = []

    def close(self) -> None:
        pass

    def apply(self, op: Op) -> Outcome:
        before, req, bs = self.observe(), op.req or "", self.bm.block_size
        if op.op == "admit":
            seq = self.seq_mod.Sequence(list(op.tokens), self.seq_mod.SamplingParams())  # required before 658520b
            self.seqs[req], self.prompt_len[req] = seq, len(op.tokens)
            outcome = self._allocate(req)
            if outcome.status != "ok":
                del self.seqs[req], self.prompt_len[req]
        elif op.op == "resume":
            outcome = self._allocate(req)
        elif op.op == "append":
            seq = self.seqs[req]
            need = blocks_for(len(seq) + len(op.tokens), bs) - len(seq.block_table)
            outcome = append_atomically(
                op.tokens,
                blocks_needed=need,
                free_blocks=len(self.bm.free_block_ids),
                append_one=lambda token: self._decode(seq, token),
            )
        else:  # release, preempt
            if req not in self.preempted:
                self.bm.deallocate(self.seqs[req])
            if op.contract == "repeated":  # the misuse contract: deallocate again; a freed Sequence frees nothing
                self.bm.deallocate(self.seqs[req])
            if op.op == "release":
                del self.seqs[req], self.prompt_len[req]
                self.preempted.discard(req)
            else:
                self.preempted.add(req)
            outcome = Outcome.ok()
        if outcome.status == "ok":
            seq = self.seqs.get(req)
            table = seq.block_table if seq is not None and op.op in ("admit", "resume", "append") else []
            held = len(before.requests[req].objects) if op.op == "append" else (outcome.hit_tokens or 0) // bs
            self._events += derived_events(before, self.observe(), table[held:])  # taken from the free pool
        return outcome

    def _allocate(self, req: str) -> Outcome:
        """The Scheduler's prefill: check, allocate, and (generation 2) hash the blocks once computed."""
        seq = self.seqs[req]
        if self.gen == 1:
            if not self.bm.can_allocate(seq):
                return Outcome.refused("can_allocate: not enough free blocks")
            self.bm.allocate(seq)
        else:
            cached = self.bm.can_allocate(seq)
            if cached == -1:
                return Outcome.refused("can_allocate: not enough free blocks")
            self.bm.allocate(seq, cached)
        hit_tokens = seq.num_cached_tokens
        if self.gen == 2:
            self._computed(seq, len(seq) - hit_tokens)
        self.preempted.discard(req)
        return Outcome.ok(hit_tokens)

    def _computed(self, seq: Any, tokens: int) -> None:
        """Generation 2's postprocess: the scheduled tokens were computed, their full blocks get hashed."""
        seq.num_scheduled_tokens = tokens
        self.bm.hash_blocks(seq)
        seq.num_cached_tokens += tokens
        seq.num_scheduled_tokens = 0

    def _decode(self, seq: Any, token: int) -> None:
        """One decode step of ``seq``: the token joins it, then may_append (and its hash once computed)."""
        seq.append_token(token)
        self.bm.may_append(seq)
        if self.gen == 2:
            self._computed(seq, 1)

    def events(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def observe(self) -> Observation:
        bm, bs = self.bm, self.bm.block_size
        tokens: dict[int, int] = {}
        requests = {}
        for req, seq in self.seqs.items():
            table = () if req in self.preempted else tuple(seq.block_table)
            for i, bid in enumerate(table):
                tokens[bid] = max(tokens.get(bid, 0), min(bs, len(seq) - i * bs))
            state: RequestState = "preempted" if req in self.preempted else "running"
            requests[req] = RequestView(req, tuple(seq.token_ids), self.prompt_len[req], table, state)
        objects = {
            b.block_id: ObjectView(
                b.block_id, 1, tokens.get(b.block_id, len(b.token_ids)), b.ref_count, None if b.hash == -1 else b.hash
            )
            for b in bm.blocks
            if b.ref_count or b.hash != -1
        }
        index = {h: (bid,) for h, bid in bm.hash_to_block_id.items() if bm.blocks[bid].hash == h}
        free = sum(1 for bid in bm.free_block_ids if bm.blocks[bid].hash == -1)  # cached free blocks are objects
        return Observation(len(bm.blocks), free, objects, requests, index)


def _version(module: Any) -> str:
    """The PyPI distribution the allocator module came from, else the source tree it was found in."""
    here = Path(module.__file__).resolve()
    try:
        dist = metadata.distribution("nano-vllm-fork")
        if Path(str(dist.locate_file("nanovllm/engine/block_manager.py"))).resolve() == here:
            return f"nano-vllm-fork {dist.version}"
    except metadata.PackageNotFoundError:
        pass
    return f"nano-vllm source {here.parents[2]}"
