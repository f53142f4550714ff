"""A case replayed for a picture: what the spec and an adapter showed after every op.

The spec side runs the case on the spec's own ledger (``LedgerModel``) under the
semantics the adapter declares; the adapter side runs it through the suite's
``Harness`` (every invariant judged on every step, the adapter in its child process
under the step timeout), recording what the adapter answered before it is judged, so
the violating step is drawn as the adapter showed it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvspec.adapter import AdapterFactory
from kvspec.adapters.isolation import IsolatedAdapter
from kvspec.case import Case
from kvspec.spec import Config, Event, Observation, Op, Outcome, Semantics
from kvspec.spec.ledger import LedgerModel
from kvspec.stateful_tests import AdapterHung, Harness, Violation


@dataclass(frozen=True)
class Frame:
    """One op and what the implementation showed after it: its outcome, its events, its ledger.

    A trace's line that is no op (a block event of a log) has ``op`` None; ``notes`` say per object what a
    trace records beside the ledger (a recorded state, a block's tokens), drawn where a cell has no tokens.
    """

    op: Op | None
    outcome: Outcome
    events: tuple[Event, ...]
    obs: Observation
    notes: Mapping[Hashable, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Broken:
    """Where a replay broke: the step (0-based op index), the invariant the report names, every invariant's problems."""

    step: int
    invariant: str
    failures: dict[str, list[str]]
    at: str = ""  # where, as the source says it ("line 8" of a trace); "step N" when empty

    @property
    def message(self) -> str:
        """The invariant and its first problem, as one line."""
        problems = self.failures.get(self.invariant) or ["(no detail)"]
        return f"{self.invariant}: {problems[0]}"


@dataclass
class Run:
    """A case replayed on one implementation: a frame per op that answered, and where it broke (None: it held).

    ``frames`` may be shorter than the ops when the implementation raised or hung: the
    op at ``len(frames)`` is the one that did not answer. A trace's run has a column label
    per line instead of ops, and ``known_capacity`` False where the log does not give its pool.
    """

    label: str
    config: Config
    semantics: Semantics
    ops: list[Op] | list[str]
    frames: list[Frame] = field(default_factory=list)
    broken: Broken | None = None
    known_capacity: bool = True


class _Recording(IsolatedAdapter):
    """An isolated adapter that keeps every well-formed answer of ``step`` as a frame, before the harness judges it."""

    frames: list[Frame]

    def step(self, op: Op, observe: str = "full") -> tuple[Any, Any, Any]:
        outcome, events, obs = super().step(op, observe)
        if isinstance(outcome, Outcome) and isinstance(events, list) and isinstance(obs, Observation):
            self.frames.append(Frame(op, outcome, tuple(e for e in events if isinstance(e, Event)), obs))
        return outcome, events, obs


def semantics_of(factory: AdapterFactory, step_timeout: float | None = 30.0) -> tuple[str, Semantics]:
    """The adapter's name with its version and the semantics it declares (built in its child, then closed)."""
    adapter = IsolatedAdapter(factory, step_timeout)
    try:
        caps = adapter.capabilities
        return f"{adapter.name} {caps.version}".strip(), caps.semantics
    finally:
        adapter.close()


def on_spec(case: Case, semantics: Semantics) -> Run:
    """The case on the spec's ledger: what the spec predicts an implementation of ``semantics`` shows."""
    model = LedgerModel(case.config, semantics)
    run = Run(f"spec ({semantics.granularity}, {semantics.eviction})", case.config, semantics, list(case.ops))
    for op in case.ops:
        step = model.step(op)
        if semantics.granularity == "block":
            left = [Event("evict", s) for s in step.evicted_slots] + [Event("reclaim", s) for s in step.reclaimed_slots]
        else:
            left = [Event("evict", k, k) for k in step.evicted] + [Event("reclaim", k, k) for k in step.reclaimed]
        run.frames.append(Frame(op, step.outcome, tuple(left), model.observe()))
    return run


def on_adapter(case: Case, factory: AdapterFactory, *, refine: bool = True, step_timeout: float | None = 30.0) -> Run:
    """The case on a fresh adapter through the harness: every invariant judged, the first break kept."""
    adapter = _Recording(factory, step_timeout)
    adapter.frames = []
    caps = adapter.capabilities
    run = Run(f"{adapter.name} {caps.version}".strip(), case.config, caps.semantics, list(case.ops), adapter.frames)
    try:
        harness = Harness(adapter, case.config, refine=refine)
        for op in case.ops:
            harness.step(op)
    except Violation as violation:
        run.broken = Broken(violation.step, violation.invariant, dict(violation.failures))
    except AdapterHung as hung:
        run.broken = Broken(hung.step, "adapter_contract", {"adapter_contract": [str(hung)]})
    finally:
        adapter.close()
    return run


def replay(
    case: Case,
    factory: AdapterFactory | None,
    *,
    default: Semantics | None = None,
    refine: bool = True,
    step_timeout: float | None = 30.0,
) -> list[Run]:
    """The runs to draw: the spec alone, or the spec (under the adapter's semantics) above the adapter."""
    if factory is None:
        return [on_spec(case, default or Semantics())]
    adapter_run = on_adapter(case, factory, refine=refine, step_timeout=step_timeout)
    return [on_spec(case, adapter_run.semantics), adapter_run]


__all__ = ["Broken", "Frame", "Run", "on_adapter", "on_spec", "replay", "semantics_of"]
