"""Drive one adapter through spec operations and check every invariant after every step.

The harness is shared by the Hypothesis state machine, the replayer and the
benchmarks: one step = predict with the spec (when the adapter claims exact
semantics), apply to the adapter, observe, and check the transition.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from kvspec.adapters.base import Adapter
from kvspec.adapters.isolation import CallTimeout, ChildDied, IsolatedAdapter, RemoteError
from kvspec.spec import (
    INVARIANT_NAMES,
    Config,
    Event,
    KeyMemory,
    LedgerModel,
    ObjectView,
    Observation,
    Op,
    Outcome,
    RequestView,
    SpecError,
    Transition,
    check_transition,
    validate,
)
from kvspec.spec.invariants import ADAPTER_CONTRACT

START = "starting the example (reset, events, observe)"
"""What a violation names as its op when the adapter broke before the first op."""


class Violation(AssertionError):
    """An invariant broke at ``step`` (0-based) on ``op`` (None: at the start). ``failures``: invariant -> problems.

    ``config`` and ``ops``: the example that broke it, up to and including ``op``. Raised as the subclass
    of its first invariant (:func:`violation_of`), so that Hypothesis tells failures of different
    invariants apart and shrinks each as its own: a shrink never turns one invariant's failure into
    another's.
    """

    def __init__(
        self,
        step: int,
        op: Op | None,
        failures: dict[str, list[str]],
        config: Config | None = None,
        ops: Sequence[Op] = (),
    ) -> None:
        self.step, self.op, self.failures = step, op, failures
        self.config, self.ops = config, list(ops)
        self.invariant = first_invariant(failures)
        lines = [f"step {step}: {op if op is not None else START}"]
        for name, problems in failures.items():
            lines += [f"  {name}: {p}" for p in problems[:3]]
        super().__init__("\n".join(lines))


def first_invariant(failures: Mapping[str, object]) -> str:
    """The invariant a report names for ``failures``: the first of the registry's order."""
    return next(n for n in INVARIANT_NAMES if n in failures)


@functools.cache
def violation_of(invariant: str) -> type[Violation]:
    """The Violation subclass of one invariant (one Hypothesis failure origin per invariant)."""
    return type(f"Violation[{invariant}]", (Violation,), {"__module__": __name__})


class AdapterHung(BaseException):
    """The adapter did not answer within the step timeout. BaseException: no retry, no shrinking."""

    def __init__(self, step: int, op: Op | None, timeout: float | None) -> None:
        self.step, self.op, self.timeout = step, op, timeout
        limit = "its timeout" if timeout is None else f"{timeout:g} s"
        super().__init__(f"step {step}: {op if op is not None else START} did not return within {limit}")


@dataclass
class Tally:
    """What the whole run checked: per-invariant step counts, first violation, totals."""

    checked: Counter[str] = field(default_factory=Counter)
    first_violation: dict[str, dict[str, Any]] = field(default_factory=dict)
    examples: int = 0
    steps: int = 0
    coverage: Counter[str] = field(default_factory=Counter)
    first_failure_at: tuple[int, int] | None = None  # (examples, steps) run when the first failure was seen
    started: float = field(default_factory=time.perf_counter)
    first_failure_s: float | None = None  # seconds from the start of the run to the first failure
    first_invariant: str | None = None  # what the first failure broke: the one reported, shrunk
    last_failure: tuple[Config, list[Op], Violation] | None = None
    hung: tuple[Config, list[Op]] | None = None
    # Invariants checked but not judged (a gate's known violations): counted, never raised.
    ignored: frozenset[str] = frozenset()
    # time.monotonic() after which no new round of examples starts (a time budget); None: no budget.
    deadline: float | None = None
    # The distinct abstract states reached (abstract_state), counted only when a set is given (a benchmark).
    states: set[Hashable] | None = None


class Harness:
    """One example: a fresh pool of ``config`` and the ops applied to it so far."""

    def __init__(self, adapter: Adapter, config: Config, tally: Tally | None = None, *, refine: bool = True) -> None:
        self.adapter, self.config = adapter, config
        self.tally = tally if tally is not None else Tally()
        self.semantics = adapter.capabilities.semantics
        self.ops: list[Op] = []
        self.memory = KeyMemory()
        self.tally.examples += 1
        self.model = LedgerModel(config, self.semantics) if self.semantics.exact and refine else None
        self.kit_validates = not adapter.capabilities.checks_input
        self.obs = self._start()

    def _start(self) -> Observation:
        """Reset the adapter, drop what it held from before, take its first observation.

        Whatever goes wrong here breaks the adapter contract at step 0, before any op.
        """
        try:
            self.adapter.reset(self.config)
            events = self.adapter.events()  # drop anything left from before the reset
            obs = self.adapter.observe()
        except CallTimeout:
            self.tally.hung = (self.config, [])
            raise AdapterHung(0, None, self._timeout) from None
        except Exception as exc:
            self._fail(0, None, {ADAPTER_CONTRACT: [f"{START} {_raised(exc)}"]})
        problems = malformed(Outcome.ok(), events, obs)
        if problems:
            self._fail(0, None, {ADAPTER_CONTRACT: [f"{START}: {p}" for p in problems]})
        return obs

    @property
    def _timeout(self) -> float | None:
        return self.adapter.timeout if isinstance(self.adapter, IsolatedAdapter) else None

    def _run(self, op: Op) -> tuple[object, object, object]:
        """The adapter's answers to ``op``: its outcome, its events, its observation (unchecked: user code).

        For an adapter that leaves input checking to the kit (``checks_input=False``), bad input is
        answered here from ``spec.validate``, and the adapter is not called.
        """
        if self.kit_validates:
            try:
                validate(op, self.obs, self.config, self.semantics)
            except SpecError as exc:
                return Outcome.invalid(str(exc)), [], self.obs
        if isinstance(self.adapter, IsolatedAdapter):
            return self.adapter.step(op)
        return self.adapter.apply(op), self.adapter.events(), self.adapter.observe()

    def step(self, op: Op) -> Outcome:
        """Apply ``op`` and check it; raise Violation when any invariant breaks."""
        index = len(self.ops)
        self.ops.append(op)
        predicted = self.model.step(op) if self.model is not None else None
        try:
            raw, events, after = self._run(op)
        except CallTimeout:
            self.tally.hung = (self.config, list(self.ops))
            raise AdapterHung(index, op, self._timeout) from None
        except Exception as exc:
            self._fail(index, op, {ADAPTER_CONTRACT: [f"{op} {_raised(exc)}"]})
        wrong = malformed(raw, events, after)
        if wrong:
            self._fail(index, op, {ADAPTER_CONTRACT: [f"after {op}: {p}" for p in wrong]})
        assert isinstance(raw, Outcome) and isinstance(events, list) and isinstance(after, Observation)
        outcome = raw
        transition = Transition(
            self.obs, op, outcome, tuple(events), after, self.config, self.semantics, self.memory, predicted
        )
        try:
            results = check_transition(transition)
        except Exception as exc:  # well-typed, yet the values cannot be judged (an unhashable oid, say)
            self._fail(index, op, {ADAPTER_CONTRACT: [f"what the adapter showed after {op} cannot be judged: {exc!r}"]})
        self.tally.steps += 1
        self._cover(op, outcome, events, self.obs)
        self.tally.checked[ADAPTER_CONTRACT] += 1
        failures: dict[str, list[str]] = {}
        for name, problems in results.items():
            if problems is None:
                continue
            self.tally.checked[name] += 1
            if problems and name not in self.tally.ignored:
                failures[name] = problems
        if failures:
            self._fail(index, op, failures)
        if self.tally.states is not None:
            self.tally.states.add(abstract_state(self.config, after))
        self.obs = after
        return outcome

    def _cover(self, op: Op, outcome: Outcome, events: list[Event], before: Observation) -> None:
        """Count the situations reached, so a report can say what was exercised (bad input by its class)."""
        cov = self.tally.coverage
        cov[f"{op.op}:{outcome.status}"] += 1
        if op.contract:
            cov[f"contract:{op.op}:{op.contract}:{outcome.status}"] += 1
        try:
            validate(op, before, self.config, self.semantics)
        except SpecError as exc:
            cov[f"bad_input:{exc.kind}"] += 1
        for event in events:
            cov[event.kind] += 1
        if outcome.hit_tokens:
            cov["prefix_hit"] += 1

    def _fail(self, index: int, op: Op | None, failures: dict[str, list[str]]) -> NoReturn:
        violation = violation_of(first_invariant(failures))(index, op, failures, self.config, self.ops)
        if self.tally.first_failure_at is None:
            self.tally.first_failure_at = (self.tally.examples, self.tally.steps)
            self.tally.first_failure_s = time.perf_counter() - self.tally.started
            self.tally.first_invariant = violation.invariant
        where = op.to_json() if op is not None else None
        for name, problems in failures.items():
            self.tally.first_violation.setdefault(name, {"step": index, "op": where, "problems": problems[:5]})
        self.tally.last_failure = (self.config, list(self.ops), violation)
        raise violation


def abstract_state(config: Config, obs: Observation) -> Hashable:
    """The shape of a pool, not its names: the pool, free capacity, objects counted by (cached, ref_count up to 2),
    requests counted by state. Two explorers are compared by how many of these they reach (benchmarks/swarm.py)."""
    shape: Counter[tuple[bool, int]] = Counter((o.key is not None, min(o.ref_count, 2)) for o in obs.objects.values())
    states = Counter(r.state for r in obs.requests.values())
    return (
        config.capacity,
        config.block_size,
        obs.free,
        tuple(sorted(shape.items())),
        states["running"],
        states["preempted"],
    )


def _raised(exc: Exception) -> str:
    """``raised KeyError: 'r3'``, naming the adapter's own exception type when it ran in a child."""
    kind = exc.type_name if isinstance(exc, RemoteError) else type(exc).__name__
    if isinstance(exc, ChildDied):
        return f"ended the adapter: {exc}"
    return f"raised {kind}: {exc}"


def malformed(outcome: object, events: object, obs: object) -> list[str]:
    """How the adapter's answers break the contract's types (an Outcome, a list of Events, an Observation)."""
    problems = []
    if not isinstance(outcome, Outcome):
        problems.append(f"returned {outcome!r}, not an Outcome")
    if not isinstance(events, list) or not all(isinstance(e, Event) for e in events):
        problems.append(f"events() returned {_short(events)}, not a list of Events")
    if not isinstance(obs, Observation):
        return [*problems, f"observe() returned {_short(obs)}, not an Observation"]
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in (obs.capacity, obs.free)):
        problems.append(f"capacity {obs.capacity!r} and free {obs.free!r} must be ints")
    if not isinstance(obs.objects, Mapping) or not all(isinstance(o, ObjectView) for o in obs.objects.values()):
        problems.append("objects must map oids to ObjectViews")
    elif not all(
        isinstance(n, int) and not isinstance(n, bool)
        for o in obs.objects.values()
        for n in (o.size, o.tokens, o.ref_count)
    ):
        problems.append("an ObjectView's size, tokens and ref_count must be ints")
    if not isinstance(obs.requests, Mapping) or not all(isinstance(r, RequestView) for r in obs.requests.values()):
        problems.append("requests must map request ids to RequestViews")
    index: object = obs.index  # user code: the annotation promises nothing
    if index is not None and not isinstance(index, Mapping):
        problems.append("index must be a mapping or None")
    return problems


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
