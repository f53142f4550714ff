"""Radix invariants: what any radix-tree prefix cache keeps, read from the RadixView it shows (spec.radix_view).

They do not apply (None) to an adapter whose observation carries no RadixView.
Safety ones hold for every radix cache; ``radix_policy_conformance`` judges the
eviction order it declares (``Semantics.eviction`` one of ``RADIX_ORDERS``).
"""

from __future__ import annotations

from collections.abc import Hashable

from ..radix_view import RADIX_ORDERS, RANK_KEYS, RadixView, radix_view
from .transition import Invariant, Problems, Transition


def _slots_of(view: RadixView, nid: Hashable | None) -> tuple[int, ...] | None:
    """The KV slots on the path from the root to ``nid`` (root first); None when the path does not reach the root."""
    slots: list[tuple[int, ...]] = []
    steps = len(view.nodes) + 1
    node = view.nodes.get(nid) if nid is not None else None
    while node is not None and node.nid != view.root:
        slots.append(node.value)
        steps -= 1
        if steps < 0 or node.parent is None:
            return None
        node = view.nodes.get(node.parent)
    if node is None and nid is not None:
        return None
    return tuple(s for part in reversed(slots) for s in part)


def _lockers(view: RadixView) -> dict[Hashable, int]:
    """How many running requests lock each node, directly or through a node below it."""
    counts: dict[Hashable, int] = {}
    for nid in view.locks.values():
        seen = 0
        node = view.nodes.get(nid) if nid is not None else None
        while node is not None and node.nid != view.root and seen <= len(view.nodes):
            counts[node.nid] = counts.get(node.nid, 0) + 1
            node = view.nodes.get(node.parent) if node.parent is not None else None
            seen += 1
    return counts


# -- state invariants ------------------------------------------------------------------------


def radix_tree_links(t: Transition) -> Problems:
    """Every node is reachable from the root through child maps, and each child's parent is the node listing it.

    Two children of one node never start with the same page (a radix tree has one edge per first page),
    and no node is listed twice: every cached token path is one path from the root.
    """
    view = radix_view(t.after)
    if view is None:
        return None
    problems = []
    reached: set[Hashable] = {view.root}
    stack = [view.root]
    while stack:
        nid = stack.pop()
        node = view.nodes.get(nid)
        if node is None:
            problems.append(f"node {nid!r} is listed as a child but is not in the tree")
            continue
        firsts: dict[tuple[int, ...], Hashable] = {}
        for cid in node.children:
            child = view.nodes.get(cid)
            if child is None:
                problems.append(f"node {nid!r} lists child {cid!r}, which is not in the tree")
                continue
            if child.parent != nid:
                problems.append(f"node {cid!r} is a child of {nid!r} but its parent is {child.parent!r}")
            first = child.key[: view.page_size]
            if first in firsts:
                problems.append(f"children {firsts[first]!r} and {cid!r} of {nid!r} both start with {list(first)}")
            firsts[first] = cid
            if cid in reached:
                problems.append(f"node {cid!r} is reached twice from the root")
                continue
            reached.add(cid)
            stack.append(cid)
    problems += [f"node {nid!r} is not reachable from the root" for nid in view.nodes if nid not in reached]
    return problems


def radix_value_matches_key(t: Transition) -> Problems:
    """Each non-root node holds one KV slot per key token, in whole pages: len(value) == len(key) > 0,
    a multiple of page_size, each page's slots one aligned page of the pool."""
    view = radix_view(t.after)
    if view is None:
        return None
    ps, problems = view.page_size, []
    for node in view.nodes.values():
        if node.nid == view.root:
            continue
        if len(node.value) != len(node.key) or not node.key:
            problems.append(f"node {node.nid!r} has a key of {len(node.key)} tokens and {len(node.value)} KV slots")
            continue
        if len(node.key) % ps:
            problems.append(f"node {node.nid!r} holds {len(node.key)} tokens, not whole pages of {ps}")
            continue
        for i in range(0, len(node.value), ps):
            page = node.value[i : i + ps]
            if page[0] % ps or page != tuple(range(page[0], page[0] + ps)):
                problems.append(f"node {node.nid!r} page {i // ps} holds slots {list(page)}, not one page of the pool")
    return problems


def radix_lock_refs(t: Transition) -> Problems:
    """lock_ref is never below zero and equals the number of running requests whose locked node is it or below it."""
    view = radix_view(t.after)
    if view is None:
        return None
    lockers = _lockers(view)
    problems = []
    for node in view.nodes.values():
        if node.nid == view.root:
            continue
        if node.lock_ref < 0:
            problems.append(f"node {node.nid!r} has lock_ref {node.lock_ref}")
        elif node.lock_ref != lockers.get(node.nid, 0):
            problems.append(
                f"node {node.nid!r} has lock_ref {node.lock_ref} but {lockers.get(node.nid, 0)} running request(s) "
                f"lock it or a node below it"
            )
    problems += [
        f"request {rid!r} locks node {nid!r}, which is not in the tree"
        for rid, nid in view.locks.items()
        if nid is not None and nid not in view.nodes
    ]
    return problems


def radix_size_accounting(t: Transition) -> Problems:
    """The tree's evictable size is the tokens of its unlocked nodes, its protected size those of its locked ones."""
    view = radix_view(t.after)
    if view is None:
        return None
    nodes = [n for n in view.nodes.values() if n.nid != view.root]
    evictable = sum(len(n.key) for n in nodes if n.lock_ref == 0)
    protected = sum(len(n.key) for n in nodes if n.lock_ref > 0)
    problems = []
    if view.evictable_size != evictable:
        problems.append(f"evictable_size is {view.evictable_size}, the unlocked nodes hold {evictable} tokens")
    if view.protected_size != protected:
        problems.append(f"protected_size is {view.protected_size}, the locked nodes hold {protected} tokens")
    return problems


def radix_token_conservation(t: Transition) -> Problems:
    """free + evictable + protected + the pages running requests hold outside the tree == the pool, in tokens;
    no KV slot is in two nodes, and no page a request holds outside the tree is in another request's row."""
    view = radix_view(t.after)
    if view is None:
        return None
    ps, problems = view.page_size, []
    owner: dict[int, Hashable] = {}
    for node in view.nodes.values():
        if node.nid == view.root:
            continue
        for slot in node.value:
            if slot in owner:
                problems.append(f"KV slot {slot} is in nodes {owner[slot]!r} and {node.nid!r}")
            owner[slot] = node.nid
    tree_pages = {slot // ps for slot in owner}
    held: dict[int, str] = {}
    for rid, row in view.rows.items():
        for page in dict.fromkeys(slot // ps for slot in row):
            if page in tree_pages:
                continue
            if page in held:
                problems.append(f"page {page} is held outside the tree by requests {held[page]!r} and {rid!r}")
            held[page] = rid
    total = view.free_tokens + view.evictable_size + view.protected_size + len(held) * ps
    if total != view.pool_tokens:
        problems.append(
            f"free {view.free_tokens} + evictable {view.evictable_size} + protected {view.protected_size} + "
            f"held by requests {len(held) * ps} = {total} != pool {view.pool_tokens} tokens"
        )
    return problems


# -- transition invariants ----------------------------------------------------------------------


def radix_locked_kept(t: Transition) -> Problems:
    """No locked node is evicted: every evicted page was in an unlocked node before the step, and every other
    running request's locked path is in the tree after it, over the same KV slots."""
    before, after = radix_view(t.before), radix_view(t.after)
    if before is None or after is None:
        return None
    ps, problems = before.page_size, []
    evicted = {e.oid for e in t.events if e.kind == "evict"}
    for node in before.nodes.values():
        if node.nid == before.root or node.lock_ref <= 0:
            continue
        gone = sorted({s // ps for s in node.value} & evicted)
        if gone:
            problems.append(f"{t.op} evicted page(s) {gone} of node {node.nid!r}, which had lock_ref {node.lock_ref}")
    for rid, was in before.locks.items():
        if rid == t.op.req or rid not in after.locks:
            continue
        now = after.locks[rid]
        path_was = before.path(was) if was is not None else ()
        path_now = after.path(now) if now is not None else ()
        slots_was, slots_now = _slots_of(before, was), _slots_of(after, now)
        if path_now != path_was or slots_now != slots_was:
            problems.append(
                f"the locked path of request {rid!r} changed during {t.op}: {len(path_was or ())} tokens "
                f"over {list(slots_was or ())} became {len(path_now or ())} over {list(slots_now or ())}"
            )
    return problems


# -- policy ------------------------------------------------------------------------------------------


def radix_policy_conformance(t: Transition) -> Problems:
    """Evicted nodes come first in the declared radix order: no unlocked leaf that the step left untouched and
    kept ranks strictly before a node the step evicted."""
    before, after = radix_view(t.before), radix_view(t.after)
    rank = RANK_KEYS.get(t.semantics.eviction)
    evicted = {e.oid for e in t.events if e.kind == "evict"}
    if before is None or after is None or rank is None or not evicted:
        return None
    ps = before.page_size
    gone = [n for n in before.nodes.values() if n.nid != before.root and {s // ps for s in n.value} & evicted]
    after_by_path = {after.path(nid): n for nid, n in after.nodes.items()}
    kept: list[tuple[tuple[float, ...], Hashable]] = []
    for node in before.nodes.values():
        if node.nid == before.root or node.lock_ref or node.children or node in gone:
            continue
        now = after_by_path.get(before.path(node.nid))
        if now is None or now.lock_ref or now.children or now.value != node.value or rank(now) != rank(node):
            continue  # evicted, locked, grown or used by this step: not a witness
        key = rank(node)
        if key is None:
            return None
        kept.append((key, node.nid))
    problems = []
    for node in gone:
        key = rank(node)
        if key is None:
            return None
        earlier = [nid for k, nid in kept if k < key]
        if earlier:
            problems.append(
                f"{t.op} evicted node {node.nid!r} (rank key {key}) while {t.semantics.eviction} ranks "
                f"unlocked leaf {earlier[0]!r} (rank key {min(k for k, _ in kept)}) first, and kept it"
            )
    return problems


_BLOCK = frozenset({"block"})  # a radix tree is shown by block (page) adapters only
_RADIX = frozenset(RADIX_ORDERS)  # declaring a radix order is an adapter's statement that it shows a tree

RADIX_SAFETY: tuple[Invariant, ...] = (
    Invariant("radix_tree_links", "safety", radix_tree_links, _BLOCK, evictions=_RADIX),
    Invariant("radix_value_matches_key", "safety", radix_value_matches_key, _BLOCK, evictions=_RADIX),
    Invariant("radix_locked_kept", "safety", radix_locked_kept, _BLOCK, evictions=_RADIX),
    Invariant("radix_lock_refs", "safety", radix_lock_refs, _BLOCK, evictions=_RADIX),
    Invariant("radix_size_accounting", "safety", radix_size_accounting, _BLOCK, evictions=_RADIX),
    Invariant("radix_token_conservation", "safety", radix_token_conservation, _BLOCK, evictions=_RADIX),
)
RADIX_POLICY: tuple[Invariant, ...] = (
    Invariant("radix_policy_conformance", "policy", radix_policy_conformance, _BLOCK, evictions=_RADIX),
)
