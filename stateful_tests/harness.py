"""Drive one adapter through spec operations and check every invariant after every step.

The harness is shared by the Hypothesis state machine, the replayer and the
benchmarks: one step = predict with the spec (when the adapter claims exact
semantics), apply to the adapter, observe, and check the transition.
"""

from __future__ import annotations

import concurrent.futures
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NoReturn

from kvspec.adapters.base import Adapter
from kvspec.spec import (
    INVARIANT_NAMES,
    Config,
    Event,
    KeyMemory,
    LedgerModel,
    Observation,
    Op,
    Outcome,
    Transition,
    check_transition,
)
from kvspec.spec.invariants import ADAPTER_CONTRACT


class Violation(AssertionError):
    """An invariant broke at ``step`` (0-based) on ``op``. ``failures``: invariant -> problems."""

    def __init__(self, step: int, op: Op, failures: dict[str, list[str]]) -> None:
        self.step, self.op, self.failures = step, op, failures
        self.invariant = next(n for n in INVARIANT_NAMES if n in failures)
        lines = [f"step {step}: {op}"]
        for name, problems in failures.items():
            lines += [f"  {name}: {p}" for p in problems[:3]]
        super().__init__("\n".join(lines))


class AdapterHung(BaseException):
    """The adapter did not answer within the step timeout. BaseException: no retry, no shrinking."""

    def __init__(self, step: int, op: Op, timeout: float) -> None:
        self.step, self.op, self.timeout = step, op, timeout
        super().__init__(f"step {step}: {op} did not return within {timeout:g} s")


@dataclass
class Tally:
    """What the whole run checked: per-invariant step counts, first violation, totals."""

    checked: Counter[str] = field(default_factory=Counter)
    first_violation: dict[str, dict[str, Any]] = field(default_factory=dict)
    examples: int = 0
    steps: int = 0
    coverage: Counter[str] = field(default_factory=Counter)
    first_failure_at: tuple[int, int] | None = None  # (examples, steps) run when the first failure was seen
    last_failure: tuple[Config, list[Op], Violation] | None = None
    hung: tuple[Config, list[Op]] | None = None


class Harness:
    """One example: a fresh pool of ``config`` and the ops applied to it so far."""

    def __init__(
        self,
        adapter: Adapter,
        config: Config,
        tally: Tally | None = None,
        *,
        step_timeout: float | None = None,
        executor: concurrent.futures.ThreadPoolExecutor | None = None,
        refine: bool = True,
    ) -> None:
        self.adapter, self.config = adapter, config
        self.tally = tally if tally is not None else Tally()
        self.semantics = adapter.capabilities.semantics
        self.step_timeout, self.executor = step_timeout, executor
        self.ops: list[Op] = []
        self.memory = KeyMemory()
        adapter.reset(config)
        adapter.events()  # drop anything left from before the reset
        self.model = LedgerModel(config, self.semantics) if self.semantics.exact and refine else None
        self.obs = adapter.observe()
        self.tally.examples += 1

    def _run(self, op: Op) -> tuple[object, list[Event], Observation]:
        return self.adapter.apply(op), self.adapter.events(), self.adapter.observe()

    def step(self, op: Op) -> Outcome:
        """Apply ``op`` and check it; raise Violation when any invariant breaks."""
        index = len(self.ops)
        self.ops.append(op)
        predicted = self.model.step(op) if self.model is not None else None
        try:
            if self.executor is not None and self.step_timeout:
                future = self.executor.submit(self._run, op)
                try:
                    raw, events, after = future.result(timeout=self.step_timeout)
                except concurrent.futures.TimeoutError:
                    self.tally.hung = (self.config, list(self.ops))
                    raise AdapterHung(index, op, self.step_timeout) from None
            else:
                raw, events, after = self._run(op)
        except AdapterHung:
            raise
        except Exception as exc:
            self._fail(index, op, {ADAPTER_CONTRACT: [f"{op} raised {type(exc).__name__}: {exc}"]})
        if not isinstance(raw, Outcome):  # adapters are user code
            self._fail(index, op, {ADAPTER_CONTRACT: [f"{op} returned {raw!r}, not an Outcome"]})
        outcome = raw
        transition = Transition(
            self.obs, op, outcome, tuple(events), after, self.config, self.semantics, self.memory, predicted
        )
        results = check_transition(transition)
        self.tally.steps += 1
        self._cover(op, outcome, events)
        self.tally.checked[ADAPTER_CONTRACT] += 1
        failures: dict[str, list[str]] = {}
        for name, problems in results.items():
            if problems is None:
                continue
            self.tally.checked[name] += 1
            if problems:
                failures[name] = problems
        if failures:
            self._fail(index, op, failures)
        self.obs = after
        return outcome

    def _cover(self, op: Op, outcome: Outcome, events: list[Event]) -> None:
        """Count the situations reached, so a report can say what was exercised."""
        cov = self.tally.coverage
        cov[f"{op.op}:{outcome.status}"] += 1
        for event in events:
            cov[event.kind] += 1
        if outcome.hit_tokens:
            cov["prefix_hit"] += 1

    def _fail(self, index: int, op: Op, failures: dict[str, list[str]]) -> NoReturn:
        violation = Violation(index, op, failures)
        if self.tally.first_failure_at is None:
            self.tally.first_failure_at = (self.tally.examples, self.tally.steps)
        for name, problems in failures.items():
            self.tally.first_violation.setdefault(name, {"step": index, "op": op.to_json(), "problems": problems[:5]})
        self.tally.last_failure = (self.config, list(self.ops), violation)
        raise violation
