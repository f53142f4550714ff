"""The free-list invariant: the allocator's free list is exactly its unreferenced blocks (spec.free_list_view).

It reads the FreeListView an adapter shows and does not apply (None) to one that shows none.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable

from ..free_list_view import free_list_view
from .transition import Invariant, Problems, Transition


def _ids(blocks: Iterable[Hashable]) -> str:
    return ", ".join(sorted(map(repr, blocks)))


def free_list_exact(t: Transition) -> Problems:
    """The free list holds every unreferenced block once and nothing else; a block outside it keeps no list links.

    The list walked from its head ends within the pool's size, equals the walk from its tail reversed,
    agrees with the list's own counter, and every block's own links say the same membership.
    """
    view = free_list_view(t.after)
    if view is None:
        return None
    problems = []
    if not view.complete:
        problems.append(f"the walk from the head does not reach the end within {len(view.order)} blocks")
    twice = [b for b, n in Counter(view.order).items() if n > 1]
    if twice:
        problems.append(f"block(s) {_ids(twice)} listed more than once")
    if view.backward is not None and view.complete and view.backward != view.order:
        problems.append(f"walked from the tail the list is {list(view.backward)}, from the head {list(view.order)}")
    if view.counter is not None and view.complete and view.counter != len(view.order):
        problems.append(f"the list's counter says {view.counter} blocks, its links hold {len(view.order)}")
    listed = set(view.order)
    if view.unreferenced - listed:
        problems.append(f"unreferenced block(s) {_ids(view.unreferenced - listed)} are not in the free list")
    if listed - view.unreferenced:
        problems.append(f"referenced block(s) {_ids(listed - view.unreferenced)} are in the free list")
    if view.linked is not None:
        if view.linked - listed:
            problems.append(f"block(s) {_ids(view.linked - listed)} outside the free list keep their list links")
        if listed - view.linked:
            problems.append(f"block(s) {_ids(listed - view.linked)} in the free list have no list links")
    return problems


FREE_LIST_SAFETY: tuple[Invariant, ...] = (
    Invariant("free_list_exact", "safety", free_list_exact, frozenset({"block"})),
)
