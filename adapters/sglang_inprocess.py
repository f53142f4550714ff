"""Adapter for SGLang's radix prefix cache and KV token pool, in process: real Reqs, no model, no GPU.

Each spec operation is what SGLang's scheduler does for one request, through its own entry points:

=================  ========================================================================================
spec               SGLang
=================  ========================================================================================
admit(r, prompt)   Req(prompt); ``init_next_round_input(tree)`` (match_prefix, at most len - 1 tokens);
                   ``tree.lock(last_node)``; refused when the allocator's available slots plus the tree's
                   evictable size cannot hold the rest (PrefillAdder's budget; the lock is undone);
                   else ``alloc_req_slots`` and ``alloc_paged_token_slots_extend`` (which evicts from the
                   tree when short), the row written, and ``checkpoint_kv_cache`` (the prompt inserted
                   into the tree, the lock moved to its node: what the scheduler does after a prefill).
append(r, toks)    output tokens appended; their slots from ``alloc_paged_token_slots_extend`` on the
                   row (evicting when short); refused, with the tokens taken back, when they cannot fit.
release(r)         ``release_kv_cache(req, tree, checkpoint=keep)``: the request's tokens inserted into
                   the tree (keep), what the tree does not hold freed, the lock dropped.
preempt(r)         ``release_kv_cache(req, tree, checkpoint=False)``; ``req.reset_for_retract()``.
resume(r)          as admit, for the retracted Req with all its tokens.
reset_cache()      the scheduler's flush: refused while any request is live; else ``tree.reset()``,
                   ``req_to_token_pool.clear()``, ``allocator.clear()``.
contracts          ``admit:unchecked``, ``resume:unchecked``, ``append:unchecked``: no budget first; SGLang's
                   allocation evicts from the tree and raises out of memory when the pool still lacks room
                   (refused: the row and lock are given back, what SGLang's call left is judged);
                   ``release:never_admitted``: first the allocator's ``free`` of a request holding no slots.
=================  ========================================================================================

The observation is projected from SGLang's own state (``observe``): one page of
``page_size`` KV slots is one block object; a page in the tree is keyed by the
token path from the root to its end and carries its node's ``lock_ref``; a page a
request holds outside the tree is uncached; free is the allocator's
``available_size()``. Nothing is filtered: a node's partial last page is an object
too, keyed by its path. The whole tree (keys, values, lock_ref, parents, children,
access times, the evictable and protected sizes, each request's row and lock)
goes under ``extra["radix"]`` for the radix invariants (spec.radix_view).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from kvspec.adapter import (
    RADIX,
    Capabilities,
    Config,
    Event,
    ObjectView,
    Observation,
    Op,
    Outcome,
    RadixNode,
    RadixOrder,
    RadixView,
    RequestView,
    Semantics,
    blocks_for,
)
from kvspec.adapters import _sglang_shims as shims

POLICIES: dict[str, RadixOrder] = {
    "lru": "radix_lru",
    "lfu": "radix_lfu",
    "fifo": "radix_fifo",
    "priority": "radix_priority",
}
"""SGLang's eviction strategies (``--radix-eviction-policy``) the spec can declare, and the radix order each is."""


def declared_semantics(policy: str) -> Semantics:
    """SGLang's choices as spec parameters: pages are blocks; unlocked leaves are evicted in the order of its
    eviction strategy (lru by default); a hit leaves one prompt token to compute; a flush needs an idle
    scheduler; a retraction keeps what the tree held and frees the decoded tokens not inserted yet (SGLang's
    ``retract_decode``: ``release_kv_cache(req, tree_cache, checkpoint=False)``, "TODO: for preempted requests,
    we may want to insert into the tree"), a bounded loss declared as ``preempt_keeps="cached"``. Not exact:
    eviction frees whole nodes and full pages are cached on prefill and release only, so
    the block ledger's predictions do not apply; every safety, radix and policy invariant does."""
    return Semantics(
        granularity="block",
        eviction=POLICIES[policy],
        hit_cap=True,
        reset_requires_idle=True,
        exact=False,
        preempt_keeps="cached",  # retraction frees what was decoded since the last insertion (docs/sglang.md)
    )


NOTES = (
    "block = one page of page_size KV slots; a cached page is keyed by its token path from the root",
    "refinement checks are off (exact=False): SGLang evicts whole tree nodes, LRU over leaves",
    "reset_cache is refused while any request is live, preempted ones included (the scheduler's flush)",
)


CONTRACTS = frozenset({"admit:unchecked", "resume:unchecked", "append:unchecked", "release:never_admitted"})
"""The misuse contracts SGLang's API allows (judged as the plain op): the allocation with no budget first
(``unchecked``: SGLang evicts and allocates, and raises out of memory when the pool lacks room), and the
allocator's ``free`` of a request that holds no slots (``never_admitted``: an empty index tensor). Its
``release_kv_cache`` asserts on a request that holds no row (repeated, or never admitted), so no repeated free."""


def _tokens(key: Any) -> tuple[int, ...]:
    return tuple(int(t) for t in key)


class SglangAdapter:
    """SGLang's RadixCache, ReqToTokenPool and token allocator driven like its scheduler drives them."""

    name = "sglang"

    def __init__(self, policy: str = "lru") -> None:
        self.sg = shims.load()
        self.policy = policy
        self.capabilities = Capabilities(
            semantics=declared_semantics(policy), version=f"sglang {self.sg.version}", notes=NOTES, contracts=CONTRACTS
        )
        self.running: dict[str, Any] = {}  # request id -> Req holding a row
        self.waiting: dict[str, Any] = {}  # request id -> retracted Req, holding nothing
        self._events: list[Event] = []
        self._event_kind: Any = "evict"
        self.reset(Config())

    # -- lifecycle ------------------------------------------------------------------------
    def reset(self, config: Config) -> None:
        """A fresh pool of config.capacity pages of config.block_size slots, a tree and a row per possible request."""
        self.config = config
        self.page_size = config.block_size
        self.max_len = config.capacity * config.block_size
        self.running.clear()
        self.waiting.clear()
        self._events.clear()
        rows = config.capacity + 2
        self.alloc, self.req_pool, self.tree = self.sg.build(
            config.capacity, self.page_size, rows, self.max_len + 1, self.policy
        )
        self._tap_evictions(self.tree)

    def close(self) -> None:
        self.running.clear()
        self.waiting.clear()

    def events(self) -> list[Event]:
        out, self._events = self._events, []
        return out

    def _tap_evictions(self, tree: Any) -> None:
        """Report each page of every node the tree deletes, as it deletes it (``_delete_leaf``: eviction's one
        way out of the tree). The tap wraps this tree instance's own method and changes nothing."""
        original = tree._delete_leaf

        def tapped(node: Any) -> Any:
            path = self._path(node)
            start = len(path) - len(node.key)
            slots = [int(s) for s in node.value.tolist()]
            result = original(node)
            ps = self.page_size
            for i in range(0, len(slots), ps):
                self._events.append(Event(self._event_kind, slots[i] // ps, path[: start + i + ps]))
            return result

        tree._delete_leaf = tapped

    def _path(self, node: Any) -> tuple[int, ...]:
        parts = []
        seen = 0
        while node is not None and node is not self.tree.root_node and seen <= self.config.capacity + 1:
            parts.append(_tokens(node.key))
            node = node.parent
            seen += 1
        return tuple(t for part in reversed(parts) for t in part)

    def apply(self, op: Op) -> Outcome:
        """Run a valid ``op`` (bad input never reaches an adapter: the kit answers it, Capabilities.checks_input)."""
        self._event_kind = "reclaim" if op.op == "reset_cache" else "evict"
        if op.op == "reset_cache":
            return self._reset_cache()
        assert op.req is not None
        outcome: Outcome = getattr(self, f"_{op.op}")(op.req, op)
        return outcome

    # -- the scheduler's steps for one request -----------------------------------------------------
    def _fits(self, tokens: int) -> bool:
        """PrefillAdder's and check_decode_mem's budget: available slots plus the tree's evictable size."""
        return int(self.alloc.available_size()) + self.sg.evictable(self.tree) >= tokens

    def _schedule(self, req: Any, checked: bool = True) -> Outcome:
        """Prefill a waiting Req: match, lock, budget, row, slots (evicting when short), then checkpoint.

        ``checked=False`` (the misuse contract ``unchecked``): no budget first, so SGLang's own allocation finds
        a pool that lacks room: ``alloc_paged_token_slots_extend`` raises out of memory (its allocator's
        ``alloc_extend`` returned None); the adapter gives back the row and the lock it took, and answers
        refused with what SGLang's call left (the tree evicted before the allocation failed) to the checks.
        """
        sg, tree, ps = self.sg, self.tree, self.page_size
        prefix_len, _ = sg.match(req, tree)
        sg.lock(req, tree)
        seq_len = sg.seq_len(req)
        need = (blocks_for(seq_len, ps) - prefix_len // ps) * ps
        if checked and not self._fits(need):
            sg.unlock(req, tree)
            return Outcome.refused(f"{need} slots needed, {self.alloc.available_size()} available")
        prefix = sg.prefix_slots(tree, req)
        sg.alloc_row(self.req_pool, req, tree)
        row = self.req_pool.req_to_token[sg.row_index(req)]
        row[:prefix_len] = prefix[:prefix_len]
        out = self._alloc(row, prefix_len, seq_len, checked)
        if isinstance(out, Outcome):
            sg.free_row(self.req_pool, req)
            sg.unlock(req, tree)
            return out
        row[prefix_len:seq_len] = out
        sg.mark_allocated(req, seq_len)
        sg.checkpoint(req, tree, seq_len)
        self.running[req.rid] = req
        return Outcome.ok(prefix_len)

    def _alloc(self, row: Any, start: int, end: int, checked: bool) -> Any:
        """KV slots for tokens [start, end) of ``row`` (SGLang evicting from the tree when short). Past no budget
        (``checked=False``) SGLang's out of memory is its answer: a refused Outcome, its log and tree dump
        silenced; past the budget it raises, as anything SGLang raises, for the kit to report."""
        if checked:
            return self.sg.alloc_tokens(self.tree, row, start, end)
        try:
            with shims.silenced():
                return self.sg.alloc_tokens(self.tree, row, start, end)
        except RuntimeError as exc:
            return Outcome.refused(f"SGLang's allocation raised: {str(exc).splitlines()[0]}")

    def _admit(self, rid: str, op: Op) -> Outcome:
        return self._schedule(self.sg.request(rid, op.tokens), checked=op.contract != "unchecked")

    def _resume(self, rid: str, op: Op) -> Outcome:
        outcome = self._schedule(self.waiting[rid], checked=op.contract != "unchecked")
        if outcome.status == "ok":
            del self.waiting[rid]
        return outcome

    def _append(self, rid: str, op: Op) -> Outcome:
        """Decode tokens: check_decode_mem's budget (none under the contract ``unchecked``), then their slots."""
        sg, ps = self.sg, self.page_size
        req = self.running[rid]
        before = sg.seq_len(req)
        after = before + len(op.tokens)
        need = (blocks_for(after, ps) - blocks_for(before, ps)) * ps
        if op.contract != "unchecked" and not self._fits(need):
            return Outcome.refused(f"{need} slots needed, {self.alloc.available_size()} available")
        req.output_ids.extend(op.tokens)
        row = self.req_pool.req_to_token[sg.row_index(req)]
        out = self._alloc(row, before, after, op.contract != "unchecked")
        if isinstance(out, Outcome):  # the tokens are taken back
            del req.output_ids[len(req.output_ids) - len(op.tokens) :]
            return out
        row[before:after] = out
        sg.mark_allocated(req, after)
        return Outcome.ok()

    def _release(self, rid: str, op: Op) -> Outcome:
        if op.contract == "never_admitted":  # the allocator's free of what a never-admitted request holds: nothing
            self.alloc.free(self.sg.no_slots())
        if rid in self.waiting:
            del self.waiting[rid]
            return Outcome.ok()
        req = self.running.pop(rid)
        self.sg.release(req, self.tree, insert=op.keep)
        return Outcome.ok()

    def _preempt(self, rid: str, op: Op) -> Outcome:
        req = self.running.pop(rid)
        self.sg.release(req, self.tree, insert=False)
        self.sg.retract(req)
        self.waiting[rid] = req
        return Outcome.ok()

    def _reset_cache(self) -> Outcome:
        """The scheduler's flush_cache: only with no request live; every cached page is reclaimed."""
        if self.running or self.waiting:
            return Outcome.refused("requests are live")
        view = self._radix()
        ps = self.page_size
        for node in view.nodes.values():
            path = view.path(node.nid) or ()
            start = len(path) - len(node.key)
            for i in range(0, len(node.value), ps):
                self._events.append(Event("reclaim", node.value[i] // ps, path[: start + i + ps]))
        self.tree.reset()
        self.req_pool.clear()
        self.alloc.clear()
        return Outcome.ok()

    # -- projection ----------------------------------------------------------------------------------
    def _radix(self) -> RadixView:
        """The tree, its counters, each running request's row and lock, as SGLang holds them."""
        tree, ps = self.tree, self.page_size
        nodes: dict[Hashable, RadixNode] = {}
        stack = [tree.root_node]
        bound = self.config.capacity * self.page_size + 2
        while stack and len(nodes) <= bound:
            node = stack.pop()
            if node.id in nodes:
                continue
            children = list(node.children.values())
            value = node.value.tolist() if hasattr(node.value, "tolist") else list(node.value)
            nodes[node.id] = RadixNode(
                nid=node.id,
                parent=None if node.parent is None else node.parent.id,
                key=_tokens(node.key),
                value=tuple(int(v) for v in value),
                lock_ref=int(node.lock_ref),
                children=tuple(c.id for c in children),
                last_access=float(node.last_access_time),
                created=float(getattr(node, "creation_time", node.last_access_time)),
                hits=int(node.hit_count),
                priority=float(getattr(node, "priority", 0)),
            )
            stack.extend(children)
        rows: dict[str, tuple[int, ...]] = {}
        locks: dict[str, Hashable | None] = {}
        for rid, req in self.running.items():
            idx = self.sg.row_index(req)
            n = self.sg.kv(req).kv_allocated_len
            rows[rid] = () if idx is None else tuple(int(s) for s in self.req_pool.req_to_token[idx, :n].tolist())
            node = self.sg.locked_node(req)
            locks[rid] = None if node is None or node is tree.root_node else node.id
        return RadixView(
            page_size=ps,
            pool_tokens=self.config.capacity * ps,
            free_tokens=int(self.alloc.available_size()),
            evictable_size=int(tree.evictable_size()),
            protected_size=int(tree.protected_size()),
            root=tree.root_node.id,
            nodes=nodes,
            rows=rows,
            locks=locks,
        )

    def observe(self) -> Observation:
        view = self._radix()
        ps = self.page_size
        objects: dict[Any, ObjectView] = {}
        index: dict[Any, tuple[Any, ...]] = {}
        for node in view.nodes.values():
            if node.nid == view.root:
                continue
            path = view.path(node.nid) or ()
            start = len(path) - len(node.key)
            for i in range(0, len(node.value), ps):  # a node's partial last page too: shown, never dropped
                page, key = node.value[i] // ps, path[: start + i + ps]
                objects[page] = ObjectView(page, 1, min(ps, len(node.value) - i), node.lock_ref, key)
                index[key] = (page,)
        requests: dict[str, RequestView] = {}
        outside: dict[int, list[int]] = {}
        for rid, req in self.running.items():
            row, n = view.rows[rid], self.sg.seq_len(req)
            pages = tuple(row[i] // ps for i in range(0, len(row), ps))
            for i, page in enumerate(pages):
                if page not in objects:
                    outside.setdefault(page, []).append(min(ps, n - i * ps))
            tokens = (*req.origin_input_ids, *req.output_ids)
            requests[rid] = RequestView(rid, tuple(int(t) for t in tokens), len(req.origin_input_ids), pages)
        for page, held in outside.items():
            objects[page] = ObjectView(page, 1, max(held), len(held), None)
        for rid, req in self.waiting.items():
            tokens = (*req.origin_input_ids, *req.output_ids)
            requests[rid] = RequestView(rid, tuple(int(t) for t in tokens), len(req.origin_input_ids), (), "preempted")
        extra = {RADIX: view, "available_size": view.free_tokens}
        return Observation(self.config.capacity, view.free_tokens // ps, objects, requests, index, extra)


def lfu() -> SglangAdapter:
    """SGLang with ``--radix-eviction-policy lfu``: fewest hits, then least recently accessed, first."""
    return SglangAdapter("lfu")


def fifo() -> SglangAdapter:
    """SGLang with ``--radix-eviction-policy fifo``: oldest node first."""
    return SglangAdapter("fifo")


def priority() -> SglangAdapter:
    """SGLang with ``--radix-eviction-policy priority``: lowest request priority, then least recently accessed."""
    return SglangAdapter("priority")
