"""Adapter for vLLM v1's own KVCacheManager, in process: real Requests, no model, no GPU.

Each spec operation is what vLLM's scheduler does for one request:

=================  ====================================================================
spec               vLLM
=================  ====================================================================
admit(r, prompt)   Request(prompt); get_computed_blocks; allocate_slots(prompt - hit,
                   hit, hit blocks). ``None``: refused, the request is dropped.
append(r, toks)    append_output_token_ids(toks); allocate_slots(len(toks)). ``None``:
                   refused, and the tokens are taken back (the engine did not run them).
release(r)         free(r). keep=False: first drop the prefix-cache entries of the blocks
                   only r holds (evict_blocks), then free(r).
preempt(r)         free(r); status PREEMPTED, num_computed_tokens = 0; r waits here.
resume(r)          as admit, for the waiting Request with all its tokens.
reset_cache()      reset_prefix_cache(); False (a block is in use): refused.
contracts          ``release:repeated``, ``preempt:repeated``: free(r) called again (the
                   manager pops r's blocks, "default [] in case a request is freed before
                   alloc": the repeat frees nothing); ``release:never_admitted``: first
                   free() of a Request of r's tokens that was never admitted (frees nothing).
=================  ====================================================================

The misuse contracts (``Capabilities.contracts``) are judged as the plain op. There is no
``unchecked`` admission here: ``allocate_slots`` is itself the capacity check (None when the
request does not fit, before it takes a block), so the scheduler's admission already is the
unchecked call and its refusal path is the plain refused admit's (atomic_failure judges it).

The observation is projected from vLLM's own state, never recomputed
(``VllmProjection.observe``), and never filtered (the index is vLLM's hash map as
it is). The adapter decides nothing an allocator decides: hits, admission,
evictions and ref counts all come from vLLM. What it does itself is what the
engine's front end and scheduler do around the allocator: reject bad input
(unknown request, empty or over-long prompt), keep preempted
requests waiting, and undo the tokens of a refused append.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

from kvspec.adapter import (
    FREE_LIST,
    Capabilities,
    Config,
    Event,
    EventKind,
    FreeListView,
    ObjectView,
    Observation,
    ObservationDelta,
    Op,
    Outcome,
    RequestView,
    Semantics,
)
from kvspec.adapters import _vllm_shims as shims

# vLLM's choices, written as spec parameters. Values the installed spec cannot
# express yet make the adapter declare exact=False (safety checks only).
DUPLICATE_KEYS = "indexed"
"""Blocks filled independently with the same prefix are all cached under its hash (no de-duplication)."""


def declared_semantics(vllm: shims.Vllm) -> tuple[Semantics, tuple[str, ...]]:
    """vLLM's semantics as spec parameters, and notes on what the spec cannot express yet.

    Declared for every release: block granularity; the LRU free queue with lazy
    eviction (a cached block keeps its hash in the queue until popped); cached
    free blocks counted as evictable capacity; the hit cap (one prompt token is
    always computed); reset refused while a block is in use; reversed free
    order (a request's tail blocks are evicted first). Per release: duplicate
    keys (always ``indexed``) and where uncached freed blocks go (``head`` from
    0.24, ``tail`` before).
    """
    choices: dict[str, str] = {
        "duplicate_keys": DUPLICATE_KEYS,
        "free_uncached": "head" if vllm.uncached_freed_first() else "tail",
    }
    known = {f.name for f in fields(Semantics)}
    missing = sorted(k for k in choices if k not in known)
    kwargs: dict[str, Any] = {k: v for k, v in choices.items() if k in known}
    semantics = Semantics(
        granularity="block", eviction="lru", hit_cap=True, reset_requires_idle=True, exact=not missing, **kwargs
    )
    notes = tuple(
        f"the spec has no Semantics.{name} (vLLM: {choices[name]!r}): refinement checks are off" for name in missing
    )
    return semantics, notes


class VllmProjection:
    """What both vLLM adapters share: the engine front end, waiting requests, and the projection.

    Subclasses own the pool (``self.pool``) and say which blocks each running
    request holds (``_tables``).

    Projection invariants (each read from vLLM, none recomputed):
    - capacity = num_gpu_blocks - 1: block 0 is vLLM's reserved null block and is
      never an object, never free;
    - objects = non-null blocks with ref_cnt != 0 or a block hash (cached free
      blocks are cache objects until popped: lazy eviction);
    - free = the free queue's own counter minus the cached ref-0 blocks found by
      walking its linked list (bounded by the pool size): a queue that counts a
      block twice, or lists a referenced block, shows as lost or extra capacity;
    - index = vLLM's hash map, each hash with every block cached under it;
    - request tables = vLLM's per-request block lists, tokens = the Request's own.

    Deltas (``observe_delta``, spec/delta.py): what the adapter itself saw change since the last
    observation, never a scan of the pool. Touched are the blocks of the op's request's table before and
    after the op, and every block passed to or returned by a BlockPool call that changes a ref count, a
    hash or a queue place (``shims.BLOCK_CALLS``, tapped on the pool instance: so the blocks a prefix hit
    touches, those a refused allocation took, the cached free blocks popped and evicted for reuse, and the
    shared prefix blocks whose count a release lowers); touched requests: the op's. The delta's free
    count is the queue's own counter minus the touched-and-tracked cached free blocks (those whose links
    say they are queued), as ``observe`` counts them on its walk. The free queue view in ``extra``
    (``free_list_exact``, a whole-state invariant) is not in the delta: the kit reads it from the full
    observation every K steps. None (the kit observes the whole pool): before the first observation,
    after a reset, a ``reset_cache`` op, or an op that raised.
    """

    name = "vllm"
    CONTRACTS: frozenset[str] = frozenset()
    """The misuse contracts of the layer of vLLM the adapter drives (``Capabilities.contracts``)."""

    def __init__(self) -> None:
        self.vllm = shims.load()
        semantics, notes = declared_semantics(self.vllm)
        self.capabilities = Capabilities(
            semantics=semantics,
            version=f"vllm {self.vllm.version}",
            notes=notes,
            deltas=True,
            contracts=self.CONTRACTS,
        )
        self.running: dict[str, Any] = {}  # request id -> Request holding blocks
        self.waiting: dict[str, Any] = {}  # request id -> preempted Request, holding none
        self._events: list[Event] = []
        self._event_kind: EventKind = "evict"
        self.reset(Config())

    # -- lifecycle ------------------------------------------------------------------
    def reset(self, config: Config) -> None:
        """A fresh pool of config.capacity usable blocks plus the null block."""
        self.config = config
        self.block_size = config.block_size
        self.max_model_len = config.capacity * config.block_size
        self.hasher: Any = self.vllm.block_hasher(config.block_size)
        self.running.clear()
        self.waiting.clear()
        self._events.clear()
        self.pool: Any = self._new_pool(config.capacity + 1)
        self._tap_evictions(self.pool)
        self._tap_block_calls(self.pool)
        self._since_observed(whole=True)

    def _since_observed(self, whole: bool = False) -> None:
        """The last observation is where the next delta starts; ``whole``: no delta can say what changed."""
        self._dirty: dict[int, frozenset[Any]] = {}  # block id -> the keys it was cached under when first touched
        self._dirty_reqs: set[str] = set()
        self._whole = whole
        if whole:
            self._held: set[int] = set()  # the blocks shown as objects (ref_cnt != 0 or a hash)
            self._queued_cached: set[int] = set()  # cached ref-0 blocks in the free queue: not free capacity
            self._tokens: dict[int, int] = {}  # block id -> tokens, as a running request's table last showed it

    def close(self) -> None:
        self.running.clear()
        self.waiting.clear()

    def _new_pool(self, num_blocks: int) -> Any:
        raise NotImplementedError

    def _table(self, rid: str) -> list[Any]:
        """Block table of a running request, as vLLM (or the adapter driving the pool) holds it (no null block)."""
        raise NotImplementedError

    def _tables(self) -> dict[str, list[Any]]:
        """Block table of each running request."""
        return {rid: self._table(rid) for rid in self.running}

    # -- events -----------------------------------------------------------------------
    def _tap_evictions(self, pool: Any) -> None:
        """Report each block whose cached hash vLLM drops, as vLLM drops it (lazy eviction or evict_blocks).

        The tap wraps this pool instance's own ``_maybe_evict_cached_block``, the
        one place every release removes a block's hash; it changes nothing.
        """
        original = pool._maybe_evict_cached_block

        def tapped(block: Any) -> Any:
            oid, key = block.block_id, block.block_hash
            dropped = original(block)
            if dropped and key is not None:
                self._events.append(Event(self._event_kind, oid, key))
            return dropped

        pool._maybe_evict_cached_block = tapped

    def _tap_block_calls(self, pool: Any) -> None:
        """Note every block a pool call that changes blocks is given or returns, before the call changes it.

        Wraps this pool instance's own methods (those of ``shims.BLOCK_CALLS`` it has); the managers call
        the pool through the instance, so their calls are seen too. It changes nothing.
        """
        for name in shims.BLOCK_CALLS:
            original = getattr(pool, name, None)
            if original is not None:
                setattr(pool, name, self._noting(pool, original))

    def _noting(self, pool: Any, original: Callable[..., Any]) -> Callable[..., Any]:
        def noted(*args: Any, **kwargs: Any) -> Any:
            for block in shims.blocks_in(pool, (*args, *kwargs.values())):
                self._note(pool, block)
            out = original(*args, **kwargs)
            if isinstance(out, list):
                for block in shims.blocks_in(pool, (out,)):
                    self._note(pool, block)
            return out

        return noted

    def _note(self, pool: Any, block: Any) -> None:
        """A block the step touched; the keys it was cached under at its first touch since the last observation."""
        if not block.is_null and block.block_id not in self._dirty:
            self._dirty[block.block_id] = shims.block_keys(pool, block)

    def _schedule(self, request: Any) -> Outcome:
        """Admit one Request; each adapter does it the way its layer of vLLM does."""
        raise NotImplementedError

    def _admit(self, req: str, op: Op) -> Outcome:
        return self._schedule(self.vllm.request(req, op.tokens, self.hasher))

    def _resume(self, req: str, op: Op) -> Outcome:
        outcome = self._schedule(self.waiting[req])
        if outcome.status == "ok":
            del self.waiting[req]
        return outcome

    def events(self) -> list[Event]:
        out, self._events = self._events, []
        return out

    def _reset_cache(self) -> Outcome:
        """reset_prefix_cache; on success every block cached before is reclaimed (vLLM's AllBlocksCleared)."""
        cached = [(b.block_id, b.block_hash) for b in self.pool.blocks if b.block_hash is not None and not b.is_null]
        if not self._pool_reset():
            return Outcome.refused("blocks are in use")
        self._events += [Event("reclaim", oid, key) for oid, key in cached]
        return Outcome.ok()

    def _pool_reset(self) -> bool:
        raise NotImplementedError

    def apply(self, op: Op) -> Outcome:
        """Run a valid ``op`` (bad input never reaches an adapter: the kit answers it, Capabilities.checks_input)."""
        self._event_kind = "reclaim" if op.op in ("release", "reset_cache") else "evict"
        if op.op == "reset_cache":
            self._whole = True  # any block may lose its hash
            return self._reset_cache()
        assert op.req is not None
        self._dirty_reqs.add(op.req)
        if op.req in self.running:
            for block in self._table(op.req):
                self._note(self.pool, block)
        try:
            handler = getattr(self, f"_{op.op}")
            outcome: Outcome = handler(op.req, op)
        except BaseException:
            self._whole = True  # what it changed before it raised is unknown
            raise
        return outcome

    # -- projection ---------------------------------------------------------------------------
    def _request_blocks(self, rid: str, request: Any, blocks: list[Any]) -> tuple[tuple[int, ...], dict[int, int]]:
        """A running request's object table (block ids) and the tokens each of its blocks holds."""
        n, bs = request.num_tokens, self.block_size
        return tuple(b.block_id for b in blocks), {b.block_id: min(bs, n - i * bs) for i, b in enumerate(blocks)}

    def _extra(self, walk: shims.QueueWalk) -> dict[str, object]:
        """What the observation shows beside the ledger: the free queue as its links and its blocks say."""
        blocks = self.pool.blocks  # the null block too: it is never listed, so it must keep no links
        free_list = FreeListView(
            order=tuple(b.block_id for b in walk.blocks),
            complete=walk.complete,
            backward=tuple(b.block_id for b in walk.backward),
            linked=frozenset(b.block_id for b in blocks if b.prev_free_block or b.next_free_block),
            counter=walk.counter,
            unreferenced=frozenset(b.block_id for b in blocks if b.ref_cnt == 0 and not b.is_null),
        )
        return {
            "num_free_blocks": walk.counter,
            "free_queue_walked": len(walk.blocks),
            "free_queue_complete": walk.complete,
            FREE_LIST: free_list,
        }

    def observe_delta(self) -> ObservationDelta | None:
        """The blocks, index keys and requests the ops since the last observation touched, as they are now.

        Invariant: applied to the last observation (or the one its deltas since then built) it gives
        ``observe()`` (the extra aside, see the class docstring); None where it cannot say.
        """
        if self._whole:
            return None
        pool, bs = self.pool, self.block_size
        tokens_in: dict[int, int] = {}
        requests: dict[str, RequestView] = {}
        dropped_requests: set[str] = set()
        for rid in self._dirty_reqs:
            if rid in self.running:
                request, table = self.running[rid], self._table(rid)
                for block in table:
                    self._note(pool, block)
                ids, held = self._request_blocks(rid, request, table)
                tokens_in.update(held)
                requests[rid] = RequestView(rid, tuple(request.all_token_ids), request.num_prompt_tokens, ids)
            elif rid in self.waiting:
                w = self.waiting[rid]
                requests[rid] = RequestView(rid, tuple(w.all_token_ids), w.num_prompt_tokens, (), "preempted")
            else:
                dropped_requests.add(rid)
        objects: dict[int, ObjectView] = {}
        dropped: set[int] = set()
        keys: set[Any] = set()
        for oid, was in self._dirty.items():
            block = pool.blocks[oid]
            keys |= was | shims.block_keys(pool, block)
            if block.ref_cnt != 0 or block.block_hash is not None:
                tokens: int | None = tokens_in.get(oid)
                if tokens is None:  # no longer the op's request's: another holder's count (a full block), else bs
                    tokens = self._tokens.get(oid, bs) if block.ref_cnt > 0 else bs
                self._tokens[oid] = tokens
                objects[oid] = ObjectView(oid, 1, tokens, block.ref_cnt, block.block_hash)
                self._held.add(oid)
            else:
                self._tokens.pop(oid, None)
                if oid in self._held:
                    dropped.add(oid)
                    self._held.discard(oid)
            if block.ref_cnt == 0 and block.block_hash is not None and shims.is_queued(block):
                self._queued_cached.add(oid)
            else:
                self._queued_cached.discard(oid)
        index: dict[Any, tuple[Any, ...]] = {}
        dropped_keys: set[Any] = set()
        for key in keys:
            under = shims.cached_under(pool, key)
            if under:
                index[key] = tuple(b.block_id for b in under)
            else:
                dropped_keys.add(key)
        free = int(pool.free_block_queue.num_free_blocks) - len(self._queued_cached)
        self._since_observed()
        return ObservationDelta(
            free, objects, frozenset(dropped), requests, frozenset(dropped_requests), index, frozenset(dropped_keys),
            self._delta_extra(),
        )  # fmt: skip

    def _delta_extra(self) -> dict[str, object] | None:
        """The extra a delta carries: None, the free queue view is judged on full observations only."""
        return None

    def observe(self) -> Observation:
        pool, bs = self.pool, self.block_size
        tables = self._tables()
        tokens_in: dict[int, int] = {}
        requests: dict[str, RequestView] = {}
        for rid, request in self.running.items():
            table, tokens = self._request_blocks(rid, request, tables.get(rid, []))
            tokens_in.update(tokens)
            requests[rid] = RequestView(rid, tuple(request.all_token_ids), request.num_prompt_tokens, table)
        for rid, request in self.waiting.items():
            requests[rid] = RequestView(rid, tuple(request.all_token_ids), request.num_prompt_tokens, (), "preempted")
        objects = {
            b.block_id: ObjectView(b.block_id, 1, tokens_in.get(b.block_id, bs), b.ref_cnt, b.block_hash)
            for b in pool.blocks
            if not b.is_null and (b.ref_cnt != 0 or b.block_hash is not None)
        }
        walk = shims.walk_free_queue(pool.free_block_queue, bound=len(pool.blocks) + 1)
        cached_free = [b for b in walk.blocks if b.ref_cnt == 0 and b.block_hash is not None]
        index = shims.hash_map_index(pool)
        self._since_observed(whole=True)
        self._whole, self._held, self._tokens = False, set(objects), tokens_in
        self._queued_cached = {b.block_id for b in cached_free}
        return Observation(
            pool.num_gpu_blocks - 1, walk.counter - len(cached_free), objects, requests, index, self._extra(walk)
        )


class VllmAdapter(VllmProjection):
    """vLLM's KVCacheManager (coordinator, single-type manager, BlockPool) driven like its scheduler does."""

    name = "vllm"
    CONTRACTS = frozenset({"release:repeated", "preempt:repeated", "release:never_admitted"})

    def _new_pool(self, num_blocks: int) -> Any:
        self.manager = self.vllm.manager(num_blocks, self.block_size, self.max_model_len)
        return self.manager.block_pool

    def _table(self, rid: str) -> list[Any]:
        return list(self.manager.coordinator.single_type_managers[shims.GROUP].req_to_blocks.get(rid) or ())

    def _pool_reset(self) -> bool:
        return bool(self.manager.reset_prefix_cache())

    def _schedule(self, request: Any) -> Outcome:
        """Admit a waiting request the way the scheduler does: prefix hit, then one allocation for the rest."""
        blocks, hit = self.vllm.computed_blocks(self.manager, request)
        if self.manager.allocate_slots(request, request.num_tokens - hit, hit, blocks) is None:
            return Outcome.refused("allocate_slots returned None")
        request.num_computed_tokens = request.num_tokens
        request.status = self.vllm.RequestStatus.RUNNING
        self.running[request.request_id] = request
        return Outcome.ok(hit)

    def _append(self, req: str, op: Op) -> Outcome:
        request = self.running[req]
        before = request.num_tokens
        request.append_output_token_ids(list(op.tokens))
        if self.manager.allocate_slots(request, len(op.tokens)) is None:
            self.vllm.truncate_request(request, before, self.block_size)
            return Outcome.refused("allocate_slots returned None")
        request.num_computed_tokens = request.num_tokens
        return Outcome.ok()

    def _release(self, req: str, op: Op) -> Outcome:
        request = self.running.pop(req) if req in self.running else self.waiting.pop(req)
        if not op.keep:
            table = self.manager.coordinator.single_type_managers[shims.GROUP].req_to_blocks.get(req) or []
            self.vllm.drop_cached(self.pool, [b for b in table if b.ref_cnt == 1 and b.block_hash is not None])
        self._free_request(request, op)
        return Outcome.ok()

    def _free_request(self, request: Any, op: Op) -> None:
        """free(request), as the scheduler's finish and preempt do, through the misuse contracts: ``never_admitted``
        first frees a Request of the same tokens that was never admitted, ``repeated`` frees the request again."""
        if op.contract == "never_admitted":
            self.manager.free(
                self.vllm.request(f"{request.request_id}:never-admitted", request.all_token_ids, self.hasher)
            )
        self.manager.free(request)
        if op.contract == "repeated":
            self.manager.free(request)

    def _preempt(self, req: str, op: Op) -> Outcome:
        request = self.running.pop(req)
        self._free_request(request, op)
        request.status = self.vllm.RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        self.waiting[req] = request
        return Outcome.ok()
