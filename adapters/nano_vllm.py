"""Adapter for nano-vllm's paged allocator (``nanovllm/engine/block_manager.py``), driven as its Scheduler does.

Install: ``pip install 'kvspec[nanovllm]'`` and ``pip install --no-deps nano-vllm-fork`` (the engine modules
need only xxhash and numpy; the package's ``__init__`` imports torch and is never run). Both API generations
of upstream nano-vllm are told apart by feature detection:

==================  =====================================================  =====================================
spec                generation 1 (``can_allocate -> bool``, PyPI fork)     generation 2 (``hash_blocks``)
==================  =====================================================  =====================================
admit / resume      ``can_allocate(seq)``, then ``allocate(seq)``, which   ``n = can_allocate(seq)`` (-1: refused),
                    hashes the prompt's full blocks itself; contract       ``allocate(seq, n)``, ``hash_blocks``;
                    ``unchecked``: ``allocate(seq)`` alone (raising:       no ``unchecked`` (``allocate`` takes
                    refused, the blocks it took left to the checks)        ``can_allocate``'s count)
append(tokens)      the blocks needed checked once (free_block_ids), then  the same, with ``hash_blocks`` after
                    per token: ``append_token``, ``may_append``            each token is computed
release / preempt   ``deallocate(seq)``; a preempted Sequence keeps its tokens and is admitted again on resume;
                    contracts ``repeated`` (``deallocate`` again on the freed Sequence) and, on release,
                    ``never_admitted`` (first ``deallocate`` of a never-allocated Sequence of the same tokens)
index               ``hash_to_block_id`` as it is, every entry: generation 1 leaves a reused block's old entry
                    (upstream up to 8d63a98; the fork drops a freed block's), and a stale entry is shown
==================  =====================================================  =====================================

The misuse contracts (``Capabilities.contracts``) are judged as the plain op: ``admit:unchecked`` must end as
the checked admit would (a refusal changes nothing), the repeated and never-admitted frees must free nothing
more than the release. nano-vllm has no reset and no way to drop a request's cache on release:
``reset_cache`` is not among the ops and ``release(keep=False)`` is declined. A block's key is its ``hash``.
The index is never filtered to what a lookup can hit (the adapter contract): the lookup's own ``token_ids``
guard misses on a stale entry unless the reused block holds the same tokens under another prefix, which is a
hit of the wrong block, so every entry is shown and cache_index_consistency reports one that names a block
not cached under its key. Evictions are derived from successive observations (kvspec/adapter/toolkit.py).
"""

from __future__ import annotations

from collections.abc import Sequence
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

CONTRACTS = frozenset({"release:repeated", "preempt:repeated", "release:never_admitted"})
"""Both API generations' misuse contracts: ``deallocate`` again on a freed Sequence, and on one never allocated."""
UNCHECKED = frozenset({"admit:unchecked", "resume:unchecked"})
"""Generation 1's: ``allocate(seq)`` with no ``can_allocate(seq)`` first (generation 2's ``allocate`` takes the
count of cached blocks that only ``can_allocate`` gives, so a caller cannot skip the check there)."""


class NanoVllmAdapter:
    """nano-vllm's BlockManager, with this adapter in the role of its Scheduler (check, then act).

    ``engine``: the ``(block_manager, sequence)`` modules to drive; default: the installed nano-vllm's (a test
    passes a small allocator of the same API, tests/stale_index_allocator.py).
    """

    name = "nano-vllm"

    def __init__(self, engine: tuple[Any, Any] | None = None) -> None:
        self.bm_mod: Any
        self.seq_mod: Any
        self.bm_mod, self.seq_mod = engine or import_without_init("nanovllm", "engine.block_manager", "engine.sequence")
        self.gen = 2 if hasattr(self.bm_mod.BlockManager, "hash_blocks") else 1
        semantics = Semantics(eviction="lru", hit_cap=self.gen == 2, duplicate_keys="newest", exact=True)
        self.capabilities = Capabilities(
            semantics=semantics,
            ops=frozenset({"admit", "append", "release", "preempt", "resume"}),
            declines=frozenset({"release_drop"}),
            checks_input=False,
            contracts=CONTRACTS | (UNCHECKED if self.gen == 1 else frozenset()),
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

    def _sequence(self, tokens: Sequence[int]) -> Any:
        return self.seq_mod.Sequence(list(tokens), self.seq_mod.SamplingParams())  # required before 658520b

    def apply(self, op: Op) -> Outcome:
        before, req = self.observe(), op.req or ""
        if op.op in ("admit", "resume"):
            outcome, taken = self._admission(op, req)
        elif op.op == "append":
            outcome, taken = self._append(req, op.tokens, len(before.requests[req].objects))
        else:  # release, preempt
            outcome, taken = self._free(op, req), []
        self._events += derived_events(before, self.observe(), taken)  # taken: from the free pool, hits aside
        return outcome

    def _admission(self, op: Op, req: str) -> tuple[Outcome, list[int]]:
        """admit / resume: the Scheduler's prefill (contract ``unchecked``: ``allocate`` without ``can_allocate``).

        A Sequence whose ``allocate`` raised is abandoned with the blocks it took (the engine's, judged as it
        left them); a refused resume keeps the request waiting, with a fresh Sequence of its tokens then.
        """
        if op.op == "admit":
            self.seqs[req], self.prompt_len[req] = self._sequence(op.tokens), len(op.tokens)
        seq = self.seqs[req]
        outcome = self._allocate_unchecked(req) if op.contract == "unchecked" else self._allocate(req)
        held = (outcome.hit_tokens or 0) if outcome.status == "ok" else seq.num_cached_tokens
        taken = list(seq.block_table[held // self.bm.block_size :])
        if outcome.status != "ok" and op.op == "admit":
            del self.seqs[req], self.prompt_len[req]
        elif outcome.status != "ok" and seq.block_table:
            self.seqs[req] = self._sequence(seq.token_ids)
        return outcome, taken

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

    def _allocate_unchecked(self, req: str) -> Outcome:
        """Generation 1's ``allocate(seq)`` with no ``can_allocate`` first: a pool short of blocks raises in it."""
        seq = self.seqs[req]
        try:
            self.bm.allocate(seq)
        except Exception as exc:  # the engine's own failure (IndexError: no free block left); what it left is judged
            return Outcome.refused(f"allocate raised {type(exc).__name__}: {exc}")
        self.preempted.discard(req)
        return Outcome.ok(seq.num_cached_tokens)

    def _append(self, req: str, tokens: Sequence[int], held: int) -> tuple[Outcome, list[int]]:
        seq = self.seqs[req]
        outcome = append_atomically(
            tokens,
            blocks_needed=blocks_for(len(seq) + len(tokens), self.bm.block_size) - len(seq.block_table),
            free_blocks=len(self.bm.free_block_ids),
            append_one=lambda token: self._decode(seq, token),
        )
        return outcome, list(seq.block_table[held:])

    def _free(self, op: Op, req: str) -> Outcome:
        """release / preempt: ``deallocate``, as the Scheduler's finish and preempt do, and the misuse contracts:
        ``repeated`` (``deallocate`` again on the freed Sequence) and ``never_admitted`` (first ``deallocate`` of
        a Sequence of the same tokens that was never allocated); each frees nothing more."""
        seq = self.seqs[req]
        if op.contract == "never_admitted":
            self.bm.deallocate(self._sequence(seq.token_ids))
        if req not in self.preempted:
            self.bm.deallocate(seq)
        if op.contract == "repeated":
            self.bm.deallocate(seq)
        if op.op == "release":
            del self.seqs[req], self.prompt_len[req]
            self.preempted.discard(req)
        else:
            self.preempted.add(req)
        return Outcome.ok()

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
        """The BlockManager's own state: its blocks, the Sequences' tables, and ``hash_to_block_id`` as it is.

        Every index entry is shown, a stale one too (an entry left naming a block that was reused since):
        the lookup's ``token_ids`` guard does not keep it from hitting a reused block that holds the same
        tokens under another prefix, and cache_index_consistency is the check that judges it.
        """
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
        index = {h: (bid,) for h, bid in bm.hash_to_block_id.items()}
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
