"""Realistic bugs seeded into SGLang's own radix tree, each reported by one named invariant.

Each ``SglangBug`` replaces one method of an SGLang class (with pytest's
``monkeypatch``) by a version with a mistake an engine developer could make;
tests/test_sglang_adapter.py asserts that `kvspec check --adapter sglang`
reports it with ``invariant``. The replacements wrap the installed release's own
method (``make`` receives the original) and change only what the bug changes,
so the rest of the tree stays SGLang's. Importing this module does not import
SGLang: the classes are looked up when a bug is applied.

These are the seeded bugs of the radix invariants (spec/invariants/radix.py):
tests/test_seeded_bugs.py counts them with the reference catalogue.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Method = Callable[..., Any]
RADIX_MODULE = "sglang.srt.mem_cache.radix_cache"


@dataclass(frozen=True)
class SglangBug:
    """One method of one SGLang class replaced by a buggy version, and the invariant that must report it."""

    name: str
    invariant: str
    make: Callable[[Method], Method]  # original method -> buggy method
    description: str
    attribute: str
    cls: str = "RadixCache"
    module: str = RADIX_MODULE

    def target(self) -> Any:
        return getattr(importlib.import_module(self.module), self.cls)


def _leaf_status_ignores_locks(original: Method) -> Method:
    def buggy(self: Any, node: Any) -> Any:
        saved = node.lock_ref
        node.lock_ref = 0  # the leaf test forgets lock_ref: a locked leaf joins the evictable leaves
        try:
            return original(self, node)
        finally:
            node.lock_ref = saved

    return buggy


def _dec_lock_ref_keeps_sizes(original: Method) -> Method:
    def buggy(self: Any, node: Any, *args: Any, **kwargs: Any) -> Any:
        evictable, protected = self.evictable_size_, self.protected_size_
        result = original(self, node, *args, **kwargs)
        self.evictable_size_, self.protected_size_ = evictable, protected  # unlocked nodes stay "protected"
        return result

    return buggy


def _split_loses_half(original: Method) -> Method:
    def buggy(self: Any, key: Any, child: Any, split_len: int) -> Any:
        new_node = original(self, key, child, split_len)
        child.value = child.value[split_len:]  # the suffix is cut twice: it loses split_len KV slots
        return new_node

    return buggy


def _split_keeps_old_parent(original: Method) -> Method:
    def buggy(self: Any, key: Any, child: Any, split_len: int) -> Any:
        new_node = original(self, key, child, split_len)
        child.parent = new_node.parent  # the suffix is moved under new_node but still names its old parent
        return new_node

    return buggy


def _insert_counts_twice(original: Method) -> Method:
    def buggy(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = self.evictable_size_
        result = original(self, *args, **kwargs)
        self.evictable_size_ += self.evictable_size_ - before  # a new node's tokens added a second time
        return result

    return buggy


def _lock_only_the_node(original: Method) -> Method:
    def buggy(self: Any, node: Any) -> Any:
        parent = node.parent if node is not self.root_node else None
        if parent is None or parent is self.root_node:
            return original(self, node)
        cut, node.parent = node.parent, self.root_node  # the walk stops at the node itself
        try:
            return original(self, node)
        finally:
            node.parent = cut

    return buggy


def _evict_newest_first(original: Method) -> Method:
    def buggy(self: Any, node: Any) -> Any:
        return -original(self, node)  # the heap pops the most recently used leaf first

    return buggy


def _evict_keeps_slots(original: Method) -> Method:
    def buggy(self: Any, params: Any) -> Any:
        allocator = self.token_to_kv_pool_allocator
        allocator.free_segment = lambda *a, **k: None  # the evicted nodes' slots never go back to the allocator
        try:
            return original(self, params)
        finally:
            del allocator.free_segment

    return buggy


SGLANG_BUGS: list[SglangBug] = [
    SglangBug(
        "sglang-evict-locked-leaf",
        "radix_locked_kept",
        _leaf_status_ignores_locks,
        "_update_leaf_status forgets lock_ref: a locked leaf is evicted under a running request",
        "_update_leaf_status",
    ),
    SglangBug(
        "sglang-dec-lock-ref-keeps-sizes",
        "radix_size_accounting",
        _dec_lock_ref_keeps_sizes,
        "dec_lock_ref drops lock_ref to 0 but leaves the tokens in protected_size, not evictable_size",
        "dec_lock_ref",
    ),
    SglangBug(
        "sglang-split-loses-half",
        "radix_value_matches_key",
        _split_loses_half,
        "_split_node slices the suffix's value twice: its key keeps split_len tokens more than its value",
        "_split_node",
    ),
    SglangBug(
        "sglang-insert-double-counts",
        "radix_size_accounting",
        _insert_counts_twice,
        "_insert_helper adds a new node's tokens to evictable_size twice",
        "_insert_helper",
    ),
    SglangBug(
        "sglang-split-stale-parent",
        "radix_tree_links",
        _split_keeps_old_parent,
        "_split_node hangs the suffix under the new node but leaves its parent pointer on the old one",
        "_split_node",
    ),
    SglangBug(
        "sglang-lock-only-the-node",
        "radix_lock_refs",
        _lock_only_the_node,
        "inc_lock_ref locks the matched node but not its ancestors",
        "inc_lock_ref",
    ),
    SglangBug(
        "sglang-evict-newest-first",
        "radix_policy_conformance",
        _evict_newest_first,
        "the LRU strategy's priority has the wrong sign: the most recently used leaf is evicted first",
        "get_priority",
        cls="LRUStrategy",
        module="sglang.srt.mem_cache.evict_policy",
    ),
    SglangBug(
        "sglang-evict-keeps-slots",
        "radix_token_conservation",
        _evict_keeps_slots,
        "evict deletes the leaf but never frees its KV slots: the pool leaks what it evicts",
        "evict",
    ),
]
