"""Operations, outcomes and pool configuration of the KV lifecycle spec.

Operations are request-level and engine-neutral. Evict and reclaim are never
called from outside: they happen inside an operation and come back as events.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from .radix_view import RadixOrder

Granularity = Literal["block", "record", "entry"]
Layout = Literal["one_table", "per_group"]
OpKind = Literal["admit", "append", "release", "preempt", "resume", "reset_cache"]
Status = Literal["ok", "refused", "invalid"]
EvictionOrder = Literal["lru", "lifecycle", "score", "shared_aware", "family_protect"] | RadixOrder
DuplicateKeys = Literal["unkeyed", "indexed", "newest"]
FreeUncached = Literal["tail", "head"]
PreemptKeeps = Literal["computed", "cached"]

OP_KINDS: tuple[OpKind, ...] = ("admit", "append", "release", "preempt", "resume", "reset_cache")


MAX_CAPACITY = 1 << 20
"""The largest pool the kit builds (blocks; bytes at entry granularity): 2^20 blocks take about 600 MB in the
spec's ledger and the reference adapter together. One limit for check, replay, trace record and trace check,
checked before anything is allocated."""


BAD_INPUT: dict[str, str] = {
    "no_request_id": "an op on a request without a request id",
    "admit_existing": "admit of a request that is already live",
    "empty_prompt": "admit of an empty prompt",
    "negative_token": "a token id below zero (admit or append)",
    "prompt_larger_than_pool": "a prompt larger than the whole pool",
    "unknown_request": "an op on a request that is unknown or already released",
    "append_not_running": "append to a preempted request",
    "append_nothing": "append of no tokens",
    "append_larger_than_pool": "an append that makes the request larger than the whole pool",
    "preempt_not_running": "preempt of a preempted request",
    "preempt_bad_mode": "preempt with a mode the spec does not define",
    "resume_not_preempted": "resume of a request that is running",
    "unknown_op": "an op the spec does not define",
}
"""Every class of bad input the spec defines (``spec.validate`` raises SpecError with one of these kinds)."""

_NEEDS: dict[str, tuple[frozenset[str], ...]] = {
    "unknown_request": tuple(frozenset({op}) for op in ("append", "release", "preempt", "resume")),
    "append_not_running": (frozenset({"append", "preempt"}),),
    "append_nothing": (frozenset({"append"}),),
    "append_larger_than_pool": (frozenset({"append"}),),
    "preempt_not_running": (frozenset({"preempt"}),),
    "preempt_bad_mode": (frozenset({"preempt"}),),
    "resume_not_preempted": (frozenset({"resume"}),),
}
"""Bad input that needs more than admit: any one of these sets of ops, all implemented."""


class SpecError(ValueError):
    """Bad input (``kind``: one of BAD_INPUT). The spec's defined outcome is this error and no state change."""

    def __init__(self, message: str, kind: str = "") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Config:
    """The pool under test.

    capacity: blocks at block and record granularity, bytes at entry granularity.
    block_size: tokens per block. bytes_per_token: size unit of an entry.
    """

    capacity: int = 8
    block_size: int = 4
    bytes_per_token: int = 1

    def __post_init__(self) -> None:
        if self.capacity <= 0 or self.block_size <= 0 or self.bytes_per_token <= 0:
            raise SpecError("capacity, block_size and bytes_per_token must be positive")
        if self.capacity > MAX_CAPACITY:
            raise SpecError(f"capacity {self.capacity} is larger than the kit's limit of {MAX_CAPACITY}")

    def to_json(self) -> dict[str, int]:
        return {
            "capacity": self.capacity,
            "block_size": self.block_size,
            "bytes_per_token": self.bytes_per_token,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Config:
        return cls(**{k: int(v) for k, v in data.items() if k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Semantics:
    """What an implementation declares about itself; the spec is parameterised by it.

    granularity: what a cache object is (one block, one shared record, one entry).
    eviction: the order unreferenced objects are evicted in. ``lru`` is the free
      queue (released blocks join the tail, tail blocks of a request first; the
      head is popped, cached or not); ``lifecycle`` is lowest (hits, last_used,
      -size) first; ``score`` is lowest retention score, then oldest, first.
      At block granularity ``score``, ``shared_aware`` and ``family_protect``
      rank the cached blocks with ref_count 0 (spec.policies, docs/policies.md)
      and take uncached free blocks before evicting any. The ``radix_*`` orders
      are a radix tree's (spec.radix_view): unlocked leaves by the order's rank key.
    hit_cap: a prefix hit leaves at least one prompt token to compute (vLLM).
    prefix_caching: the pool caches full blocks for later requests to hit (off: an allocator with no prefix
      cache, or vLLM's ``enable_prefix_caching=False``: no block is ever keyed, so no hit is lost or kept).
    reset_requires_idle: reset_cache is refused while any object is referenced.
    duplicate_keys: which copy a lookup returns where several blocks hold one key (a choice among correct
      behaviours: no value makes losing a copy correct, docs/semantics.md). A block that becomes full while its
      key is already cached by another block: ``unkeyed`` stays uncached while it is held (one block per key),
      and takes the key when its request frees it if no other block holds the key then (the request computed
      those tokens: dropping them loses every later hit on them); ``indexed`` is cached too, and the index lists
      every block under that key in insertion order, hits taking the first (vLLM: no de-duplication, block
      tables are append-only); ``newest``: the new block takes the index entry and the older copies stay
      findable behind it, newest first, so that when the entry's owner leaves the cache the next copy takes
      its place (a one-entry-per-hash index that forgets the older copies, nano-vllm's, loses their hits:
      ``no_lost_hit``).
    hit_prefers_held: where several blocks hold a hit's key, the hit shares one that a running request
      holds before it takes an idle one out of the free queue (the declared duplicate_keys order among the
      rest). Off, a hit takes the copy duplicate_keys names, held or not; no_needless_allocation reports each
      idle copy taken while a held one was there, whatever is declared.
    free_uncached: where a released block that holds no cached key joins the free
      queue: ``tail`` like every other block, or ``head``, so that it is reused
      before any cached block is evicted (vLLM >= 0.24). Block granularity only.
    preempt_keeps: the promise every engine keeps: a preemption never drops what the cache held when it came.
      ``computed``: it also leaves every full block the request computed cached (vLLM, nano-vllm: blocks are
      cached as they fill). ``cached``: only what the cache held; the blocks the request filled since its
      last insertion are freed uncached (SGLang's retraction: ``release_kv_cache(..., is_insert=False)``), a
      bounded, documented loss that release_keeps_cache judges as exactly that rule.
    protect_min_hits: family_protect defers candidates with at least this many hits.
    admission_anchor_blocks: the cache-admission gate. A cold request (no prefix
      hit) caches at most this many of its full blocks, its first ones; the rest
      stay uncached, so they are reused before any cached block is evicted and
      never push a protected family out. It never refuses anything. None: off.
    exact: the implementation claims these semantics exactly, so the spec's
      predictions (free capacity, hits, admission, evicted object) must match.
    layout: ``one_table``: one full-attention KV cache group, and a request's object
      table is its table in token order. ``per_group``: several KV cache groups share
      the pool (spec.kv_groups); a request's object table lists the real blocks of every
      group's table, group by group, without the null placeholder, and the adapter
      shows the groups it declares for the pool (spec.kv_groups.KvGroup: attention kind,
      block size, window or chunk in tokens, release of out-of-window blocks) with the
      per-group tables in a HybridView, which the hybrid invariants judge.
    """

    granularity: Granularity = "block"
    eviction: EvictionOrder = "lru"
    hit_cap: bool = True
    prefix_caching: bool = True
    reset_requires_idle: bool = True
    exact: bool = True
    duplicate_keys: DuplicateKeys = "unkeyed"
    hit_prefers_held: bool = False
    free_uncached: FreeUncached = "tail"
    preempt_keeps: PreemptKeeps = "computed"
    protect_min_hits: int = 1
    admission_anchor_blocks: int | None = None
    layout: Layout = "one_table"

    def __post_init__(self) -> None:
        if self.protect_min_hits < 0:
            raise SpecError("protect_min_hits must not be negative")
        if self.admission_anchor_blocks is not None and self.admission_anchor_blocks < 0:
            raise SpecError("admission_anchor_blocks must not be negative")

    def to_json(self) -> dict[str, Any]:
        return {
            "granularity": self.granularity,
            "eviction": self.eviction,
            "hit_cap": self.hit_cap,
            "prefix_caching": self.prefix_caching,
            "reset_requires_idle": self.reset_requires_idle,
            "exact": self.exact,
            "duplicate_keys": self.duplicate_keys,
            "hit_prefers_held": self.hit_prefers_held,
            "free_uncached": self.free_uncached,
            "preempt_keeps": self.preempt_keeps,
            "protect_min_hits": self.protect_min_hits,
            "admission_anchor_blocks": self.admission_anchor_blocks,
            "layout": self.layout,
        }


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that hold ``tokens`` tokens: a partial tail still takes a whole block."""
    return -(-tokens // block_size)


def size_of(tokens: int, config: Config, granularity: Granularity) -> int:
    """Capacity an object of ``tokens`` tokens occupies at this granularity."""
    if granularity == "entry":
        return tokens * config.bytes_per_token
    return blocks_for(tokens, config.block_size)


@dataclass(frozen=True)
class Op:
    """One request-level operation. ``tokens`` is the prompt (admit) or the new tokens (append).

    ``contract``: a misuse contract of the implementation that the adapter exercises for this op
    (declared in its capabilities, e.g. a free repeated within the step); the spec judges the op
    as if it were plain: a contract the implementation keeps changes nothing observable.
    """

    op: OpKind
    req: str | None = None
    tokens: tuple[int, ...] = ()
    keep: bool = True
    mode: str = "recompute"
    contract: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"op": self.op}
        if self.req is not None:
            out["req"] = self.req
        if self.op in ("admit", "append"):
            out["tokens"] = list(self.tokens)
        if self.op == "release":
            out["keep"] = self.keep
        if self.op == "preempt":
            out["mode"] = self.mode
        if self.contract:
            out["contract"] = self.contract
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Op:
        """The op in ``data``. An op name the spec does not define is kept: it is bad input (``unknown_op``)
        that a case may hold, and replaying it must give the same verdict."""
        kind = data.get("op")
        if not isinstance(kind, str) or not kind:
            raise SpecError(f"not an op: {kind!r}")
        req = data.get("req")
        return cls(
            op=cast(OpKind, kind),
            req=None if req is None else str(req),
            tokens=tuple(int(t) for t in data.get("tokens", ())),
            keep=bool(data.get("keep", True)),
            mode=str(data.get("mode", "recompute")),
            contract=str(data.get("contract", "")),
        )

    def __str__(self) -> str:
        args = [repr(self.req)] if self.req is not None else []
        if self.op in ("admit", "append"):
            args.append(f"tokens={list(self.tokens)}")
        if self.op == "release" and not self.keep:
            args.append("keep=False")
        if self.op == "preempt" and self.mode != "recompute":
            args.append(f"mode={self.mode!r}")
        if self.contract:
            args.append(f"contract={self.contract!r}")
        return f"{self.op}({', '.join(args)})"


@dataclass(frozen=True)
class Outcome:
    """What an operation did. ``hit_tokens``: prompt tokens served from cache (admit, resume)."""

    status: Status
    hit_tokens: int | None = None
    message: str = ""

    @classmethod
    def ok(cls, hit_tokens: int | None = None) -> Outcome:
        return cls("ok", hit_tokens)

    @classmethod
    def refused(cls, message: str = "") -> Outcome:
        return cls("refused", None, message)

    @classmethod
    def invalid(cls, message: str = "") -> Outcome:
        return cls("invalid", None, message)


EventKind = Literal["evict", "reclaim"]


@dataclass(frozen=True)
class Event:
    """An object left the cache inside an operation: ``evict`` under pressure, ``reclaim`` on purpose."""

    kind: EventKind
    oid: Hashable
    key: Hashable | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


def bad_input_kinds(ops: frozenset[str], granularity: Granularity) -> tuple[str, ...]:
    """The classes of bad input an implementation of ``ops`` at ``granularity`` can be given.

    A class that needs an op the implementation lacks (append, preempt, resume) cannot arise;
    nor can a second admit of a live request where requests do not persist (entry granularity).
    """
    return tuple(
        kind
        for kind in BAD_INPUT
        if any(need <= ops for need in _NEEDS.get(kind, (frozenset(),)))
        and not (granularity == "entry" and kind == "admit_existing")
    )
