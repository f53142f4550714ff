"""free_list_exact on hand-built steps: each way a free list can disagree with its blocks is named.

The vLLM adapters show vLLM's FreeKVCacheBlockQueue as a FreeListView; tests/vllm_bugs.py seeds the
mutants of benchmarks/mutation.py this check was written for into vLLM itself (popleft-keeps-links,
popleft-n-keeps-link) and tests/test_vllm_adapters.py asserts kvspec reports them by this name.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kvspec.spec import Config, ObjectView, Observation, Op, Outcome, RequestView, Semantics
from kvspec.spec.free_list_view import FREE_LIST, FreeListView
from kvspec.spec.invariants import KeyMemory, Transition, check_transition

# Blocks 1..5 of a pool of 5 (block 0 is the null placeholder): request a holds 1 and 2, the rest are free.
GOOD = FreeListView(
    order=(3, 4, 5),
    complete=True,
    backward=(3, 4, 5),
    linked=frozenset({3, 4, 5}),
    counter=3,
    unreferenced=frozenset({3, 4, 5}),
)


def observation(view: FreeListView | None) -> Observation:
    objects = {b: ObjectView(b, 1, 4, 1) for b in (1, 2)}
    requests = {"a": RequestView("a", tuple(range(8)), 8, (1, 2))}
    return Observation(5, 3, objects, requests, {}, {} if view is None else {FREE_LIST: view})


def broken(view: FreeListView | None) -> dict[str, list[str]]:
    """The invariants a no-op step into an observation showing ``view`` breaks."""
    before = observation(GOOD)
    op, outcome = Op("append", "z", (1,)), Outcome.invalid("unknown request")
    t = Transition(before, op, outcome, (), observation(view), Config(5, 4), Semantics(), KeyMemory())
    return {name: problems for name, problems in check_transition(t).items() if problems}


def test_a_consistent_free_list_holds_and_no_view_is_not_judged() -> None:
    assert "free_list_exact" not in broken(GOOD)
    before = observation(None)
    op, outcome = Op("append", "z", (1,)), Outcome.invalid("unknown request")
    t = Transition(before, op, outcome, (), before, Config(5, 4), Semantics(), KeyMemory())
    assert check_transition(t)["free_list_exact"] is None


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"linked": frozenset({0, 3, 4, 5})}, "outside the free list keep their list links"),
        ({"linked": frozenset({3, 4})}, "in the free list have no list links"),
        ({"order": (3, 4, 5, 3), "backward": (3, 4, 5, 3), "counter": 4}, "listed more than once"),
        ({"backward": (3, 5, 4)}, "walked from the tail"),
        ({"counter": 2}, "counter says 2"),
        ({"order": (3, 4), "backward": (3, 4), "counter": 2, "linked": frozenset({3, 4})}, "are not in the free list"),
        ({"unreferenced": frozenset({3, 4})}, "referenced block(s) 5 are in the free list"),
        ({"complete": False}, "does not reach the end"),
    ],
)
def test_each_disagreement_is_reported(change: dict[str, Any], says: str) -> None:
    problems = broken(replace(GOOD, **change))
    assert "free_list_exact" in problems, problems
    assert any(says in p for p in problems["free_list_exact"]), problems["free_list_exact"]
