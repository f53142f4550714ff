"""Realistic bugs seeded into vLLM's own allocator classes, and known bugs of released vLLM versions.

Each ``VllmBug`` replaces one method of a vLLM class (with pytest's
``monkeypatch`` or the ``seeded`` context manager) by a version with a mistake
an engine developer could make; tests/test_vllm_adapters.py asserts that
`kvspec check` against the named adapter reports it with ``invariant`` and
shrinks it to a short op sequence. The replacements are written against the
installed vLLM's own method (``make`` receives the original) so that the
rest of the allocator stays vLLM's.

``KNOWN_BUGS`` are counterexamples found by the release matrix
(benchmarks/vllm_matrix.py) in real vLLM releases, kept as a baseline file
(tests/data/vllm-known-bugs.json, the gate's format): each names the release
range, and replays the shrunk case against the installed release and against
the historical code, seeded into the current one.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvspec.adapters import _vllm_shims as shims
from kvspec.gate import Baseline, Entry

Method = Callable[..., Any]


@dataclass(frozen=True)
class VllmBug:
    """One method of one vLLM class replaced by a buggy version, and the invariant that must report it."""

    name: str
    invariant: str
    module: str
    cls: str
    attribute: str
    make: Callable[[Method], Method]  # original method -> buggy method
    description: str
    adapter: str = "vllm"  # "vllm" (KVCacheManager) or "vllm-blockpool" (BlockPool driven directly)
    refine: bool = False  # a refinement bug: needs the spec to express vLLM's semantics exactly
    max_ops: int = 8

    def target(self) -> Any:
        return getattr(importlib.import_module(self.module), self.cls)


@contextmanager
def seeded(bug: VllmBug) -> Iterator[None]:
    """Apply ``bug`` to the installed vLLM for the duration of the block (outside pytest)."""
    target = bug.target()
    original = target.__dict__[bug.attribute]
    setattr(target, bug.attribute, bug.make(original))
    try:
        yield
    finally:
        setattr(target, bug.attribute, original)


def _blocks(arg: Any) -> list[Any]:
    """touch()'s argument as a flat list: a sequence of blocks, or a per-group tuple of them (up to 0.13)."""
    flat: list[Any] = []
    for item in arg:
        if isinstance(item, list | tuple):
            flat.extend(item)
        else:
            flat.append(item)
    return flat


# -- the bugs ----------------------------------------------------------------------------------


def _touch_before_check(original: Method) -> Method:
    def allocate_slots(
        self: Any,
        request: Any,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: Any = None,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        hits = list(new_computed_blocks.blocks[0]) if new_computed_blocks is not None else []
        shims.load().touch(self.block_pool, hits)  # too early: before the check that the rest fits
        out = original(self, request, num_new_tokens, num_new_computed_tokens, new_computed_blocks, *args, **kwargs)
        if out is not None:
            self.block_pool.free_blocks(hits)  # allocated: allocate_slots took its own reference
        return out  # None: the early references stay

    return allocate_slots


def _free_tail_twice(original: Method) -> Method:
    def free(self: Any, request_id: str) -> None:
        tail = list(self.req_to_blocks.get(request_id) or [])[-1:]
        original(self, request_id)
        self.block_pool.free_blocks(tail)  # the tail block is returned a second time

    return free


def _evict_keeps_entry(original: Method) -> Method:
    def _maybe_evict_cached_block(self: Any, block: Any) -> bool:
        if block.block_hash is None:
            return False
        block.reset_hash()  # the hash map still points at the block
        return True

    return _maybe_evict_cached_block


def _queue_every_listed(original: Method) -> Method:
    def free_blocks(self: Any, ordered_blocks: Any, *args: Any, **kwargs: Any) -> None:
        blocks = list(ordered_blocks)
        for block in blocks:
            block.ref_cnt -= 1
        self.free_block_queue.append_n([b for b in blocks if b.ref_cnt == 0 and not b.is_null])

    return free_blocks


def _touch_keeps_queued(original: Method) -> Method:
    def touch(self: Any, blocks: Any) -> None:
        for block in _blocks(blocks):
            block.ref_cnt += 1  # a cached free block is taken but left in the free queue

    return touch


def _popleft_n_keeps_link(original: Method) -> Method:
    def popleft_n(self: Any, n: int) -> list[Any]:
        popped: list[Any] = original(self, n)
        if len(popped) > 1:  # vLLM 0.32 mutant kv_cache_utils#79: the last popped block keeps its next link
            popped[-1].next_free_block = self.fake_free_list_head.next_free_block
        return popped

    return popleft_n


def _popleft_keeps_links(original: Method) -> Method:
    def popleft(self: Any) -> Any:
        head = self.fake_free_list_head
        first = head.next_free_block
        following = first.next_free_block if first is not None else None
        block = original(self)
        block.prev_free_block, block.next_free_block = head, following  # mutant kv_cache_utils#50
        return block

    return popleft


def _free_head_first(original: Method) -> Method:
    def free(self: Any, request_id: str) -> None:
        blocks = self.req_to_blocks.pop(request_id, [])
        self.num_cached_block.pop(request_id, None)
        self.block_pool.free_blocks(list(blocks))  # not reversed: a prompt's first block is evicted first

    return free


POOL = ("vllm.v1.core.block_pool", "BlockPool")
MANAGER = ("vllm.v1.core.kv_cache_manager", "KVCacheManager")
SINGLE = ("vllm.v1.core.single_type_kv_cache_manager", "SingleTypeKVCacheManager")
QUEUE = ("vllm.v1.core.kv_cache_utils", "FreeKVCacheBlockQueue")

VLLM_BUGS: tuple[VllmBug, ...] = (
    VllmBug(
        "leak-touch-on-refusal",
        "atomic_failure",
        *MANAGER,
        "allocate_slots",
        _touch_before_check,
        "allocate_slots touches the prefix-hit blocks before it knows the rest fits, and returns None keeping them",
    ),
    VllmBug(
        "double-free",
        "non_negative_ref_counts",
        *SINGLE,
        "free",
        _free_tail_twice,
        "free() returns a request's blocks, then its tail block a second time (once with the request, once as "
        "the slot reserved for the next token)",
    ),
    VllmBug(
        "reuse-keeps-hash-entry",
        "cache_index_consistency",
        *POOL,
        "_maybe_evict_cached_block",
        _evict_keeps_entry,
        "a cached free block popped for reuse loses its hash, but its hash-map entry stays and still points at it",
    ),
    VllmBug(
        "free-queues-twice",
        "capacity_conservation",
        *POOL,
        "free_blocks",
        _queue_every_listed,
        "free_blocks queues every listed block whose count reached zero: a block listed twice is queued twice "
        "(vLLM's own code before 0.24)",
        adapter="vllm-blockpool",
    ),
    VllmBug(
        "touch-keeps-queued",
        "capacity_conservation",
        *POOL,
        "touch",
        _touch_keeps_queued,
        "a prefix hit on a cached free block takes a reference but leaves the block in the free queue",
    ),
    VllmBug(
        "free-head-first",
        "predicted_eviction",
        *SINGLE,
        "free",
        _free_head_first,
        "free() returns a request's blocks head first: the prompt's first block is evicted before its tail",
        refine=True,
    ),
    VllmBug(
        "popleft-n-keeps-link",
        "free_list_exact",
        *QUEUE,
        "popleft_n",
        _popleft_n_keeps_link,
        "popleft_n leaves the last block it pops linked to the new head: a block outside the free queue still "
        "points into it (found by benchmarks/mutation.py: a mutant vLLM's allocator tests run here miss)",
    ),
    VllmBug(
        "popleft-keeps-links",
        "free_list_exact",
        *QUEUE,
        "popleft",
        _popleft_keeps_links,
        "popleft leaves the block it pops (the pool's null block) linked to the queue's head and next block",
        adapter="vllm-blockpool",
    ),
)


KNOWN_BUGS_FILE = Path(__file__).parent / "data" / "vllm-known-bugs.json"
"""Counterexamples found by the release matrix in released vLLM, kept as a kvspec baseline (docs/ci.md):
each entry names the adapter, the invariant, the release range (``versions``) and the shrunk case. The kit
is the first user of its own gate's baseline."""

KNOWN_BUGS: tuple[Entry, ...] = tuple(Baseline.load(KNOWN_BUGS_FILE).entries)

SEEDED_AS: dict[str, str] = {"084704ed6a4771ba": "free-queues-twice"}
"""Known bug (fingerprint) -> the VllmBug that reproduces the historical code in the installed release."""
