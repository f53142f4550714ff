"""The explicit-state search on an implementation, and its results as the kit's report.

``drive`` takes the spec's reachable states that ``spec.formal.explore.explore`` found and
drives an adapter through every one of them: the path that first reached each leaf
of the search tree is replayed from a fresh pool through the suite's ``Harness``
(every invariant, the refinement checks against the spec's own step included), so
every reachable state is visited once its ancestors are. In each state visited for
the first time, the adapter is also given every op of the alphabet that the spec
answers without a change (bad input, a refused admission or append): those leave
the state as it was, so the path goes on from there. What is not driven: a step
that changes the state to one reached first by another path (it is in the spec's
search, not on the adapter).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvspec.adapter import Adapter
from kvspec.report import Report, Row, Status, rows
from kvspec.spec.formal.explore import Alphabet, ExploreResult, State, clone, describe, spec_model
from kvspec.spec.invariants import ADAPTER_CONTRACT, INVARIANTS
from kvspec.spec.ops import Op

from .harness import AdapterHung, Harness, Tally, Violation


@dataclass
class Drive:
    """What driving an adapter through the reachable states covered, and the first violation, if any."""

    states: int = 0
    paths: int = 0
    tally: Tally = field(default_factory=Tally)
    violation: Violation | None = None
    hung: AdapterHung | None = None
    seconds: float = 0.0
    timed_out: bool = False

    @property
    def failed_ops(self) -> list[Op]:
        if self.violation is not None:
            return list(self.violation.ops)
        return list(self.tally.hung[1]) if self.tally.hung else []


def _ancestry(result: ExploreResult, leaf: State) -> list[tuple[State, Op | None]]:
    """The states from the empty pool to ``leaf``, each with the op that leaves it on the path (None at the leaf)."""
    chain: list[tuple[State, Op | None]] = [(leaf, None)]
    node = leaf
    while True:
        parent, op = result.tree[node]
        if parent is None:
            return chain[::-1]
        chain.append((parent, op))
        node = parent


def drive(
    adapter: Adapter,
    result: ExploreResult,
    *,
    time_limit: float | None = None,
    refine: bool = True,
    progress: Callable[[Drive], None] | None = None,
) -> Drive:
    """Drive ``adapter`` through every state of ``result``'s search tree; stop at the first violation.

    ``refine=False``: the safety invariants only, not the refinement checks against the spec's step.
    The search should be of the spec under the adapter's semantics (``explore(semantics=...)``).
    """
    bounds = result.bounds
    alphabet = Alphabet.of(bounds)
    out = Drive()
    visited: set[State] = set()
    t0 = time.monotonic()
    deadline = None if time_limit is None else t0 + time_limit
    try:
        for leaf in result.leaves():
            if deadline is not None and time.monotonic() > deadline:
                out.timed_out = True
                break
            harness = Harness(adapter, bounds.config, out.tally, refine=refine)
            spec = spec_model(bounds, result.semantics)
            out.paths += 1
            for state, op in _ancestry(result, leaf):
                if state not in visited:
                    visited.add(state)
                    out.states += 1
                    for still in _stutters(spec, alphabet):
                        harness.step(still)
                if op is not None:
                    harness.step(op)
                    spec.step(op)
            if progress is not None:
                progress(out)
    except Violation as violation:
        out.violation = violation
    except AdapterHung as hung:
        out.hung = hung
    out.seconds = time.monotonic() - t0
    return out


def _stutters(spec: Any, alphabet: Alphabet) -> list[Op]:
    """The ops of the alphabet the spec answers without changing the state it reads (bad input, refusals)."""
    unchanged = describe(spec, alphabet.bounds)
    work = clone(spec)
    out = []
    for op in alphabet.ops(spec):
        if work.step(op).outcome.status != "ok" and describe(work, alphabet.bounds) == unchanged:
            out.append(op)
        else:
            work = clone(spec)
    return out


def explore_report(
    result: ExploreResult,
    *,
    started_at: str,
    adapter: str | None = None,
    driven: Drive | None = None,
    variant: str | None = None,
    cases: list[str] | None = None,
) -> Report:
    """One row per invariant: judged on every transition the search checked (and the adapter's steps)."""
    kinds = [(inv.name, inv.kind) for inv in INVARIANTS] + [(ADAPTER_CONTRACT, "adapter")]
    checked = dict(result.checked)
    first: dict[str, dict[str, Any]] = {}
    cex = result.counterexample
    if cex is not None:
        for name, problems in cex.problems.items():
            first[name] = {"step": len(cex.ops) - 1, "ops": [o.to_json() for o in cex.ops], "problems": problems[:5]}
    if driven is not None:
        for name, n in driven.tally.checked.items():
            checked[name] = checked.get(name, 0) + n
        for name, where in driven.tally.first_violation.items():
            first.setdefault(name, {**where, "ops": [o.to_json() for o in driven.failed_ops]})
    applicable = {name for name, n in checked.items() if n}
    table: list[Row] = rows(kinds, checked, first, applicable=applicable)
    violated = cex is not None or (driven is not None and (driven.violation is not None or driven.hung is not None))
    stopped = result.timed_out or (driven is not None and driven.timed_out)
    status: Status = "violated" if violated else ("error" if stopped else "passed")
    error = ""
    if status == "error":
        error = f"time limit reached: every state within depth {result.depth} of {result.requested} explored"
        if driven is not None and driven.timed_out:
            error = f"time limit reached: the adapter was driven through {driven.states} of {result.distinct} states"
    if result.interrupted and not violated:
        status, error = "interrupted", f"interrupted: every state within depth {result.depth} explored"
    steps = result.states + (driven.tally.steps if driven is not None else 0)
    section: dict[str, Any] = {
        "engine": "explore",
        "bounds": result.bounds.to_json(),
        "variant": variant,
        "depth_requested": result.requested,
        "depth_reached": result.depth,
        "diameter": result.diameter,
        "complete": result.complete,
        "states": result.states,
        "distinct_states": result.distinct,
        "states_per_s": round(result.states_per_s, 1),
        "new_states_per_depth": result.layers,
        "symmetry_reduction": result.reduced,
        "explore_seconds": round(result.seconds, 3),
    }
    if driven is not None:
        section["adapter"] = {
            "states_driven": driven.states,
            "paths": driven.paths,
            "steps": driven.tally.steps,
            "seconds": round(driven.seconds, 3),
        }
    return Report(
        adapter=adapter or "spec",
        rows=table,
        profile="explore",
        started_at=started_at,
        duration_s=result.seconds + (driven.seconds if driven is not None else 0.0),
        examples=1 + (driven.paths if driven is not None else 0),
        steps=steps,
        status=status,
        error=error,
        coverage=driven.tally.coverage if driven is not None else {},
        cases=cases or [],
        sections={"formal": section},
    )


__all__ = ["Drive", "drive", "explore_report"]
