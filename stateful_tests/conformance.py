"""The conformance suite: run the state machine against one adapter and judge every invariant.

A failure is shrunk by Hypothesis, saved as a JSON case, and replayed on a fresh
adapter before it is reported; one that does not reproduce is reported as flaky.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hypothesis
from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis.database import ExampleDatabase
from hypothesis.errors import Flaky

from kvspec.adapter import Adapter, AdapterFactory
from kvspec.adapters.isolation import isolated
from kvspec.case import Case
from kvspec.report import ExitCode, Report, Status, now, rows
from kvspec.spec import INVARIANTS, Config, Op
from kvspec.spec.invariants import ADAPTER_CONTRACT, PolicyQuality
from kvspec.spec.ops import bad_input_kinds

from .case_db import forget_case, kept_cases
from .example_db import ExampleDbLocation, open_example_db
from .harness import AdapterHung, Harness, Tally, Violation
from .machine import build_machine
from .rounds import derandomized_seed, run_in_rounds
from .strategies import DEFAULT_RANGES, PoolRanges

BAD_INPUT_REJECTED = "bad_input_rejected"


@dataclass(frozen=True)
class Profile:
    """How hard to look. ``ci`` is deterministic and bounded; ``thorough`` is random and long."""

    name: str
    max_examples: int
    step_count: int
    derandomize: bool
    ranges: PoolRanges = DEFAULT_RANGES
    # The whole state is judged every this many steps, the part a step changed on the steps between, for
    # adapters that report deltas (Capabilities.deltas); 1: the whole state every step (docs/design.md).
    full_check_every: int = 1


PROFILES: dict[str, Profile] = {
    "ci": Profile("ci", max_examples=200, step_count=40, derandomize=True),
    "thorough": Profile("thorough", max_examples=3000, step_count=80, derandomize=False),
}


@dataclass
class Result:
    """Everything a check found; ``exit_code`` follows the external contract (0, 1, 2)."""

    adapter: str
    adapter_version: str
    profile: str
    seed: int | None
    started_at: str
    tally: Tally
    duration_s: float = 0.0
    status: Status = "passed"
    error: str = ""
    failure: Violation | None = None
    failure_ops: list[Op] = field(default_factory=list)
    failure_config: Config | None = None
    findings: list[dict[str, Any]] = field(default_factory=list)
    cases: list[str] = field(default_factory=list)
    applicable: frozenset[str] = frozenset()
    given_cases: int = 0
    bad_kinds: tuple[str, ...] = ()  # the classes of bad input the adapter can be given
    time_budget_s: float | None = None
    budget_spent: bool = False  # the run stopped starting examples at its time budget
    more_failures: list[tuple[Violation, list[Op], Config | None]] = field(default_factory=list)  # keep_going
    derandomized: bool = False  # Hypothesis's derandomized run: ``seed`` is the one it derives from the machine
    kept_cases: int = 0  # counterexamples kept in the example database (a swarm run's), replayed first
    engine: str = "hypothesis"  # which explorer ran: hypothesis (run_check) or swarm (swarm.run_swarm)
    sections: dict[str, Any] = field(default_factory=dict)  # what the engine adds to the report

    @property
    def exit_code(self) -> ExitCode:
        return ExitCode.of(self.status)

    def report(self) -> Report:
        """The run as the kit's report: one row per invariant (the registry's order, then adapter_contract)."""
        kinds = [(inv.name, inv.kind) for inv in INVARIANTS] + [(ADAPTER_CONTRACT, "adapter")]
        tally = self.tally
        seed = f"derandomized, seed {self.seed}" if self.derandomized else f"seed {self.seed}"
        untried = [k for k in self.bad_kinds if not tally.coverage.get(f"bad_input:{k}")]
        applicable = self.applicable - {BAD_INPUT_REJECTED} if untried else self.applicable
        reasons = {BAD_INPUT_REJECTED: f"bad input never tried: {', '.join(untried)}"} if untried else {}
        applicable -= tally.ignored
        reasons |= {name: "a known violation (baseline): checked, not judged" for name in tally.ignored}
        return Report(
            adapter=self.adapter,
            rows=rows(kinds, tally.checked, tally.first_violation, applicable=applicable, reasons=reasons),
            adapter_version=self.adapter_version,
            profile=self.profile,
            seed=self.seed,
            started_at=self.started_at,
            duration_s=self.duration_s,
            examples=tally.examples,
            steps=tally.steps,
            status=self.status,
            error=self.error,
            coverage=tally.coverage,
            findings=self.findings,
            cases=self.cases,
            sections={
                "given_cases": self.given_cases,
                "kept_cases": self.kept_cases,
                "engine": self.engine,
                "full_check_every": tally.full_check_every,
                "full_checks": tally.full_checks,
                **self.sections,
                "examples_to_first_failure": (tally.first_failure_at or (None, None))[0],
                **(
                    {"time_budget_s": self.time_budget_s, "budget_spent": self.budget_spent}
                    if self.time_budget_s is not None
                    else {}
                ),
                "seconds_to_first_failure": None if tally.first_failure_s is None else round(tally.first_failure_s, 3),
            },
            title=f"kvspec check: adapter {self.adapter} {self.adapter_version}, profile {self.profile}, {seed}"
            + ("" if self.engine == "hypothesis" else f", engine {self.engine}")
            + ("" if tally.full_check_every == 1 else f", whole state every {tally.full_check_every} steps"),
            details=self._details(),
        )

    def _details(self) -> list[str]:
        """What the table says below the verdicts: totals, coverage, the shrunk failure, findings and cases."""
        tally = self.tally
        rate = tally.steps / self.duration_s if self.duration_s else 0.0
        lines = ["", f"{tally.examples} examples, {tally.steps} steps in {self.duration_s:.1f} s ({rate:.0f} steps/s)"]
        if self.budget_spent:
            lines.append(f"stopped at the time budget of {self.time_budget_s:g} s")
        if self.kept_cases:
            lines.append(f"the first {self.kept_cases} examples were counterexamples kept in the example database")
        if self.given_cases:
            lines.append(
                f"then {self.given_cases} examples were the given cases and the bounded model's coverage cases"
            )
        if tally.first_failure_at is not None:
            lines.append(
                f"first failure after {tally.first_failure_at[0]} examples ({tally.first_failure_s or 0:.1f} s); "
                "the rest were shrinking"
            )
        if tally.coverage:
            lines.append("exercised: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.coverage.items())))
        shown = [(self.failure, self.failure_ops, self.failure_config)] if self.failure is not None else []
        for failure, ops, config in shown + self.more_failures:
            lines += ["", f"VIOLATED {failure.invariant} (shrunk to {len(ops)} ops):"]
            if config is not None:
                lines.append(f"  pool: {json.dumps(config.to_json())}")
            for i, op in enumerate(ops):
                marker = "  <-- " + ", ".join(sorted(failure.failures)) if i == failure.step else ""
                lines.append(f"  {i:>3}. {op}{marker}")
            for name, problems in failure.failures.items():
                lines += [f"  {name}: {p}" for p in problems[:3]]
        for finding in self.findings:
            lines.append(f"finding ({finding['kind']}): {finding.get('message') or finding.get('problems')}")
        for case in self.cases:
            lines.append(f"case saved: {case}  (replay: kvspec replay {case} --adapter {self.adapter})")
        return lines


def applicable_invariants(adapter: Adapter, refine: bool = True) -> frozenset[str]:
    """Invariants that can be judged for this adapter (refinement needs declared exact semantics; each
    invariant says which semantics it can judge: Invariant.applies)."""
    semantics = adapter.capabilities.semantics
    exact = semantics.exact and refine
    return frozenset(
        inv.name for inv in INVARIANTS if (inv.kind != "refinement" or exact) and inv.applies(semantics)
    ) | {ADAPTER_CONTRACT}


def replay_ops(
    adapter: Adapter, config: Config, ops: Sequence[Op], tally: Tally | None = None, *, refine: bool = True
) -> Violation | None:
    """Run ``ops`` on a fresh pool; the first violation, or None when every invariant held."""
    try:
        harness = Harness(adapter, config, tally, refine=refine)
        for op in ops:
            harness.step(op)
        harness.finish()
    except Violation as violation:
        return violation
    return None


def run_check(
    factory: AdapterFactory,
    *,
    name: str,
    profile: Profile,
    seed: int | None = None,
    max_examples: int | None = None,
    cases_dir: Path | str = Path(".kvspec/cases"),
    step_timeout: float | None = 30.0,
    progress: Callable[[Tally], None] | None = None,
    extra_cases: Sequence[Case] = (),
    refine: bool = True,
    adapter: Adapter | None = None,
    isolate: bool = True,
    example_db: ExampleDbLocation | None = None,
    time_budget_s: float | None = None,
    ignore: frozenset[str] = frozenset(),
    keep_going: bool = False,
    full_check_every: int | None = None,
) -> Result:
    """Check one adapter: replay ``extra_cases`` first, then the random stateful phase.

    refine=False checks the safety invariants only, even for adapters that declare
    exact semantics. ``isolate`` (default): every adapter runs in its own child process,
    each call under ``step_timeout`` (adapters/isolation.py); False runs it in this process
    (a debugger sees it; a hang is not cut off). ``adapter``: a first instance already
    built (the dispatch builds one to read its capabilities); fresh ones come from ``factory``.
    ``example_db``: a folder or a Redis URL (example_db.py) where Hypothesis keeps the failing examples it
    found, replayed first by the next run (None: none kept). ``time_budget_s``: no example starts after it.
    ``ignore``: invariants checked and counted but never raised (a gate's known violations),
    so the search goes on past them; their rows read unknown.
    ``keep_going``: a violation does not end the run; every distinct invariant that a failure
    broke first (in the given cases, then among the failures Hypothesis shrank, each on its own)
    is reported once, with its own shrunk, replayed case; ``result.failure`` is the first found.
    ``full_check_every``: K (None: the profile's); adapters that report deltas are judged on the whole
    state every K steps and at the end of each example, on the part a step changed between.
    """
    cases_dir = Path(cases_dir)  # a str from a caller would otherwise fail only when a case is saved
    t0 = time.perf_counter()
    if example_db is not None and seed is None and profile.derandomize:
        seed = 0  # Hypothesis keeps no database for a derandomized run; a fixed seed is as repeatable
    tally = Tally(
        ignored=ignore,
        deadline=None if time_budget_s is None else time.monotonic() + time_budget_s,
        full_check_every=full_check_every or profile.full_check_every,
    )
    quality = PolicyQuality()
    if seed is None and not profile.derandomize:
        seed = random.SystemRandom().getrandbits(32)  # drawn here, so that the report names it and --seed replays it
    series: list[tuple[int, float, int]] = []  # (steps checked, orphaned capacity share, evictions) after each example
    result = Result(name, "", profile.name, seed, now(), tally, time_budget_s=time_budget_s)
    make: AdapterFactory = isolated(factory, step_timeout) if isolate else factory
    try:
        try:
            if adapter is None:
                adapter = make()
            result.adapter_version = adapter.capabilities.version
            result.applicable = applicable_invariants(adapter, refine)
            caps = adapter.capabilities
            result.bad_kinds = bad_input_kinds(caps.ops, caps.semantics.granularity)
            result.given_cases = len(extra_cases)
            machine = build_machine(adapter, tally, profile.ranges, refine=refine)
            if progress is not None:
                machine = _with_progress(machine, tally, progress)
            machine = _with_quality(machine, quality, tally, series)
            # Derandomized (the ci profile, or --seed with its seed): Hypothesis's own derandomized run, rounds
            # included; the report names the seed that run draws from.
            derandomized = seed is None or (seed == derandomized_seed(machine) and example_db is None)
            if derandomized:
                result.seed = seed = derandomized_seed(machine)
            result.derandomized = derandomized
            hypothesis_seed = None if derandomized else seed
            found: list[Violation] = []  # keep_going: each distinct first invariant's failure, in order found
            database = open_example_db(example_db, name)
            kept = kept_cases(database) if database is not None else []
            result.kept_cases = len(kept)
            for case in [*kept, *extra_cases]:
                violation = replay_ops(adapter, case.config, case.ops, tally, refine=refine)
                if violation is None and database is not None and case in kept:
                    forget_case(database, case)  # it fails no more: the bug it found was fixed
                if violation is not None and not keep_going:
                    _record_failure(result, make, case.config, case.ops, violation, cases_dir, name, refine)
                    return result
                if violation is not None:
                    violation.config = case.config
                    found.append(violation)
            if hypothesis_seed is not None:
                machine = hypothesis.seed(hypothesis_seed)(machine)
            try:
                run_in_rounds(
                    machine,
                    _settings(profile, max_examples, derandomized, database),
                    hypothesis_seed,
                    tally.deadline,
                )
            except (Violation, BaseExceptionGroup) as raised:
                if not keep_going or isinstance(raised, Flaky):
                    raise
                found += _all_reported(raised)
            result.budget_spent = tally.deadline is not None and time.monotonic() >= tally.deadline
            if found:
                _record_failures(result, make, found, cases_dir, name, refine)
        except Flaky as exc:  # first: Hypothesis's FlakyFailure is an ExceptionGroup too
            result.status = "violated"
            result.findings.append({"kind": "flaky", "message": f"a failure did not reproduce under Hypothesis: {exc}"})
            if tally.last_failure is not None:
                config, ops, seen = tally.last_failure
                result.cases.append(str(_case(name, config, ops, seen).save(cases_dir)))
        except (Violation, BaseExceptionGroup) as raised:
            final = _reported(raised, tally.first_invariant)
            _record_failure(result, make, final.config or Config(), final.ops, final, cases_dir, name, refine)
        except AdapterHung as hung:
            _record_hang(result, hung, cases_dir)
    except KeyboardInterrupt:  # at any moment: while searching, shrinking, or replaying the shrunk case
        result.status, result.error = "interrupted", "interrupted"
        _keep_what_was_found(result, cases_dir)
    except Exception as exc:  # the adapter could not be built or reset: the check could not run
        result.status = "error"
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        if quality.steps and adapter is not None:
            result.findings.append(_quality_finding(adapter, quality, series))
        if adapter is not None:
            try:
                adapter.close()
            except Exception as exc:
                result.findings.append({"kind": "close", "message": f"adapter.close() raised {exc!r}"})
        result.duration_s = time.perf_counter() - t0
    return result


def _op_json(op: Op | None) -> dict[str, Any] | None:
    return None if op is None else op.to_json()


def _settings(
    profile: Profile, max_examples: int | None, derandomize: bool, database: ExampleDatabase | None = None
) -> settings:
    """Hypothesis settings of one run: the given example database (none by default), no deadline (the step
    timeout is ours), quiet."""
    return settings(
        max_examples=max_examples or profile.max_examples,
        stateful_step_count=profile.step_count,
        derandomize=derandomize,
        database=database,
        deadline=None,
        verbosity=Verbosity.quiet,
        report_multiple_bugs=True,  # each invariant's failure shrunk on its own; run_check reports the first found
        suppress_health_check=list(HealthCheck),
        # The explain phase costs several times the shrink itself on stateful tests.
        phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink),
    )


def _reported(raised: BaseException, first: str | None) -> Violation:
    """Of the failures Hypothesis shrank (one per invariant), the one of the invariant broken first."""
    found = [raised] if isinstance(raised, Violation) else []
    if isinstance(raised, BaseExceptionGroup):
        violations, rest = raised.split(Violation)
        if violations is None:
            raise rest if rest is not None else raised
        found = [v for v in violations.exceptions if isinstance(v, Violation)]
    return next((v for v in found if v.invariant == first), found[0])


def _all_reported(raised: BaseException) -> list[Violation]:
    """Every failure Hypothesis shrank (one per invariant broken first), in the order the group lists them."""
    if isinstance(raised, Violation):
        return [raised]
    assert isinstance(raised, BaseExceptionGroup)
    violations, rest = raised.split(Violation)
    if violations is None:
        raise rest if rest is not None else raised
    return [v for v in violations.exceptions if isinstance(v, Violation)]


def _record_failures(
    result: Result,
    factory: AdapterFactory,
    found: Sequence[Violation],
    cases_dir: Path,
    name: str,
    refine: bool,
) -> None:
    """keep_going: record each distinct invariant's first failure (shrunk, replayed, saved) once; the first found
    is ``result.failure``, the others ``result.more_failures``; each row keeps its own shrunk example."""
    rows: dict[str, dict[str, Any]] = {}
    recorded: list[tuple[Violation, list[Op], Config | None]] = []
    for violation in found:
        if violation.invariant in {v.invariant for v, _, _ in recorded}:
            continue
        config = violation.config or Config()
        _record_failure(result, factory, config, violation.ops, violation, cases_dir, name, refine)
        assert result.failure is not None
        recorded.append((result.failure, result.failure_ops, result.failure_config))
        for inv, row in result.tally.first_violation.items():
            rows.setdefault(inv, row)
    result.tally.first_violation = rows
    (result.failure, result.failure_ops, result.failure_config), *more = recorded
    result.more_failures = more


def _keep_what_was_found(result: Result, cases_dir: Path) -> None:
    """An interrupted run keeps its finding: the failure seen last (shrunk as far as it got) is saved as a case."""
    found = result.tally.last_failure
    if found is None or result.cases:
        return
    config, ops, violation = found
    result.failure, result.failure_ops, result.failure_config = violation, list(ops), config
    result.cases.append(str(_case(result.adapter, config, ops, violation).save(cases_dir)))


def _record_hang(result: Result, hung: AdapterHung, cases_dir: Path) -> None:
    """A step that did not return: an adapter_contract violation, its ops saved as a case (no shrinking)."""
    result.status = "violated"
    result.tally.first_violation.setdefault(
        ADAPTER_CONTRACT, {"step": hung.step, "op": _op_json(hung.op), "problems": [str(hung)]}
    )
    result.findings.append({"kind": ADAPTER_CONTRACT, "message": str(hung)})
    config, ops = result.tally.hung or (Config(), [] if hung.op is None else [hung.op])
    result.failure_ops, result.failure_config = ops, config
    case = Case(
        result.adapter, config, ops, {"invariant": ADAPTER_CONTRACT, "step": hung.step, "problems": [str(hung)]}
    )
    result.cases.append(str(case.save(cases_dir)))


def _case(name: str, config: Config, ops: Sequence[Op], violation: Violation) -> Case:
    return Case(
        name,
        config,
        list(ops),
        {
            "invariant": violation.invariant,
            "violated": sorted(violation.failures),
            "step": violation.step,
            "problems": [p for ps in violation.failures.values() for p in ps][:8],
        },
    )


def _record_failure(
    result: Result,
    factory: AdapterFactory,
    config: Config,
    ops: Sequence[Op],
    violation: Violation,
    cases_dir: Path,
    name: str,
    refine: bool,
) -> None:
    """Replay the shrunk case on a fresh adapter, minimise it further, save it, and report what broke."""
    result.status = "violated"
    fresh: Adapter = factory()
    ignored = result.tally.ignored  # known violations stay unjudged while the new one is confirmed
    try:
        every = result.tally.full_check_every  # replayed and minimised under the same K as it was found
        again = replay_ops(fresh, config, ops, Tally(ignored=ignored, full_check_every=every), refine=refine)
        if again is None or again.invariant != violation.invariant:
            seen = "nothing" if again is None else again.invariant
            result.findings.append(
                {"kind": "flaky", "message": f"the shrunk case did not reproduce on a fresh adapter (got {seen})"}
            )
        else:
            ops, violation = minimize_ops(
                fresh, config, ops, again, refine=refine, ignore=ignored, full_check_every=every
            )
    finally:
        fresh.close()
    result.failure, result.failure_ops, result.failure_config = violation, list(ops), config
    # The shrunk example is the one reported; earlier, longer examples only count as checked steps.
    for inv in list(result.tally.first_violation):
        if inv not in violation.failures:
            del result.tally.first_violation[inv]
    for inv, problems in violation.failures.items():
        result.tally.first_violation[inv] = {
            "step": violation.step,
            "op": _op_json(violation.op),
            "problems": problems[:5],
        }
        kind = next((i.kind for i in INVARIANTS if i.name == inv), "adapter")
        if kind != "safety":
            result.findings.append({"kind": kind, "invariant": inv, "step": violation.step, "problems": problems[:5]})
    case = _case(name, config, ops, violation)
    result.cases.append(str(case.save(cases_dir)))


def minimize_ops(
    adapter: Adapter,
    config: Config,
    ops: Sequence[Op],
    violation: Violation,
    *,
    refine: bool = True,
    ignore: frozenset[str] = frozenset(),
    full_check_every: int = 1,
) -> tuple[list[Op], Violation]:
    """Drop ops one at a time while the same invariant still breaks (1-minimal, by replay).

    Hypothesis shrinks the choices that generated the ops; deleting a step there can
    change what later steps draw. Replaying concrete ops has no such coupling, so
    this pass finishes what shrinking leaves. Passes repeat until one drops nothing: dropping a later op
    can make an earlier one unnecessary, and a single pass would leave it (a swarm walk's long failures
    showed it, tests/test_swarm.py).
    """
    best, best_violation = list(ops[: violation.step + 1]), violation
    dropped = True
    while dropped:
        dropped, i = False, 0
        while i < len(best):
            candidate = best[:i] + best[i + 1 :]
            tally = Tally(ignored=ignore, full_check_every=full_check_every)
            again = replay_ops(adapter, config, candidate, tally, refine=refine) if candidate else None
            if again is not None and again.invariant == violation.invariant:
                best, best_violation, dropped = candidate[: again.step + 1], again, True
            else:
                i += 1
    return best, best_violation


def _with_quality(machine: type, quality: PolicyQuality, tally: Tally, series: list[tuple[int, float, int]]) -> type:
    """Wrap the machine so that each example's policy-quality counts add up into ``quality``, and ``series``
    gets the running figures after each example (steps checked, orphaned capacity share, evictions)."""

    class WithQuality(machine):  # type: ignore[misc]
        def teardown(self) -> None:
            harness = getattr(self, "harness", None)
            if harness is not None:
                quality.merge(harness.memory.quality)
                share = quality.orphan_block_steps / quality.block_steps if quality.block_steps else 0.0
                series.append((tally.steps, share, quality.evictions))
            super().teardown()

    WithQuality.__name__ = machine.__name__
    return WithQuality


QUALITY_POINTS = 200
"""At most this many points of the policy-quality series go into a report (evenly spaced, the last one kept)."""


def _quality_finding(
    adapter: Adapter, quality: PolicyQuality, series: Sequence[tuple[int, float, int]] = ()
) -> dict[str, Any]:
    """The policy-quality report: orphaned and lost-hit cached blocks (never hit again) and the capacity they
    held, and how those figures grew over the run (``series``: steps, orphaned capacity share, evictions, after
    each example)."""
    data = quality.to_json()
    stride = max(1, -(-len(series) // QUALITY_POINTS))
    kept = list(series[::stride])
    if series and kept[-1] != series[-1]:
        kept.append(series[-1])
    eviction = adapter.capabilities.semantics.eviction
    message = (
        f"eviction {eviction}: {data['evictions']} evictions, {data['evictions_with_choice']} with a choice; "
        f"orphaned cached blocks held {data['orphan_capacity_share']:.2%} of capacity over "
        f"{data['steps']} steps (at most {data['orphans_max']} at once); cached blocks no lookup finds (lost hits) "
        f"held {data['lost_capacity_share']:.2%} (at most {data['lost_max']} at once)"
    )
    points = {
        "steps": [p[0] for p in kept],
        "orphan_capacity_share": [round(p[1], 6) for p in kept],
        "evictions": [p[2] for p in kept],
    }
    return {"kind": "policy_quality", "eviction": eviction, "message": message, **data, "series": points}


def _with_progress(machine: type, tally: Tally, progress: Callable[[Tally], None]) -> type:
    """Wrap the machine so that ``progress`` sees the tally after each example's first step."""

    class WithProgress(machine):  # type: ignore[misc]
        def teardown(self) -> None:
            progress(tally)
            super().teardown()

    WithProgress.__name__ = machine.__name__
    return WithProgress
