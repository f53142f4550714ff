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

from kvspec import stop
from kvspec.adapter import Adapter
from kvspec.adapter.answers import malformed, malformed_delta
from kvspec.adapter.answers import short as _short
from kvspec.adapters.isolation import CallTimeout, ChildDied, IsolatedAdapter, RemoteError
from kvspec.adapters.kept import Agreed
from kvspec.spec import INVARIANT_NAMES, Config, Observation, ObservationDelta, Op, Outcome, SpecError
from kvspec.spec.delta import KeptObservation, differences
from kvspec.spec.invariants import ADAPTER_CONTRACT, KeyMemory, Transition, check_state, check_transition
from kvspec.spec.ledger import LedgerModel, Step, validate

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
    # keep-going: a step that breaks invariants (adapter_contract excepted) is recorded and the example goes on,
    # the spec's state re-synchronised to the adapter's (Harness._resync); every broken invariant's first
    # violation is kept in ``past`` and each step's broken invariants are counted in ``violations``.
    step_past: bool = False
    past: dict[str, Violation] = field(default_factory=dict)
    violations: Counter[str] = field(default_factory=Counter)


@dataclass
class _Judged:
    """What one step gives the invariants: the states before and after it (the part it touched, on a delta
    step: ``touched``), the whole transition judged too on a K-th step (``whole``), and where the state kept
    from the deltas differs from the adapter's observation (``contract``: adapter_contract problems)."""

    before: Observation
    after: Observation
    touched: tuple[frozenset[Hashable], frozenset[str]] | None = None
    whole: Transition | None = None
    contract: list[str] = field(default_factory=list)


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
        # An adapter in a child process, judged whole every step: the next op can be sent before this step is
        # judged (step's ``then``), so the child runs it meanwhile.
        self.sends_ahead = isinstance(adapter, IsolatedAdapter) and not keeping
        self.upcoming: Op | None = None  # the op ``then`` chose after the last step (step's ``then``)
        self._validated: Op | None = None  # the op sent ahead, found valid where its step starts
        self.obs = self._start()
        # The whole state kept from the adapter's deltas; None: a full observation every step.
        self.kept: KeptObservation | None = None
        if keeping:
            self.kept = KeptObservation(self.obs)
            self.obs = self.kept.now()
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

    def _mode(self, index: int) -> str:
        """How step ``index`` observes: ``full`` (no kept state), ``delta``, or on every K-th step ``compared``
        (the child compares, adapters/kept.py) or ``both`` (in process: the delta and the observation)."""
        if self.kept is None:
            return "full"
        if (index + 1) % self.every:
            return "delta"
        return "compared" if self.compared else "both"

    def _run(self, op: Op, observe: str = "full") -> tuple[object, object, object]:
        """The adapter's answers to ``op``: its outcome, its events, what it left (unchecked: user code).

        ``observe`` (IsolatedAdapter.step): ``full`` its observation; ``delta`` its delta, or its
        observation when it gives none; ``both`` (its delta or None, its observation); ``compared`` (as
        ``both``, with :class:`Agreed` for the observation where the child's kept state equals it).
        For an adapter that leaves input checking to the kit (``checks_input=False``), bad input is
        answered here from the spec's own validation, and the adapter is not called.
        """
        validated, self._validated = self._validated, None
        if self.kit_validates and op is not validated:
            try:
                validate(op, self.obs, self.config, self.semantics)
            except SpecError as exc:
                return self._rejected(str(exc), observe)
        if isinstance(self.adapter, IsolatedAdapter):
            return self.adapter.step(op, observe)
        outcome, events = self.adapter.apply(op), self.adapter.events()
        if observe == "full":
            return outcome, events, self.adapter.observe()
        delta = self.adapter.observe_delta()  # type: ignore[attr-defined]
        if observe == "delta":
            return outcome, events, self.adapter.observe() if delta is None else delta
        return outcome, events, (delta, self.adapter.observe())

    def _rejected(self, problem: str, observe: str) -> tuple[object, object, object]:
        """Bad input answered by the kit, in the shape ``observe`` asks for: nothing changed."""
        outcome = Outcome.invalid(problem)
        if observe == "delta":
            return outcome, [], ObservationDelta(self.obs.free)
        if observe == "compared":
            return outcome, [], (None, self.obs, None)
        return outcome, [], self.obs if observe == "full" else (None, self.obs)

    def _answer(self, index: int, op: Op, observe: str) -> tuple[object, object, object]:
        """:meth:`_run`, with a hang raised as AdapterHung and anything the adapter raised as adapter_contract."""
        try:
            return self._run(op, observe)
        except CallTimeout:
            self.broken = True
            self.tally.hung = (self.config, list(self.ops))
            raise AdapterHung(index, op, self._timeout) from None
        except Exception as exc:
            self._fail(index, op, {ADAPTER_CONTRACT: [f"{op} {_raised(exc)}"]})

    def step(self, op: Op, then: Callable[[Observation], Op] | None = None) -> Outcome:
        """Apply ``op`` and check it; raise Violation when any invariant breaks.

        ``then`` (the swarm's walker): the next op, chosen from the state this step left; it is kept in
        ``self.upcoming``. Where the harness can (``sends_ahead``), ``then`` is asked as soon as the adapter's
        answer is well formed, before the invariants judge it, and the op it chose is sent to the child at once
        (``IsolatedAdapter.send_ahead``), so the child runs it while this step is judged; the state ``then``
        reads is the very observation judged, so a walk is the same op for op either way. Attribution is kept:
        the op sent ahead is not in ``self.ops`` until its own step; its answer, hang or death is raised there;
        if this step breaks, its answer is dropped unread by the child's next call.

        One path per way of observing, each ending in the same judgement (:meth:`_judge`): a full observation
        (:meth:`_full`); taking deltas (``self.kept``), a step whose number is not a multiple of K is judged on
        the part it changed (:meth:`_delta`), every K-th step takes the adapter's delta and its full
        observation, reports where the state kept from the deltas differs from it, and judges every invariant
        on the whole state (:meth:`_compared`; an adapter in a child process compares there, adapters/kept.py:
        where they agree, the observation does not cross and the kept state, equal to it, is judged).
        """
        stop.check()  # a signal whose KeyboardInterrupt was swallowed (kvspec.stop) stops the run here
        index = len(self.ops)
        self.ops.append(op)
        self.upcoming = None
        predicted = self.model.step(op) if self.model is not None else None
        observe = self._mode(index)
        raw, events, answer = self._answer(index, op, observe)
        delta: object = None
        agreed: Agreed | None = None
        if observe == "both" and isinstance(answer, tuple) and len(answer) == 2:
            delta, answer = answer
        elif observe == "compared" and isinstance(answer, tuple) and len(answer) == 3:
            delta, answer, agreed = answer
            if agreed is not None and self.kept is not None:
                answer = self.kept.now()  # the child found the kept state equal to the observation; replaced later
        if self.kept is not None and isinstance(delta, ObservationDelta) and isinstance(answer, Observation):
            judged = self._compared(index, op, raw, events, delta, answer, agreed, predicted)
        elif self.kept is not None and isinstance(answer, ObservationDelta):
            judged = self._delta(index, op, raw, events, answer)
        else:
            judged, then = self._full(index, op, raw, events, answer, delta, then)
        return self._judge(index, op, predicted, raw, events, judged, then)

    def _full(
        self,
        index: int,
        op: Op,
        raw: object,
        events: object,
        answer: object,
        delta: object,
        then: Callable[[Observation], Op] | None,
    ) -> tuple[_Judged, Callable[[Observation], Op] | None]:
        """A step answered with the adapter's whole observation: judged on it; a kept state restarts from it."""
        wrong = malformed(raw, events, answer)
        if delta is not None and not isinstance(delta, ObservationDelta):
            wrong.append(f"observe_delta() returned {_short(delta)}, not an ObservationDelta or None")
        if wrong:
            self._fail(index, op, {ADAPTER_CONTRACT: [f"after {op}: {p}" for p in wrong]})
        assert isinstance(answer, Observation)
        if then is not None and self.sends_ahead:
            then = self._send_ahead(then, answer)
        if self.kept is not None:  # the adapter gave no delta: the kept state is the observation from here on
            self.kept = KeptObservation(answer)
            self.since_full = 0
            self.tally.full_checks += 1
        return _Judged(self.obs, answer), then

    def _delta(self, index: int, op: Op, raw: object, events: object, delta: ObservationDelta) -> _Judged:
        """A step between K-th steps: the delta applied to the kept state, judged on the part it touched."""
        assert self.kept is not None
        wrong = malformed_delta(raw, events, delta)
        if wrong:
            self._fail(index, op, {ADAPTER_CONTRACT: [f"after {op}: {p}" for p in wrong]})
        assert isinstance(events, list)
        try:
            change = self.kept.apply(delta)
            before, after = self.kept.local(change, [e.oid for e in events], op.req)
        except Exception as exc:  # well-typed at the top, yet it cannot be applied (an unhashable oid, say)
            self._fail(index, op, {ADAPTER_CONTRACT: [f"the delta after {op} cannot be applied: {exc!r}"]})
        self.since_full += 1
        return _Judged(before, after, (change.objects, change.requests))

    def _compared(
        self,
        index: int,
        op: Op,
        raw: object,
        events: object,
        delta: ObservationDelta,
        answer: Observation,
        agreed: Agreed | None,
        predicted: Step | None,
    ) -> _Judged:
        """A K-th step: the local part judged as on every delta step, the kept whole state compared with the
        adapter's observation (here, or in its child: ``agreed``), and, where they agree, the invariants the
        local part cannot judge, on it. Where they differ, every invariant judges the observation."""
        kept = self.kept
        assert kept is not None
        wrong = ([] if agreed else malformed(raw, events, answer)) or malformed_delta(raw, events, delta)
        if wrong:
            self._fail(index, op, {ADAPTER_CONTRACT: [f"after {op}: {p}" for p in wrong]})
        assert isinstance(raw, Outcome) and isinstance(events, list)
        judged = _Judged(answer, answer)
        try:
            change = kept.apply(delta)
            if agreed is not None:  # the child found the kept state equal to the observation: it is the observation
                kept.extra = agreed.extra
                answer = kept.now()
            judged = _Judged(change.before, answer)
            if not agreed:
                judged.contract = [
                    f"after {op}: the state kept from the adapter's deltas differs from its observation: {p}"
                    for p in differences(kept.now(), answer)
                ]
            if not judged.contract:
                kept.extra = answer.extra  # the deltas may leave it out: the observation's
                judged.whole = Transition(
                    change.before, op, raw, tuple(events), kept.now(), self.config, self.semantics, self.memory,
                    predicted,
                )  # fmt: skip
                judged.before, judged.after = kept.local(change, [e.oid for e in events], op.req)
                judged.touched = (change.objects, change.requests)
        except Exception as exc:
            self._fail(index, op, {ADAPTER_CONTRACT: [f"the delta after {op} cannot be applied: {exc!r}"]})
        if judged.contract:  # judged on the adapter's observation, every invariant, as the full check of a step
            self.kept = KeptObservation(answer)
        self.since_full = 0
        self.tally.full_checks += 1
        return judged

    def _judge(
        self,
        index: int,
        op: Op,
        predicted: Step | None,
        outcome: object,
        events: object,
        judged: _Judged,
        then: Callable[[Observation], Op] | None,
    ) -> Outcome:
        """Every invariant on the step (and on the whole state where ``judged.whole`` says); the coverage counted;
        the state the step left kept as the next step's before; ``then`` asked for the next op."""
        assert isinstance(outcome, Outcome) and isinstance(events, list)
        transition = Transition(
            judged.before, op, outcome, tuple(events), judged.after, self.config, self.semantics, self.memory,
            predicted, judged.touched,
        )  # fmt: skip
        try:
            results = check_transition(transition, judged.whole)
        except Exception as exc:  # well-typed, yet the values cannot be judged (an unhashable oid, say)
            self._fail(index, op, {ADAPTER_CONTRACT: [f"what the adapter showed after {op} cannot be judged: {exc!r}"]})
        self.tally.steps += 1
        self._cover(transition)
        self.tally.checked[ADAPTER_CONTRACT] += 1
        failures = self._judged(results)
        if judged.contract:
            failures[ADAPTER_CONTRACT] = judged.contract
        if failures and (ADAPTER_CONTRACT in failures or not self.tally.step_past):
            self._fail(index, op, failures)
        after = judged.after if self.kept is None else self.kept.now()
        if failures:
            self._step_past(index, op, failures)
        if self.model is not None and any(results.values()):  # broken, ignored (a baseline's) or stepped past
            self._resync(after)
        if self.tally.states is not None:
            self.tally.states.add(abstract_state(self.config, after))
        self.obs = after
        if then is not None:
            self.upcoming = then(after)
        return outcome

    def _send_ahead(self, then: Callable[[Observation], Op], answer: Observation) -> Callable[[Observation], Op]:
        """Ask ``then`` for the next op on the adapter's (well-formed, not yet judged) ``answer`` and send it to the
        child now; what ``step`` asks once the step is judged: that op (or what ``then`` raised, raised only
        then, where it would have been raised without sending ahead). Bad input that the kit answers itself is
        not sent: its step answers it without the adapter, from this very state."""
        assert isinstance(self.adapter, IsolatedAdapter)
        try:
            upcoming = then(answer)
        except Exception as exc:
            failed = exc

            def reraise(_: Observation) -> Op:
                raise failed

            return reraise
        if self.kit_validates:
            try:
                validate(upcoming, answer, self.config, self.semantics)
            except SpecError:
                return lambda _: upcoming
            self._validated = upcoming  # valid on the state its step starts from: not validated again there
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
        if self.kept is None or self.since_full == 0 or self.broken or not self.ops:
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
            self.kept.extra = agreed.extra
            full = self.kept.now()
        else:
            wrong = malformed(Outcome.ok(), [], full)
            if wrong:
                self._fail(index, op, {ADAPTER_CONTRACT: [f"at the end of the example: {p}" for p in wrong]})
            contract = [
                f"at the end of the example: the state kept from the adapter's deltas differs from its observation: {p}"
                for p in differences(self.kept.now(), full)
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
            self.kept = KeptObservation(full)
        else:  # equal in every field compared; the deltas may leave extra out: the observation's
            self.kept.extra = full.extra
        self.obs = self.kept.now()
        self.since_full = 0
        if failures and (ADAPTER_CONTRACT in failures or not self.tally.step_past):
            self._fail(index, op, failures)
        if failures:
            self._step_past(index, op, failures)

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

    def _step_past(self, index: int, op: Op, failures: dict[str, list[str]]) -> None:
        """keep-going: each broken invariant counted, its first violation kept as its own (one invariant each, so
        each is shrunk as its own case), and the example goes on."""
        self._note(index, op, failures)
        tally = self.tally
        for name, problems in failures.items():
            tally.violations[name] += 1
            if name not in tally.past:
                tally.past[name] = violation_of(name)(index, op, {name: problems}, self.config, self.ops)

    def _resync(self, after: Observation) -> None:
        """Bring the spec's state back in line with the adapter's after a step that broke an invariant (stepped
        past, or a known violation a gate tolerates), so that what the next steps break is new and not a
        consequence of it: the ledger adopts the observation (LedgerModel.adopt says what is adopted and what
        stays the spec's). A ledger that cannot adopt one (record and entry granularity), or an observation it
        cannot take, ends the refinement checks for the rest of the example."""
        assert self.model is not None
        try:
            self.model.adopt(after, self.memory.content.get, self.memory.free_order)
        except Exception:  # NotImplementedError, or a state no ledger can hold (a negative ref count, say)
            self.model = None

    def _fail(self, index: int, op: Op | None, failures: dict[str, list[str]]) -> NoReturn:
        self.broken = True
        raise self._note(index, op, failures)

    def _note(self, index: int, op: Op | None, failures: dict[str, list[str]]) -> Violation:
        """Count a violation in the tally (first failure, first violation per invariant, last failure)."""
        violation = violation_of(first_invariant(failures))(index, op, failures, self.config, self.ops)
        if self.tally.first_failure_at is None:
            self.tally.first_failure_at = (self.tally.examples, self.tally.steps)
            self.tally.first_failure_s = time.perf_counter() - self.tally.started
            self.tally.first_invariant = violation.invariant
        where = op.to_json() if op is not None else None
        for name, problems in failures.items():
            self.tally.first_violation.setdefault(name, {"step": index, "op": where, "problems": problems[:5]})
        self.tally.last_failure = (self.config, list(self.ops), violation)
        return violation


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
