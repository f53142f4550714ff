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
    LiveObservation,
    ObjectView,
    Observation,
    ObservationDelta,
    Op,
    Outcome,
    RequestView,
    SpecError,
    Transition,
    check_transition,
    validate,
)
from kvspec.spec.delta import differences
from kvspec.spec.invariants import ADAPTER_CONTRACT, check_state

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
    # Check the whole state every this many steps of an example, and the part a step changed on the steps
    # between, for adapters that report deltas (Capabilities.deltas, spec/delta.py); 1: the whole state every step.
    full_check_every: int = 1
    full_checks: int = 0  # steps and example ends judged on the whole state while taking deltas


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
        self.every = max(1, self.tally.full_check_every)
        self.broken = False  # a violation or a hang was raised: nothing more is checked
        self.obs = self._start()
        # The whole state kept from the adapter's deltas; None: a full observation every step (today's path).
        self.live: LiveObservation | None = None
        if self.every > 1 and adapter.capabilities.deltas and self.semantics.granularity == "block":
            self.live = LiveObservation(self.obs)
            self.obs = self.live.now()
        self.since_full = 0  # delta steps since the whole state was last judged

    def _start(self) -> Observation:
        """Reset the adapter, drop what it held from before, take its first observation.

        Whatever goes wrong here breaks the adapter contract at step 0, before any op.
        """
        try:
            self.adapter.reset(self.config)
            events = self.adapter.events()  # drop anything left from before the reset
            obs = self.adapter.observe()
        except CallTimeout:
            self.broken = True
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

    def _run(self, op: Op, observe: str = "full") -> tuple[object, object, object]:
        """The adapter's answers to ``op``: its outcome, its events, what it left (unchecked: user code).

        ``observe`` (IsolatedAdapter.step): ``full`` its observation; ``delta`` its delta, or its
        observation when it gives none; ``both`` (its delta or None, its observation).
        For an adapter that leaves input checking to the kit (``checks_input=False``), bad input is
        answered here from ``spec.validate``, and the adapter is not called.
        """
        if self.kit_validates:
            try:
                validate(op, self.obs, self.config, self.semantics)
            except SpecError as exc:
                if observe == "delta":
                    return Outcome.invalid(str(exc)), [], ObservationDelta(self.obs.free)
                return Outcome.invalid(str(exc)), [], self.obs if observe == "full" else (None, self.obs)
        if isinstance(self.adapter, IsolatedAdapter):
            return self.adapter.step(op, observe)
        outcome, events = self.adapter.apply(op), self.adapter.events()
        if observe == "full":
            return outcome, events, self.adapter.observe()
        delta = self.adapter.observe_delta()  # type: ignore[attr-defined]
        if observe == "delta":
            return outcome, events, self.adapter.observe() if delta is None else delta
        return outcome, events, (delta, self.adapter.observe())

    def step(self, op: Op) -> Outcome:
        """Apply ``op`` and check it; raise Violation when any invariant breaks.

        Taking deltas (``self.live``), a step whose number is not a multiple of K is checked on the part
        it changed (the incremental invariants); every K-th step takes the adapter's delta and its full
        observation, reports where the state kept from the deltas differs from it, and judges every
        invariant on the whole state. Otherwise every step is judged on the whole state.
        """
        index = len(self.ops)
        self.ops.append(op)
        predicted = self.model.step(op) if self.model is not None else None
        observe = "full" if self.live is None else ("both" if (index + 1) % self.every == 0 else "delta")
        try:
            raw, events, answer = self._run(op, observe)
        except CallTimeout:
            self.broken = True
            self.tally.hung = (self.config, list(self.ops))
            raise AdapterHung(index, op, self._timeout) from None
        except Exception as exc:
            self._fail(index, op, {ADAPTER_CONTRACT: [f"{op} {_raised(exc)}"]})
        delta: object = None
        if observe == "both" and isinstance(answer, tuple) and len(answer) == 2:
            delta, answer = answer
        touched = None
        whole: Transition | None = None
        contract: list[str] = []
        if isinstance(delta, ObservationDelta) and isinstance(answer, Observation) and self.live is not None:
            # A K-th step: the local part judged as on every delta step, the kept whole state compared with the
            # adapter's observation, and, where they agree, the invariants the local part cannot judge on it.
            wrong = malformed(raw, events, answer) or malformed_delta(raw, events, delta)
            if wrong:
                self._fail(index, op, {ADAPTER_CONTRACT: [f"after {op}: {p}" for p in wrong]})
            assert isinstance(raw, Outcome) and isinstance(events, list)
            try:
                change = self.live.apply(delta)
                contract = [
                    f"after {op}: the state kept from the adapter's deltas differs from its observation: {p}"
                    for p in differences(self.live.now(), answer)
                ]
                before, after = change.before, answer
                if not contract:
                    whole = Transition(
                        change.before, op, raw, tuple(events), self.live.now(), self.config, self.semantics,
                        self.memory, predicted,
                    )  # fmt: skip
                    before, after = self.live.local(change, [e.oid for e in events], op.req)
                    touched = (change.objects, change.requests)
            except Exception as exc:
                self._fail(index, op, {ADAPTER_CONTRACT: [f"the delta after {op} cannot be applied: {exc!r}"]})
            if contract:  # judged on the adapter's observation, every invariant, as the full check of a step
                self.live = LiveObservation(answer)
            self.since_full = 0
            self.tally.full_checks += 1
        elif isinstance(answer, ObservationDelta) and self.live is not None:
            wrong = malformed_delta(raw, events, answer)
            if wrong:
                self._fail(index, op, {ADAPTER_CONTRACT: [f"after {op}: {p}" for p in wrong]})
            assert isinstance(raw, Outcome) and isinstance(events, list)
            try:
                change = self.live.apply(answer)
                before, after = self.live.local(change, [e.oid for e in events], op.req)
            except Exception as exc:  # well-typed at the top, yet it cannot be applied (an unhashable oid, say)
                self._fail(index, op, {ADAPTER_CONTRACT: [f"the delta after {op} cannot be applied: {exc!r}"]})
            touched = (change.objects, change.requests)
            self.since_full += 1
        else:
            wrong = malformed(raw, events, answer)
            if delta is not None and not isinstance(delta, ObservationDelta):
                wrong.append(f"observe_delta() returned {_short(delta)}, not an ObservationDelta or None")
            if wrong:
                self._fail(index, op, {ADAPTER_CONTRACT: [f"after {op}: {p}" for p in wrong]})
            assert isinstance(raw, Outcome) and isinstance(events, list) and isinstance(answer, Observation)
            before, after = self.obs, answer
            if self.live is not None:
                if isinstance(delta, ObservationDelta):
                    wrong = malformed_delta(raw, events, delta)
                    if wrong:
                        self._fail(index, op, {ADAPTER_CONTRACT: [f"after {op}: {p}" for p in wrong]})
                    try:
                        before = self.live.apply(delta).before
                    except Exception as exc:
                        self._fail(index, op, {ADAPTER_CONTRACT: [f"the delta after {op} cannot be applied: {exc!r}"]})
                    kept = self.live.now()
                    contract = [
                        f"after {op}: the state kept from the adapter's deltas differs from its observation: {p}"
                        for p in differences(kept, after)
                    ]
                self.live = LiveObservation(after)
                self.since_full = 0
                self.tally.full_checks += 1
        outcome = raw
        transition = Transition(
            before, op, outcome, tuple(events), after, self.config, self.semantics, self.memory, predicted, touched
        )
        try:
            results = check_transition(transition, whole)
        except Exception as exc:  # well-typed, yet the values cannot be judged (an unhashable oid, say)
            self._fail(index, op, {ADAPTER_CONTRACT: [f"what the adapter showed after {op} cannot be judged: {exc!r}"]})
        self.tally.steps += 1
        self._cover(op, outcome, events, before)
        self.tally.checked[ADAPTER_CONTRACT] += 1
        failures = self._judged(results)
        if contract:
            failures[ADAPTER_CONTRACT] = contract
        if failures:
            self._fail(index, op, failures)
        if self.live is not None:
            after = self.live.now()
        if self.tally.states is not None:
            self.tally.states.add(abstract_state(self.config, after))
        self.obs = after
        return outcome

    def _judged(self, results: Mapping[str, list[str] | None]) -> dict[str, list[str]]:
        """Count each judged invariant; the problems of those broken and not ignored."""
        failures: dict[str, list[str]] = {}
        for name, problems in results.items():
            if problems is None:
                continue
            self.tally.checked[name] += 1
            if problems and name not in self.tally.ignored:
                failures[name] = problems
        return failures

    def finish(self) -> None:
        """The end of an example: when steps came as deltas since the whole state was last judged, take the
        adapter's full observation, report where the state kept from the deltas differs from it, and judge
        the state invariants on it. Nothing to do when every step was judged whole, or after a violation."""
        if self.live is None or self.since_full == 0 or self.broken or not self.ops:
            return
        index, op = len(self.ops) - 1, self.ops[-1]
        try:
            full = self.adapter.observe()
        except CallTimeout:
            self.broken = True
            self.tally.hung = (self.config, list(self.ops))
            raise AdapterHung(index, op, self._timeout) from None
        except Exception as exc:
            self._fail(index, op, {ADAPTER_CONTRACT: [f"observe() at the end of the example {_raised(exc)}"]})
        wrong = malformed(Outcome.ok(), [], full)
        if wrong:
            self._fail(index, op, {ADAPTER_CONTRACT: [f"at the end of the example: {p}" for p in wrong]})
        assert isinstance(full, Observation)
        contract = [
            f"at the end of the example: the state kept from the adapter's deltas differs from its observation: {p}"
            for p in differences(self.live.now(), full)
        ]
        t = Transition(full, op, Outcome.ok(), (), full, self.config, self.semantics, self.memory)
        try:
            results = check_state(t)
        except Exception as exc:
            self._fail(index, op, {ADAPTER_CONTRACT: [f"the adapter's final observation cannot be judged: {exc!r}"]})
        self.tally.full_checks += 1
        failures = self._judged(results)
        if contract:
            failures[ADAPTER_CONTRACT] = contract
        self.live = LiveObservation(full)
        self.obs = self.live.now()
        self.since_full = 0
        if failures:
            self._fail(index, op, failures)

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
        self.broken = True
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


def _malformed_answers(outcome: object, events: object) -> list[str]:
    """How an op's outcome and events break the contract's types (an Outcome, a list of Events)."""
    problems = []
    if not isinstance(outcome, Outcome):
        problems.append(f"returned {outcome!r}, not an Outcome")
    if not isinstance(events, list) or not all(isinstance(e, Event) for e in events):
        problems.append(f"events() returned {_short(events)}, not a list of Events")
    return problems


def malformed(outcome: object, events: object, obs: object) -> list[str]:
    """How the adapter's answers break the contract's types (an Outcome, a list of Events, an Observation)."""
    problems = _malformed_answers(outcome, events)
    if not isinstance(obs, Observation):
        return [*problems, f"observe() returned {_short(obs)}, not an Observation"]
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in (obs.capacity, obs.free)):
        problems.append(f"capacity {obs.capacity!r} and free {obs.free!r} must be ints")
    if not isinstance(obs.objects, Mapping) or not all(isinstance(o, ObjectView) for o in obs.objects.values()):
        problems.append("objects must map oids to ObjectViews")
    elif not all(type(o.size) is type(o.tokens) is type(o.ref_count) is int for o in obs.objects.values()) and not all(
        isinstance(n, int) and not isinstance(n, bool)
        for o in obs.objects.values()
        for n in (o.size, o.tokens, o.ref_count)
    ):  # plain ints, the common case, at a third of the cost per object; else the exact test
        problems.append("an ObjectView's size, tokens and ref_count must be ints")
    if not isinstance(obs.requests, Mapping) or not all(isinstance(r, RequestView) for r in obs.requests.values()):
        problems.append("requests must map request ids to RequestViews")
    index: object = obs.index  # user code: the annotation promises nothing
    if index is not None and not isinstance(index, Mapping):
        problems.append("index must be a mapping or None")
    return problems


def malformed_delta(outcome: object, events: object, delta: ObservationDelta) -> list[str]:
    """How a delta step's answers break the contract's types: those of :func:`malformed`, on the delta's part
    (the objects and requests the step changed, never the whole pool)."""
    problems = _malformed_answers(outcome, events)
    if not isinstance(delta.free, int) or isinstance(delta.free, bool):
        problems.append(f"the delta's free {delta.free!r} must be an int")
    if not isinstance(delta.objects, Mapping) or not all(isinstance(o, ObjectView) for o in delta.objects.values()):
        problems.append("the delta's objects must map oids to ObjectViews")
    elif not all(
        isinstance(n, int) and not isinstance(n, bool)
        for o in delta.objects.values()
        for n in (o.size, o.tokens, o.ref_count)
    ):
        problems.append("an ObjectView's size, tokens and ref_count must be ints")
    if not isinstance(delta.requests, Mapping) or not all(isinstance(r, RequestView) for r in delta.requests.values()):
        problems.append("the delta's requests must map request ids to RequestViews")
    index: object = delta.index  # user code: the annotation promises nothing
    if not isinstance(index, Mapping):
        problems.append("the delta's index must be a mapping")
    return problems


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
