"""Adapter for vLLM v1's hybrid allocator, in process: several KV cache groups over one pool, no model, no GPU.

A hybrid model (full attention mixed with sliding-window or chunked local
attention) gets one KV cache group per attention kind. The adapter builds that
KV cache config from vLLM's own spec classes (``FullAttentionSpec``,
``SlidingWindowSpec``, ``ChunkedLocalAttentionSpec``) and drives vLLM's
``KVCacheManager``, whose coordinator (``HybridKVCacheCoordinator`` for two or
more groups) finds the hit every group can serve, and whose single-type
managers release the blocks that fall out of a window and put the null block in
their place (``remove_skipped_blocks``).

Each spec operation is what the scheduler does, as for the one-group ``vllm``
adapter (adapters/vllm_inprocess.py), plus one step the scheduler takes when a
step settles: ``remove_skipped_blocks`` on the tokens computed, so out-of-window
blocks are released once the request has computed past them (vLLM itself does
this at the start of the next ``allocate_slots`` and before handing a block
table to a KV connector; doing it when the step settles lets a refused append
change nothing).

A configuration is a shape in units of the pool's block size ``b`` (the hash
block size), one adapter name each: ``vllm-hybrid-sliding`` is full attention +
a sliding window of 2b tokens; ``vllm-sliding`` the window alone;
``vllm-hybrid-local`` full attention + local attention in chunks of 2b tokens;
``vllm-hybrid-mixed`` full attention + chunks of 3b + the window of 2b (three
groups, where the coordinator's search needs more than one pass);
``vllm-hybrid-sizes`` full attention in blocks of 2b + the window in blocks of b
(groups of two block sizes). ``vllm-hybrid-sliding-eagle`` and
``vllm-hybrid-sizes-eagle`` are those with EAGLE on (``use_eagle``): every
group's lookup matches one block past a hit and drops it (vLLM has no EAGLE
with chunked local attention). Every group takes a block per position, so the
adapter declares ``pool_scale`` = its number of groups: the suite draws pools
that much larger and long prompts as long as with one group, and its prompts
(templates of up to three blocks and a tail, forks, appends, prompts of half
the pool) run past windows and chunks of two and three blocks. The hybrid
invariants read ``held`` for the window only when a step released a block.

What the adapter shows: the main observation holds every real block of every
group (the null block is no object and no capacity), a request's object table
its groups' tables concatenated without the null block; the ``HybridView``
(spec.kv_groups) holds the tables per group with the null placeholder as None,
the tokens computed, each group's cached blocks by token prefix, and the free
queue. Block content is learnt, as vLLM caches it, from the request tables
right after each allocation (a block can be cached and released out of the
window within one step).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, replace
from math import gcd, lcm
from typing import Any

from kvspec.adapter import HYBRID, AttentionKind, Capabilities, Config, HybridView, KvGroup, Op, Outcome
from kvspec.adapters import _vllm_shims as shims
from kvspec.adapters.vllm_inprocess import VllmAdapter, declared_semantics


@dataclass(frozen=True)
class GroupShape:
    """One KV cache group in units of the pool's block size: its kind, block size, window and chunk."""

    kind: AttentionKind
    blocks: int = 1  # block size, in pool block sizes
    window: int = 0  # sliding window, in pool block sizes
    chunk: int = 0  # local attention chunk, in pool block sizes

    def group(self, block_size: int, eagle: bool = False) -> KvGroup:
        """The group in tokens; with EAGLE its lookup drops one of its blocks past a hit (vLLM's last-block drop)."""
        return KvGroup(
            self.kind,
            self.blocks * block_size,
            self.window * block_size,
            self.chunk * block_size,
            eagle_drop=1 if eagle else 0,
        )


SHAPES: dict[str, tuple[GroupShape, ...]] = {
    "sliding": (GroupShape("full"), GroupShape("sliding_window", window=2)),
    "sliding-only": (GroupShape("sliding_window", window=2),),
    "local": (GroupShape("full"), GroupShape("chunked_local", chunk=2)),
    "mixed": (GroupShape("full"), GroupShape("chunked_local", chunk=3), GroupShape("sliding_window", window=2)),
    "sizes": (GroupShape("full", blocks=2), GroupShape("sliding_window", window=2)),
}
"""The hybrid configurations, by name; the adapter names are ``vllm-hybrid-<name>`` (``vllm-sliding`` for
``sliding-only``)."""


class VllmHybridAdapter(VllmAdapter):
    """vLLM's KVCacheManager over several KV cache groups sharing one pool, driven like its scheduler does."""

    name = "vllm-hybrid"

    def __init__(self, shape: str = "sliding", eagle: bool = False) -> None:
        self.shape = SHAPES[shape]
        self.eagle = eagle
        self.groups: tuple[KvGroup, ...] = ()
        self.content: dict[Hashable, tuple[int, tuple[int, ...]]] = {}  # cached key -> (group, token prefix)
        super().__init__()
        semantics, notes = declared_semantics(self.vllm)
        semantics = replace(semantics, layout="per_group", exact=False)
        self.capabilities = Capabilities(
            semantics=semantics,
            version=f"vllm {self.vllm.version}",
            pool_scale=len(self.shape),  # each group takes a block per position
            deltas=True,
            contracts=self.CONTRACTS,  # the KVCacheManager's repeated and never-admitted frees (vllm_inprocess.py)
            notes=(
                *notes,
                f"KV cache groups: {', '.join(_describe(s) for s in self.shape)}",
                *(["EAGLE: use_eagle=True, every group drops its last matched block from a hit"] if eagle else []),
            ),
        )

    # -- lifecycle ------------------------------------------------------------------
    def reset(self, config: Config) -> None:
        self.groups = tuple(s.group(config.block_size, self.eagle) for s in self.shape)
        self.content = {}
        super().reset(config)

    def _new_pool(self, num_blocks: int) -> Any:
        sizes = [g.block_size for g in self.groups]
        specs = [self.vllm.attention_spec(g.kind, g.block_size, g.window, g.chunk) for g in self.groups]
        self.manager = self.vllm.manager(
            num_blocks,
            gcd(*sizes),
            self.max_model_len,
            config=self.vllm.hybrid_kv_cache_config(num_blocks, specs),
            scheduler_block_size=lcm(*sizes),
            use_eagle=self.eagle,
        )
        return self.manager.block_pool

    def _group_tables(self, rid: str) -> tuple[list[Any], ...]:
        return tuple(list(m.req_to_blocks.get(rid) or ()) for m in self.manager.coordinator.single_type_managers)

    def _table(self, rid: str) -> list[Any]:
        return [b for t in self._group_tables(rid) for b in t if not b.is_null]

    # -- the scheduler's steps ------------------------------------------------------------
    def _settle(self, request: Any) -> None:
        """Learn what the step cached, then release the blocks now out of every group's window."""
        tokens = tuple(request.all_token_ids)
        for g, (group, table) in enumerate(zip(self.groups, self._group_tables(request.request_id), strict=True)):
            for i, block in enumerate(table):
                if not block.is_null and block.block_hash is not None:
                    self.content[block.block_hash] = (g, tokens[: (i + 1) * group.block_size])
        self.vllm.remove_skipped_blocks(self.manager, request.request_id, request.num_computed_tokens)

    def _schedule(self, request: Any) -> Outcome:
        outcome = super()._schedule(request)
        if outcome.status == "ok":
            self._settle(request)
        return outcome

    def _append(self, req: str, op: Op) -> Outcome:
        outcome = super()._append(req, op)
        if outcome.status == "ok":
            self._settle(self.running[req])
        return outcome

    def _release(self, req: str, op: Op) -> Outcome:
        request = self.running.pop(req) if req in self.running else self.waiting.pop(req)
        if not op.keep:
            mine = [b for t in self._group_tables(req) for b in t if not b.is_null]
            self.vllm.drop_cached(self.pool, [b for b in mine if b.ref_cnt == 1 and b.block_hash is not None])
        self._free_request(request, op)
        return Outcome.ok()

    # -- projection ---------------------------------------------------------------------------
    def _request_blocks(self, rid: str, request: Any, blocks: list[Any]) -> tuple[tuple[int, ...], dict[int, int]]:
        n = request.num_tokens
        tokens: dict[int, int] = {}
        table: list[int] = []
        for group, group_table in zip(self.groups, self._group_tables(rid), strict=True):
            for i, block in enumerate(group_table):
                if not block.is_null:
                    table.append(block.block_id)
                    tokens[block.block_id] = min(group.block_size, n - i * group.block_size)
        return tuple(table), tokens

    def _extra(self, walk: shims.QueueWalk) -> dict[str, object]:
        cached: tuple[dict[tuple[int, ...], Hashable], ...] = tuple({} for _ in self.groups)
        for key, blocks in shims.hash_map_entries(self.pool):
            known = self.content.get(key)
            if known is not None:
                cached[known[0]].setdefault(known[1], blocks[0].block_id)
        view = HybridView(
            groups=self.groups,
            tables={
                rid: tuple(tuple(None if b.is_null else b.block_id for b in t) for t in self._group_tables(rid))
                for rid in self.running
            },
            computed={rid: r.num_computed_tokens for rid, r in self.running.items()},
            cached=cached,
            free_queue=tuple(b.block_id for b in walk.blocks),
            null=self.pool.null_block.block_id,
        )
        return {**super()._extra(walk), HYBRID: view}

    def _delta_extra(self) -> dict[str, object] | None:
        """The whole HybridView and free queue with every delta: the hybrid invariants compare a step's view
        before and after it, so the view the kit keeps must be the previous step's, not that of the last full
        observation. Building it walks the free queue and reads every running request's tables."""
        return self._extra(shims.walk_free_queue(self.pool.free_block_queue, bound=len(self.pool.blocks) + 1))


def _describe(shape: GroupShape) -> str:
    size = f"block {shape.blocks}b"
    if shape.kind == "sliding_window":
        return f"sliding window {shape.window}b ({size})"
    if shape.kind == "chunked_local":
        return f"chunked local {shape.chunk}b ({size})"
    return f"full attention ({size})"


def sliding() -> VllmHybridAdapter:
    """Full attention + a sliding window of two blocks (Gemma 3, gpt-oss)."""
    return VllmHybridAdapter("sliding")


def sliding_only() -> VllmHybridAdapter:
    """A sliding window of two blocks alone (one group: vLLM's UnitaryKVCacheCoordinator, SlidingWindowManager)."""
    return VllmHybridAdapter("sliding-only")


def local() -> VllmHybridAdapter:
    """Full attention + chunked local attention in chunks of two blocks (Llama 4)."""
    return VllmHybridAdapter("local")


def mixed() -> VllmHybridAdapter:
    """Full attention + local attention in chunks of three blocks + a sliding window of two (three groups)."""
    return VllmHybridAdapter("mixed")


def sizes() -> VllmHybridAdapter:
    """Full attention in blocks of two pool blocks + a sliding window in blocks of one (groups of two sizes)."""
    return VllmHybridAdapter("sizes")


def sliding_eagle() -> VllmHybridAdapter:
    """Full attention + a sliding window of two blocks, with EAGLE speculative decoding (vLLM's use_eagle)."""
    return VllmHybridAdapter("sliding", eagle=True)


def sizes_eagle() -> VllmHybridAdapter:
    """Groups of two block sizes (full in 2b, window in b), with EAGLE: the drop is one block of each group."""
    return VllmHybridAdapter("sizes", eagle=True)
