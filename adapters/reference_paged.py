"""Adapter for the bundled paged prefix cache (reference/paged.py), the default target.

One adapter per eviction policy of reference/eviction_policies.py: each declares the
matching spec Semantics (exact), so the refinement checks hold the pool's
evictions to the spec's own order and the policy checks to the declared one.
"""

from __future__ import annotations

from collections.abc import Callable

from kvspec.adapter import (
    Capabilities,
    Config,
    Event,
    ObjectView,
    Observation,
    ObservationDelta,
    Op,
    Outcome,
    RequestView,
    Semantics,
)
from kvspec.reference.eviction_policies import POLICIES, EvictionPolicy, FamilyProtectPolicy, ScorePolicy
from kvspec.reference.paged import NoFreeBlocks, PagedPrefixCache
from kvspec.reference.paged_newest import NewestOwnsIndex

PoolFactory = Callable[[Config], PagedPrefixCache]


def policy_for(semantics: Semantics, config: Config) -> EvictionPolicy:
    """The reference policy object that implements ``semantics.eviction`` on a pool of ``config``'s shape."""
    if semantics.eviction == "score":
        return ScorePolicy(capacity=config.capacity)
    if semantics.eviction == "family_protect":
        return FamilyProtectPolicy(protect_min_hits=semantics.protect_min_hits)
    return POLICIES[semantics.eviction]()


def policy_pool(semantics: Semantics) -> PoolFactory:
    """Pools that run ``semantics``' eviction policy and admission gate."""

    def factory(config: Config) -> PagedPrefixCache:
        return PagedPrefixCache(
            config.capacity,
            config.block_size,
            hit_cap=semantics.hit_cap,
            policy=policy_for(semantics, config),
            admission_anchor_blocks=semantics.admission_anchor_blocks,
        )

    return factory


class ReferencePagedAdapter:
    """Drives PagedPrefixCache. Preempted requests wait here, as in an engine's queue.

    It reports deltas (``observe_delta``): an op can change only the blocks of its request's table
    before and after it and the blocks it evicted, and only its request; ``reset_cache`` can change
    any block, so after it the adapter gives no delta and the kit observes the whole pool.
    """

    name = "reference"
    capabilities = Capabilities(
        semantics=Semantics(granularity="block", eviction="lru", hit_cap=True, reset_requires_idle=True, exact=True),
        version="0.1.0",
        deltas=True,
        checks_input=True,  # the paged pool rejects bad input itself: its own checks are under test
    )

    def __init__(self, pool_factory: PoolFactory | None = None) -> None:
        self._pool_factory = pool_factory or policy_pool(self.capabilities.semantics)
        self.pool = self._pool_factory(Config())
        self._waiting: dict[str, tuple[tuple[int, ...], int]] = {}
        self._prompt_len: dict[str, int] = {}
        self._since_observed()

    def _since_observed(self) -> None:
        """Forget what changed: the last observation (or reset) is where the next delta starts."""
        self._dirty: dict[int, bytes | None] = {}  # block id -> its hash at the last observation
        self._dirty_reqs: set[str] = set()
        self._whole = True  # a delta cannot say what changed (a reset, nothing observed yet)
        self._held: set[int] = set()  # the blocks the last observation showed as objects

    def reset(self, config: Config) -> None:
        self.pool = self._pool_factory(config)
        self._waiting.clear()
        self._prompt_len.clear()
        self._since_observed()

    def close(self) -> None:
        pass

    def apply(self, op: Op) -> Outcome:
        pool, req = self.pool, op.req or ""
        for block in pool.req_blocks.get(req, ()):
            self._dirty.setdefault(block.block_id, block.block_hash)
        seen = len(pool.evictions)
        try:
            return self._apply(op)
        except NoFreeBlocks as exc:
            return Outcome.refused(str(exc))
        except ValueError as exc:
            return Outcome.invalid(str(exc))
        finally:
            if req:
                self._dirty_reqs.add(req)
            if op.op == "reset_cache":
                self._whole = True
            for _, block_id, block_hash in pool.evictions[seen:]:
                self._dirty.setdefault(block_id, block_hash)
            for block in self.pool.req_blocks.get(req, ()):
                self._dirty.setdefault(block.block_id, None)

    def observe_delta(self) -> ObservationDelta | None:
        """The blocks and requests ``apply`` touched since the last observation, as they are now."""
        if self._whole:
            return None
        pool, bs = self.pool, self.pool.block_size
        tokens_in: dict[int, int] = {}
        requests: dict[str, RequestView] = {}
        dropped_requests = set()
        for req in self._dirty_reqs:
            view = self._request_view(req, tokens_in)
            if view is None:
                dropped_requests.add(req)
            else:
                requests[req] = view
        objects: dict[int, ObjectView] = {}
        dropped: set[int] = set()
        keys: set[bytes] = set()
        for block_id, old_hash in self._dirty.items():
            b = pool.blocks[block_id]
            if old_hash is not None:
                keys.add(old_hash)
            if b.ref_cnt or b.block_hash is not None:
                if b.block_hash is not None:
                    keys.add(b.block_hash)
                objects[block_id] = ObjectView(
                    block_id, 1, tokens_in.get(block_id, bs), b.ref_cnt, b.block_hash, b.hit_count, b.last_used
                )
                self._held.add(block_id)
            elif block_id in self._held:
                dropped.add(block_id)
                self._held.discard(block_id)
        index = {h: tuple(b.block_id for b in pool.entries(h)) for h in keys if h in pool.cached}
        free = pool.num_blocks - len(self._held)
        delta = ObservationDelta(
            free, objects, frozenset(dropped), requests, frozenset(dropped_requests), index,
            frozenset(keys - set(index)),
        )  # fmt: skip
        self._dirty, self._dirty_reqs = {}, set()
        return delta

    def _request_view(self, req: str, tokens_in: dict[int, int]) -> RequestView | None:
        """Request ``req`` as observed (None: not live); ``tokens_in`` gets the tokens of each of its blocks."""
        pool, bs = self.pool, self.pool.block_size
        blocks = pool.req_blocks.get(req)
        if blocks is not None:
            tokens = tuple(pool.req_tokens[req])
            for i, block in enumerate(blocks):
                tokens_in[block.block_id] = min(bs, len(tokens) - i * bs)
            prompt_len = self._prompt_len.get(req, len(tokens))
            return RequestView(req, tokens, prompt_len, tuple(b.block_id for b in blocks))
        if req in self._waiting:
            tokens, prompt_len = self._waiting[req]
            return RequestView(req, tokens, prompt_len, (), "preempted")
        return None

    def _apply(self, op: Op) -> Outcome:
        pool, req = self.pool, op.req or ""
        if any(t < 0 for t in op.tokens):  # the pool would hash them like any other ids: bad input is the spec's
            raise ValueError("token ids must be non-negative")
        if op.op == "reset_cache":
            return Outcome.ok() if pool.reset_prefix_cache() else Outcome.refused("blocks in use")
        if op.op == "admit":
            if req in self._waiting:
                raise ValueError(f"request {req!r} already exists")
            hit = pool.allocate(req, op.tokens)
            self._prompt_len[req] = len(op.tokens)
            return Outcome.ok(hit)
        if op.op == "resume":
            if req not in self._waiting:
                raise ValueError(f"request {req!r} is not preempted")
            tokens, prompt_len = self._waiting[req]
            hit = pool.allocate(req, tokens)
            del self._waiting[req]
            self._prompt_len[req] = prompt_len
            return Outcome.ok(hit)
        if op.op == "append":
            pool.append(req, op.tokens)
            return Outcome.ok()
        if op.op == "release":
            if req in self._waiting:
                del self._waiting[req]
                return Outcome.ok()
            pool.free(req, keep_cached=op.keep)
            self._prompt_len.pop(req, None)
            return Outcome.ok()
        if op.op == "preempt":
            if op.mode != "recompute":
                raise ValueError(f"unsupported preempt mode {op.mode!r}")
            tokens = tuple(pool.req_tokens.get(req, ()))
            pool.free(req, keep_cached=True)
            self._waiting[req] = (tokens, self._prompt_len.pop(req, len(tokens)))
            return Outcome.ok()
        raise ValueError(f"unknown op {op.op!r}")

    def observe(self) -> Observation:
        pool, bs = self.pool, self.pool.block_size
        tokens_in: dict[int, int] = {}
        requests: dict[str, RequestView] = {}
        for req, blocks in pool.req_blocks.items():
            tokens = tuple(pool.req_tokens[req])
            for i, block in enumerate(blocks):
                tokens_in[block.block_id] = min(bs, len(tokens) - i * bs)
            prompt_len = self._prompt_len.get(req, len(tokens))
            requests[req] = RequestView(req, tokens, prompt_len, tuple(b.block_id for b in blocks))
        for req, (tokens, prompt_len) in self._waiting.items():
            requests[req] = RequestView(req, tokens, prompt_len, (), "preempted")
        objects = {
            b.block_id: ObjectView(
                b.block_id, 1, tokens_in.get(b.block_id, bs), b.ref_cnt, b.block_hash, b.hit_count, b.last_used
            )
            for b in pool.blocks
            if b.ref_cnt or b.block_hash is not None
        }
        # The pool's own accounting: queued blocks that hold no cached prefix.
        free = sum(1 for b in pool.free_queue.values() if b.block_hash is None)
        index = {h: tuple(b.block_id for b in pool.entries(h)) for h in pool.cached}
        self._since_observed()
        self._whole, self._held = False, set(objects)
        return Observation(pool.num_blocks, free, objects, requests, index)

    def events(self) -> list[Event]:
        out = [Event(kind, block_id, block_hash) for kind, block_id, block_hash in self.pool.evictions]  # type: ignore[arg-type]
        self.pool.evictions.clear()
        return out


class ReferenceScoreAdapter(ReferencePagedAdapter):
    """The paged pool evicting by the scheduler simulator's retention score."""

    name = "reference-score"
    capabilities = Capabilities(semantics=Semantics(eviction="score"), version="0.1.0", deltas=True, checks_input=True)


class ReferenceSharedAwareAdapter(ReferencePagedAdapter):
    """The paged pool evicting by shared_aware's retain score (hits, share degree, branch factor, depth)."""

    name = "reference-shared-aware"
    capabilities = Capabilities(
        semantics=Semantics(eviction="shared_aware"), version="0.1.0", deltas=True, checks_input=True
    )


ANCHOR_BLOCKS = 1
"""The admission gate of reference-family-protect. KVFabric's default is 24 blocks; the suite's pools hold
2-12 blocks, so the gate is set where it acts on every cold prompt of two blocks or more."""


class ReferenceFamilyProtectAdapter(ReferencePagedAdapter):
    """The paged pool under family_protect with the cold-request admission gate on."""

    name = "reference-family-protect"
    capabilities = Capabilities(
        semantics=Semantics(eviction="family_protect", protect_min_hits=1, admission_anchor_blocks=ANCHOR_BLOCKS),
        version="0.1.0",
        deltas=True,
        checks_input=True,  # the paged pool rejects bad input itself: its own checks are under test
    )


class ReferenceNewestAdapter(ReferencePagedAdapter):
    """The paged pool where a duplicate hash moves the index entry to the newest block (duplicate_keys=newest)."""

    name = "reference-newest"
    capabilities = Capabilities(
        semantics=Semantics(duplicate_keys="newest", hit_prefers_held=True),
        version="0.1.0",
        deltas=True,
        checks_input=True,
    )

    def __init__(self, pool_factory: PoolFactory | None = None) -> None:
        super().__init__(pool_factory or (lambda c: NewestOwnsIndex(c.capacity, c.block_size, hit_cap=True)))
