"""Drive one adapter through spec operations and check every invariant after every step.

The harness is shared by the Hypothesis state machine, the replayer and the
benchmarks: one step = predict with the spec (when the adapter claims exact
semantics), apply to the adapter, observe, and check the transition.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from kvspec.adapter import Adapter
from kvspec.adapter.answers import malformed, malformed_delta
from kvspec.adapter.answers import short as _short
from kvspec.adapters.isolation import CallTimeout, ChildDied, IsolatedAdapter, RemoteError
from kvspec.adapters.kept import Agreed
from kvspec.spec import INVARIANT_NAMES, Config, Observation, ObservationDelta, Op, Outcome, SpecError
from kvspec.spec.delta import KeptObservation, differences
from kvspec.spec.invariants import ADAPTER_CONTRACT, KeyMemory, Transition, check_state, check_transition
from kvspec.spec.ledger import LedgerModel, validate

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
        keeping = self.every > 1 and adapter.capabilities.deltas and self.semantics.granularity == "block"
        # An adapter in a child process keeps a copy of the state kept here and compares it with its full
        # observation there (adapters/kept.py): the observation crosses the pipe only where they differ.
        self.compared = keeping and isinstance(adapter, IsolatedAdapter)
        # An adapter in a child process, judged whole every step, with its input checked by itself: the next op
        # can be sent before this step is judged (step's ``then``), so the child runs it meanwhile.
        self.sends_ahead = isinstance(adapter, IsolatedAdapter) and not keeping and not self.kit_validates
        self.upcoming: Op | None = None  # the op ``then`` chose after the last step (step's ``then``)
        self.obs = self._start()
        # The whole state kept from the adapter's deltas; None: a full observation every step (today's path).
        self.live: KeptObservation | None = None
        if keeping:
            self.live = KeptObservation(self.obs)
            self.obs = self.live.now()
        self.since_full = 0  # delta steps since the whole state was last judged

    def _start(self) -> Observation:
        """Reset the adapter, drop what it held from before, take its first observation.

        Whatever goes wrong here breaks the adapter contract at step 0, before any op.
        """
        try:
            self.adapter.reset(self.config)
            events = self.adapter.events()  # drop anything left from before the reset
            obs = self.adapter.observe_keeping() if self.compared else self.adapter.observe()  # type: ignore[attr-defined]
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
        observation when it gives none; ``both`` (its delta or None, its observation); ``compared`` (as
        ``both``, with :class:`Agreed` for the observation where the child's kept state equals it).
        For an adapter that leaves input checking to the kit (``checks_input=False``), bad input is
        answered here from ``spec.validate``, and the adapter is not called.
        """
        if self.kit_validates:
            try:
                validate(op, self.obs, self.config, self.semantics)
            except SpecError as exc:
                if observe == "delta":
                    return Outcome.invalid(str(exc)), [], ObservationDelta(self.obs.free)
                if observe == "compared":
                    return Outcome.invalid(str(exc)), [], (None, self.obs, None)
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

    def step(self, op: Op, then: Callable[[Observation], Op] | None = None) -> Outcome:
        """Apply ``op`` and check it; raise Violation when any invariant breaks.

        ``then`` (the swarm's walker): the next op, chosen from the state this step left; it is kept in
        ``self.upcoming``. Where the harness can (``sends_ahead``), ``then`` is asked as soon as the adapter's
        answer is well formed, before the invariants judge it, and the op it chose is sent to the child at once
        (``IsolatedAdapter.send_ahead``), so the child runs it while this step is judged; the state ``then``
        reads is the very observation judged, so a walk is the same op for op either way. Attribution is kept:
        the op sent ahead is not in ``self.ops`` until its own step; its answer, hang or death is raised there;
        if this step breaks, its answer is dropped unread by the child's next call.

        Taking deltas (``self.live``), a step whose number is not a multiple of K is checked on the part
        it changed (the incremental invariants); every K-th step takes the adapter's delta and its full
        observation, reports where the state kept from the deltas differs from it, and judges every
        invariant on the whole state (an adapter in a child process compares there, adapters/kept.py: where
        they agree, the observation does not cross and the kept state, equal to it, is judged). Otherwise
        every step is judged on the whole state.
        """
        index = len(self.ops)
        self.ops.append(op)
        self.upcoming = None
        predicted = self.model.step(op) if self.model is not None else None
        observe = "full" if self.live is None else "delta"
        if self.live is not None and (index + 1) % self.every == 0:
            observe = "compared" if self.compared else "both"
        try:
            raw, events, answer = self._run(op, observe)
        except CallTimeout:
            self.broken = True
            self.tally.hung = (self.config, list(self.ops))
            raise AdapterHung(index, op, self._timeout) from None
        except Exception as exc:
            self._fail(index, op, {ADAPTER_CONTRACT: [f"{op} {_raised(exc)}"]})
        delta: object = None
        agreed: Agreed | None = None
        if observe == "both" and isinstance(answer, tuple) and len(answer) == 2:
            delta, answer = answer
        elif observe == "compared" and isinstance(answer, tuple) and len(answer) == 3:
            delta, answer, agreed = answer
        touched = None
        whole: Transition | None = None
        contract: list[str] = []
        if agreed is not None and self.live is not None:
            answer = self.live.now()  # the child found the kept state equal to the observation; replaced below
        if isinstance(delta, ObservationDelta) and isinstance(answer, Observation) and self.live is not None:
            # A K-th step: the local part judged as on every delta step, the kept whole state compared with the
            # adapter's observation (here, or in its child: Agreed), and, where they agree, the invariants the
            # local part cannot judge on it.
            wrong = ([] if agreed else malformed(raw, events, answer)) or malformed_delta(raw, events, delta)
            if wrong:
                self._fail(index, op, {ADAPTER_CONTRACT: [f"after {op}: {p}" for p in wrong]})
            assert isinstance(raw, Outcome) and isinstance(events, list)
            try:
                change = self.live.apply(delta)
                if agreed is not None:  # the child found the kept state equal to the observation: it is the observation
                    self.live.extra = agreed.extra
                    answer = self.live.now()
                contract = [] if agreed else [
                    f"after {op}: the state kept from the adapter's deltas differs from its observation: {p}"
                    for p in differences(self.live.now(), answer)
                ]  # fmt: skip
                before, after = change.before, answer
                if not contract:
                    self.live.extra = answer.extra  # the deltas may leave it out: the observation's
                    whole = Transition(
                        change.before, op, raw, tuple(events), self.live.now(), self.config, self.semantics,
                        self.memory, predicted,
                    )  # fmt: skip
                    before, after = self.live.local(change, [e.oid for e in events], op.req)
                    touched = (change.objects, change.requests)
            except Exception as exc:
                self._fail(index, op, {ADAPTER_CONTRACT: [f"the delta after {op} cannot be applied: {exc!r}"]})
            if contract:  # judged on the adapter's observation, every invariant, as the full check of a step
                self.live = KeptObservation(answer)
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
            if then is not None and self.sends_ahead:
                then = self._send_ahead(then, answer)
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
                self.live = KeptObservation(after)
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
        self._cover(transition)
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
        if then is not None:
            self.upcoming = then(after)
        return outcome

    def _send_ahead(self, then: Callable[[Observation], Op], answer: Observation) -> Callable[[Observation], Op]:
        """Ask ``then`` for the next op on the adapter's (well-formed, not yet judged) ``answer`` and send it to the
        child now; what ``step`` asks once the step is judged: that op (or what ``then`` raised, raised only
        then, where it would have been raised without sending ahead)."""
        assert isinstance(self.adapter, IsolatedAdapter)
        try:
            upcoming = then(answer)
        except Exception as exc:
            failed = exc

            def reraise(_: Observation) -> Op:
                raise failed

            return reraise
        self.adapter.send_ahead(upcoming)
        return lambda _: upcoming

    def _judged(self, results: Mapping[str, list[str] | None]) -> dict[str, list[str]]:
        """Count each judged invariant; the problems of those broken and not ignored."""
        checked, ignored = self.tally.checked, self.tally.ignored
        failures: dict[str, list[str]] = {}
        for name, problems in results.items():
            if problems is not None:
                checked[name] += 1
                if problems and name not in ignored:
                    failures[name] = problems
        return failures

    def finish(self) -> None:
        """The end of an example: when steps came as deltas since the whole state was last judged, take the
        adapter's full observation, report where the state kept from the deltas differs from it, and judge
        the state invariants on it (an adapter in a child process compares there, adapters/kept.py: where
        they agree, only that crosses, and the invariants judge the kept state, equal to the observation).
        Nothing to do when every step was judged whole, or after a violation."""
        if self.live is None or self.since_full == 0 or self.broken or not self.ops:
            return
        index, op = len(self.ops) - 1, self.ops[-1]
        agreed: Agreed | None = None
        try:
            if self.compared:
                full, agreed = self.adapter.observe_compared()  # type: ignore[attr-defined]
            else:
                full = self.adapter.observe()
        except CallTimeout:
            self.broken = True
            self.tally.hung = (self.config, list(self.ops))
            raise AdapterHung(index, op, self._timeout) from None
        except Exception as exc:
            self._fail(index, op, {ADAPTER_CONTRACT: [f"observe() at the end of the example {_raised(exc)}"]})
        contract: list[str] = []
        if agreed is not None:
            self.live.extra = agreed.extra
            full = self.live.now()
        else:
            wrong = malformed(Outcome.ok(), [], full)
            if wrong:
                self._fail(index, op, {ADAPTER_CONTRACT: [f"at the end of the example: {p}" for p in wrong]})
            contract = [
                f"at the end of the example: the state kept from the adapter's deltas differs from its observation: {p}"
                for p in differences(self.live.now(), full)
            ]
        assert isinstance(full, Observation)
        t = Transition(full, op, Outcome.ok(), (), full, self.config, self.semantics, self.memory)
        try:
            results = check_state(t)
        except Exception as exc:
            self._fail(index, op, {ADAPTER_CONTRACT: [f"the adapter's final observation cannot be judged: {exc!r}"]})
        self.tally.full_checks += 1
        failures = self._judged(results)
        if contract:
            failures[ADAPTER_CONTRACT] = contract
            self.live = KeptObservation(full)
        else:  # equal in every field compared; the deltas may leave extra out: the observation's
            self.live.extra = full.extra
        self.obs = self.live.now()
        self.since_full = 0
        if failures:
            self._fail(index, op, failures)

    def _cover(self, t: Transition) -> None:
        """Count the situations reached, so a report can say what was exercised (bad input by its class: the
        spec's error for the op in the state before it, as bad_input_rejected judged it)."""
        cov, op, outcome = self.tally.coverage, t.op, t.outcome
        cov[f"{op.op}:{outcome.status}"] += 1
        if op.contract:
            cov[f"contract:{op.op}:{op.contract}:{outcome.status}"] += 1
        error = t.bad_input_error
        if error is not None:
            cov[f"bad_input:{error.kind}"] += 1
        for event in t.events:
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
    shape: dict[tuple[bool, int], int] = {}  # one pass, no Counter: it runs on every step of a benchmark
    for o in obs.objects.values():
        kind = (o.key is not None, o.ref_count if o.ref_count < 2 else 2)
        shape[kind] = shape.get(kind, 0) + 1
    running = preempted = 0
    for r in obs.requests.values():
        if r.state == "running":
            running += 1
        elif r.state == "preempted":
            preempted += 1
    return (config.capacity, config.block_size, obs.free, tuple(sorted(shape.items())), running, preempted)


def _raised(exc: Exception) -> str:
    """``raised KeyError: 'r3'``, naming the adapter's own exception type when it ran in a child."""
    kind = exc.type_name if isinstance(exc, RemoteError) else type(exc).__name__
    if isinstance(exc, ChildDied):
        return f"ended the adapter: {exc}"
    return f"raised {kind}: {exc}"
