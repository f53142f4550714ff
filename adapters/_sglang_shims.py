"""What differs between SGLang releases, detected from the installed package: the one place that knows.

The adapter calls these; each picks the installed release's own entry point by
feature (a module, a parameter class, a method), never by version number:

- the tree takes ``CacheInitParams`` (0.5.6+) or positional arguments (0.5.5);
- ``match_prefix`` takes ``MatchPrefixParams`` (0.5.8+) or keyword arguments;
- the request path is ``mem_cache/common.py``'s ``match_kv_cache`` / ``checkpoint_kv_cache`` /
  ``release_kv_cache`` (0.5.21+) or the tree's ``cache_unfinished_req`` / ``cache_finished_req``;
- a request's KV bookkeeping is ``req.kv`` (0.5.20+) or attributes on the request.

Nothing here re-implements the tree, the allocator or the request path: every
function hands a real SGLang object to SGLang's own code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import io
import logging
import sys
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from typing import Any

GROUP_QUIET = ("sglang", "sglang.srt")
INSTALL_HINT = "pip install --no-deps -r requirements/sglang.txt into a venv of its own (docs/sglang.md)"


def _quiet() -> None:
    """SGLang logs warnings about kernels it cannot use on CPU; they are no finding."""
    for name in GROUP_QUIET:
        logging.getLogger(name).setLevel(logging.ERROR)


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """SGLang's out-of-memory path logs an error and prints its whole tree: quiet while the adapter asks for it."""
    previous = logging.root.manager.disable
    logging.disable(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logging.disable(previous)


@dataclass
class Sglang:
    """The installed SGLang's cache layer: modules and the entry points this release has."""

    version: str
    torch: Any
    radix: Any
    pool: Any
    allocator: Any
    common: Any | None
    allocation: Any  # the scheduler's slot allocation functions (mem_cache/allocation.py or common.py)
    Req: Any
    SamplingParams: Any
    batch: Any = None
    server_args: Any = None

    # -- construction ---------------------------------------------------------------------
    def build(self, pages: int, page_size: int, rows: int, context: int, policy: str = "lru") -> tuple[Any, Any, Any]:
        """(token allocator, ReqToTokenPool, RadixCache) over ``pages`` pages of ``page_size`` KV slots, on CPU,
        evicting by SGLang's ``policy`` strategy (a release that has no strategies evicts lru only)."""
        torch = self.torch
        size = pages * page_size
        if self.server_args is not None:
            self.server_args.page_size = page_size  # the server's page size is the tree's (read up to 0.5.14)
        if page_size == 1:
            alloc = self.allocator.TokenToKVPoolAllocator(size, torch.float16, "cpu", None, False)
        else:
            alloc = self.allocator.PagedTokenToKVPoolAllocator(size, page_size, torch.float16, "cpu", None, False)
        if page_size > 1 and not hasattr(alloc, "use_triton_kernels"):
            _naive_extend_kernel(importlib.import_module(type(alloc).__module__))
        req_pool = self.pool.ReqToTokenPool(size=rows, max_context_len=context, device="cpu", enable_memory_saver=False)
        params_cls = getattr(self._module("sglang.srt.mem_cache.cache_init_params"), "CacheInitParams", None)
        if params_cls is not None:
            extra = {"eviction_policy": policy} if accepts(params_cls, "eviction_policy") else {}
            params = params_cls(
                disable=False,
                req_to_token_pool=req_pool,
                token_to_kv_pool_allocator=alloc,
                page_size=page_size,
                **extra,
            )
            tree = self.radix.RadixCache(params)
        elif accepts(self.radix.RadixCache, "eviction_policy"):
            tree = self.radix.RadixCache(req_pool, alloc, page_size, eviction_policy=policy)
        else:
            tree = self.radix.RadixCache(req_pool, alloc, page_size)
        return alloc, req_pool, tree

    def request(self, rid: str, tokens: tuple[int, ...]) -> Any:
        """The scheduler's own Req for a prompt: no text, default sampling, no logprobs."""
        req = self.Req(rid, "", array("q", tokens), self.SamplingParams(max_new_tokens=1 << 20))
        if isinstance(req.output_ids, list):  # token lists were Python lists before the array("q") ones
            req = self.Req(rid, "", list(tokens), self.SamplingParams(max_new_tokens=1 << 20))
        return req

    @staticmethod
    def _module(name: str) -> Any | None:
        try:
            return importlib.import_module(name)
        except ImportError:
            return None

    # -- the request path ------------------------------------------------------------------------
    def match(self, req: Any, tree: Any) -> tuple[int, Any]:
        """Match a waiting request's tokens as the scheduler does: (prefix tokens, last node).

        ``req.init_next_round_input(tree)`` where the release has it (at most len - 1 tokens are
        matched, so one is always computed; the tree rounds down to whole pages), else
        ``match_prefix`` on the tokens less the last one.
        """
        if hasattr(req, "init_next_round_input"):
            req.init_next_round_input(tree)
            matched = req.prefix_len if hasattr(req, "prefix_len") else len(req.prefix_indices)  # < 0.5.22
            return int(matched), req.last_node
        tokens = list(req.origin_input_ids) + list(req.output_ids)
        key_cls = getattr(self.radix, "RadixKey", None)
        key = key_cls(tokens[:-1]) if key_cls is not None else tokens[:-1]
        params_cls = getattr(self._module("sglang.srt.mem_cache.base_prefix_cache"), "MatchPrefixParams", None)
        result = tree.match_prefix(params_cls(key=key)) if params_cls is not None else tree.match_prefix(key=key)
        req.prefix_len, req.last_node = len(result.device_indices), result.last_device_node
        return int(req.prefix_len), req.last_node

    def lock(self, req: Any, tree: Any) -> None:
        """Lock the request's matched node, as the scheduler does when it admits it (``tree.lock``, 0.5.22+)."""
        if hasattr(tree, "lock"):
            req.lock = tree.lock(req.last_node)
        else:
            tree.inc_lock_ref(req.last_node)

    def unlock(self, req: Any, tree: Any) -> None:
        """Undo ``lock`` for a request the scheduler does not admit after all."""
        if hasattr(tree, "unlock"):
            tree.unlock(req.lock)
            req.lock = None
        else:
            tree.dec_lock_ref(req.last_node)

    def locked_node(self, req: Any) -> Any:
        lock = getattr(req, "lock", None)
        return lock.node if lock is not None and hasattr(lock, "node") else req.last_node

    def prefix_slots(self, tree: Any, req: Any) -> Any:
        """The KV slots of the request's matched prefix, read off the tree."""
        if hasattr(tree, "path_device_indices"):
            return tree.path_device_indices(req.last_node)
        return req.prefix_indices

    def retract(self, req: Any) -> None:
        """The scheduler's bookkeeping for a retracted request (it re-prefills all its tokens when resumed)."""
        if hasattr(req, "reset_for_retract"):
            req.reset_for_retract()

    def kv(self, req: Any) -> Any:
        """The request's KV bookkeeping: ``req.kv`` (0.5.20+) or the request itself."""
        kv = getattr(req, "kv", None)
        return kv if hasattr(kv, "req_pool_idx") else req

    def mark_allocated(self, req: Any, seq_len: int) -> None:
        """Record, as the scheduler's extend allocation does, that the row holds ``seq_len`` computed tokens
        (0.5.1x also keeps a ``ReqKvInfo`` on ``req.kv`` while the request holds KV)."""
        kv = self.kv(req)
        kv.kv_allocated_len = kv.kv_committed_len = seq_len
        info_cls = getattr(self.batch, "ReqKvInfo", None)
        if kv is req and info_cls is not None and hasattr(req, "kv"):
            if req.kv is None:
                fields = {"kv_allocated_len": seq_len, "swa_evicted_seqlen": 0}
                req.kv = info_cls(**{k: v for k, v in fields.items() if accepts(info_cls, k)})
            else:
                req.kv.kv_allocated_len = seq_len

    def row_index(self, req: Any) -> int | None:
        idx = self.kv(req).req_pool_idx
        return None if idx is None else int(idx)

    def alloc_row(self, req_pool: Any, req: Any, tree: Any) -> None:
        """A ReqToTokenPool row for the request (SGLang's alloc_req_slots where it has one)."""
        if accepts(getattr(self.allocation, "alloc_req_slots", None), "num_reqs"):
            extra = [tree] if accepts(self.allocation.alloc_req_slots, "tree_cache") else []  # 0.5.4+
            (idx,) = self.allocation.alloc_req_slots(req_pool, 1, [req], *extra)  # 0.5.3-0.5.8
        elif hasattr(self.allocation, "alloc_req_slots"):
            (idx,) = self.allocation.alloc_req_slots(req_pool, [req], tree)
        elif accepts(req_pool.alloc, "reqs"):
            (idx,) = req_pool.alloc([req])
        else:
            (idx,) = req_pool.alloc(1)
        self.kv(req).req_pool_idx = idx

    def alloc_tokens(self, tree: Any, row: Any, prefix_len: int, seq_len: int) -> Any:
        """KV slots for tokens [prefix_len, seq_len) of a row, evicting from the tree as the scheduler does.

        Paged: ``alloc_paged_token_slots_extend`` (continues the row's last page); one slot per page:
        ``alloc_token_slots``. Raises RuntimeError (SGLang's out-of-memory) when they do not fit.
        """
        torch, alloc = self.torch, tree.token_to_kv_pool_allocator
        n = seq_len - prefix_len
        if alloc.page_size == 1:
            return self.allocation.alloc_token_slots(tree, n)
        last = row[prefix_len - 1 : prefix_len].to(torch.int64) if prefix_len else torch.full((1,), -1)
        prefix = torch.tensor([prefix_len], dtype=torch.int64)
        seq = torch.tensor([seq_len], dtype=torch.int64)
        return self.allocation.alloc_paged_token_slots_extend(
            tree_cache=tree,
            prefix_lens=prefix,
            prefix_lens_cpu=prefix,
            seq_lens=seq,
            seq_lens_cpu=seq,
            last_loc=last,
            extend_num_tokens=n,
        )

    def checkpoint(self, req: Any, tree: Any, up_to: int) -> None:
        """Publish the request's computed tokens [0, up_to) to the tree and move its lock (what the scheduler does
        after a prefill): ``checkpoint_kv_cache`` (0.5.22+), ``maybe_cache_unfinished_req`` (0.5.20-0.5.21), else
        the tree's ``cache_unfinished_req``."""
        if hasattr(req, "set_extend_range"):  # 0.5.15-0.5.21: the scheduler's record of the tokens this prefill made
            req.set_extend_range(0, up_to)
        if hasattr(req, "fill_len"):  # 0.5.13-0.5.14: PrefillAdder sets it; get_fill_ids() is ids[:fill_len]
            req.fill_len = up_to
        req.extend_end = up_to
        common = self.common
        if common is not None and hasattr(common, "checkpoint_kv_cache"):
            common.checkpoint_kv_cache(req, tree)
        elif common is not None and hasattr(common, "maybe_cache_unfinished_req"):
            common.maybe_cache_unfinished_req(req, tree)
        else:
            tree.cache_unfinished_req(req)

    def release(self, req: Any, tree: Any, *, insert: bool) -> None:
        """Give back the request's row; with ``insert`` the tree keeps its tokens first (a finished request):
        ``release_kv_cache`` (``checkpoint=`` from 0.5.22, ``is_insert=`` before), else ``cache_finished_req``."""
        release = getattr(self.common, "release_kv_cache", None)
        if release is not None:
            flag = "checkpoint" if accepts(release, "checkpoint") else "is_insert"
            release(req, tree, **{flag: insert})
            return
        kwargs: dict[str, Any] = {"is_insert": insert} if accepts(tree.cache_finished_req, "is_insert") else {}
        if accepts(tree.cache_finished_req, "kv_len_to_handle"):
            kwargs["kv_len_to_handle"] = self.kv(req).kv_committed_len
        # Before 0.5.5 (no committed KV length) cache_finished_req takes a running Req's last output token to be the
        # one just sampled, whose KV is not computed yet, and leaves it out; every token the adapter's Req holds is
        # computed, so the sampled one is added for the call, as the scheduler's Req has it.
        sampled = not hasattr(req, "pop_committed_kv_cache")
        if sampled:
            req.output_ids.append(0)
        try:
            tree.cache_finished_req(req, **kwargs)
        finally:
            if sampled:
                req.output_ids.pop()
        idx, req_pool = self.kv(req).req_pool_idx, tree.req_to_token_pool
        if idx is not None and idx not in req_pool.free_slots:  # cache_finished_req frees the row itself before 0.5.9
            req_pool.free(req if accepts(req_pool.free, "req") else idx)

    def free_row(self, req_pool: Any, req: Any) -> None:
        """Give back a row ``alloc_row`` took for a request that holds no slots yet (its allocation failed)."""
        idx = self.kv(req).req_pool_idx
        if idx is not None and idx not in req_pool.free_slots:
            req_pool.free(req if accepts(req_pool.free, "req") else idx)
        self.kv(req).req_pool_idx = None

    def no_slots(self) -> Any:
        """The KV slot indices of a request that holds none: an empty index tensor, as the allocator's free takes."""
        return self.torch.empty((0,), dtype=self.torch.int64)

    def seq_len(self, req: Any) -> int:
        """Tokens the request holds: its prompt and its output so far."""
        return len(req.origin_input_ids) + len(req.output_ids)

    def evictable(self, tree: Any) -> int:
        return int(tree.evictable_size())


def load() -> Sglang:
    """The installed SGLang's cache layer (raises ImportError, saying so, without SGLang)."""
    if importlib.util.find_spec("sglang") is None:
        raise ImportError(f"SGLang extra not installed in {sys.executable}: {INSTALL_HINT}")
    _quiet()
    import torch

    radix = importlib.import_module("sglang.srt.mem_cache.radix_cache")
    pool = importlib.import_module("sglang.srt.mem_cache.memory_pool")
    allocator = Sglang._module("sglang.srt.mem_cache.allocator") or pool
    _quiet()
    batch = importlib.import_module("sglang.srt.managers.schedule_batch")
    allocation = _allocation_module()
    if allocation is None:
        raise ImportError(
            f"sglang {metadata.version('sglang')}: before 0.5.3 the slot allocation is ScheduleBatch's (mem_cache has"
            " no alloc_paged_token_slots_extend) and the retraction frees KV inline in retract_decode; not supported"
        )
    server_args = _publish_server_args()
    sampling = importlib.import_module("sglang.srt.sampling.sampling_params")
    return Sglang(
        version=metadata.version("sglang"),
        torch=torch,
        radix=radix,
        pool=pool,
        allocator=allocator,
        common=Sglang._module("sglang.srt.mem_cache.common"),
        allocation=allocation,
        Req=batch.Req,
        batch=batch,
        server_args=server_args,
        SamplingParams=sampling.SamplingParams,
    )


class _NaiveExtend:
    """``alloc_extend_kernel[grid](...)`` run as SGLang's own ``alloc_extend_naive`` (its torch twin of the kernel)."""

    def __init__(self, naive: Any) -> None:
        self.naive = naive

    def __getitem__(self, grid: Any) -> Any:
        def run(
            prefix_lens: Any, seq_lens: Any, last_loc: Any, free_pages: Any, out: Any, _bs: int, ps: int, *_: Any
        ) -> None:
            self.naive(prefix_lens, seq_lens, last_loc, free_pages, out, ps, out.device)  # 0.5.9 passes one more

        return run


def _naive_extend_kernel(paged: Any) -> None:
    """Before 0.5.22 the paged allocator's ``alloc_extend`` launches a Triton kernel, which has no CPU driver; from
    0.5.9 the same module ships ``alloc_extend_naive``, the kernel's torch version: point the allocator's kernel at it.
    Before 0.5.9 there is none; the kernel itself runs on CPU in Triton's interpreter (``TRITON_INTERPRET=1`` set
    before Triton is imported), and is left as it is."""
    naive = getattr(paged, "alloc_extend_naive", None)
    kernel = getattr(paged, "alloc_extend_kernel", None)
    if naive is None and type(kernel).__name__ == "InterpretedFunction":
        return
    if naive is None or kernel is None:
        raise RuntimeError(
            f"{paged.__name__}: alloc_extend is a Triton kernel with no torch version in this release;"
            " run with TRITON_INTERPRET=1 (Triton's interpreter runs it on CPU)"
        )
    if not isinstance(paged.alloc_extend_kernel, _NaiveExtend):
        paged.alloc_extend_kernel = _NaiveExtend(naive)


def _allocation_module() -> Any | None:
    """Where the scheduler's slot allocation lives: ``mem_cache/allocation.py`` (0.5.10+) or ``common.py``."""
    for name in ("sglang.srt.mem_cache.allocation", "sglang.srt.mem_cache.common"):
        module = Sglang._module(name)
        if module is not None and hasattr(module, "alloc_paged_token_slots_extend"):
            return module
    return None


def _publish_server_args() -> Any:
    """Publish default ServerArgs, as the scheduler's process does before its first request: from 0.5.22 the
    request path reads them (``get_serving()``, ``get_spec()``), before through a global of server_args."""
    server_args = importlib.import_module("sglang.srt.server_args")
    try:
        args = server_args.ServerArgs(model_path="kvspec-no-model", device="cpu")
    except Exception:  # 0.5.14-0.5.17 validate by loading the model's config: take the declared defaults as they are
        args = object.__new__(server_args.ServerArgs)
        for f in dataclasses.fields(server_args.ServerArgs):
            if f.default is not dataclasses.MISSING:
                setattr(args, f.name, f.default)
            elif f.default_factory is not dataclasses.MISSING:
                setattr(args, f.name, f.default_factory())
        args.model_path, args.device = "kvspec-no-model", "cpu"
    context = Sglang._module("sglang.srt.runtime_context")
    holder: Any = context.get_context() if context is not None and hasattr(context, "get_context") else None
    if hasattr(holder, "set_server_args"):  # 0.5.17+ (0.5.14 has a RuntimeContext without it)
        holder.set_server_args(args)
    elif hasattr(server_args, "set_global_server_args_for_scheduler"):
        server_args.set_global_server_args_for_scheduler(args)
    return args


def accepts(func: Any, name: str) -> bool:
    """Whether ``func`` takes a parameter called ``name``."""
    try:
        return name in inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False
