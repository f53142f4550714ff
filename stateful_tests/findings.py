"""The findings pipeline both engines share: from a failure seen to a reported, replayable counterexample.

An engine (hypothesis_engine.run_check, swarm.run_swarm) only explores: it is handed a :class:`Search`
by :func:`run_search`, which builds the adapter, reads its capabilities, and afterwards records what the
exploration left, whatever ended it. A failure is replayed on a fresh adapter (one that does not
reproduce is a ``flaky`` finding, never dropped), minimised by replay (:func:`minimize_ops`), saved as a
case and named in the :class:`Result`, whose report is the same whichever engine ran. A hang is an
``adapter_contract`` violation with its ops saved; an interrupt keeps the last failure seen; the policy
quality figures of every example go into the report.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvspec import stop
from kvspec.adapter import Adapter, AdapterFactory
from kvspec.adapters.isolation import isolated
from kvspec.case import Case
from kvspec.report import ExitCode, Report, Status, now, rows
from kvspec.spec import INVARIANTS, Config, Op
from kvspec.spec.invariants import ADAPTER_CONTRACT, PolicyQuality
from kvspec.spec.ops import bad_input_kinds

from .harness import AdapterHung, Harness, Tally, Violation
from .options import Options, Profile

BAD_INPUT_REJECTED = "bad_input_rejected"

QUALITY_POINTS = 200
"""At most this many points of the policy-quality series go into a report (evenly spaced, the last one kept)."""


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
        named = f"{self.adapter} {self.adapter_version}".strip()  # an adapter may give no version
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
            sections=self._sections(),
            title=f"kvspec check: adapter {named}, profile {self.profile}, {seed}"
            + ("" if self.engine == "hypothesis" else f", engine {self.engine}")
            + ("" if tally.full_check_every == 1 else f", whole state every {tally.full_check_every} steps"),
            details=self._details(),
        )

    def _sections(self) -> dict[str, Any]:
        tally = self.tally
        budget = {"time_budget_s": self.time_budget_s, "budget_spent": self.budget_spent}
        return {
            "given_cases": self.given_cases,
            "kept_cases": self.kept_cases,
            "engine": self.engine,
            "full_check_every": tally.full_check_every,
            "full_checks": tally.full_checks,
            **self.sections,
            "examples_to_first_failure": (tally.first_failure_at or (None, None))[0],
            **(budget if self.time_budget_s is not None else {}),
            "seconds_to_first_failure": None if tally.first_failure_s is None else round(tally.first_failure_s, 3),
            **({"violations": dict(tally.violations)} if tally.step_past else {}),
        }

    def _details(self) -> list[str]:
        """What the table says below the verdicts: totals, coverage, the shrunk failure, findings and cases."""
        lines = self._totals()
        shown = [(self.failure, self.failure_ops, self.failure_config)] if self.failure is not None else []
        for failure, ops, config in shown + self.more_failures:
            lines += failure_lines(failure, ops, config)
        for finding in self.findings:
            lines.append(f"finding ({finding['kind']}): {finding.get('message') or finding.get('problems')}")
        for case in self.cases:
            lines.append(f"case saved: {case}  (replay: kvspec replay {case} --adapter {self.adapter})")
        return lines

    def _totals(self) -> list[str]:
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
        if tally.violations:
            counted = ", ".join(f"{name} {n}" for name, n in sorted(tally.violations.items(), key=lambda kv: -kv[1]))
            lines.append(f"violations stepped past (steps that broke each invariant): {counted}")
        if tally.coverage:
            lines.append("exercised: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.coverage.items())))
        return lines


def failure_lines(failure: Violation, ops: Sequence[Op], config: Config | None) -> list[str]:
    """A shrunk failure as the report's text shows it: the pool, the ops (the failing one marked), the problems."""
    lines = ["", f"VIOLATED {failure.invariant} (shrunk to {len(ops)} ops):"]
    if config is not None:
        lines.append(f"  pool: {json.dumps(config.to_json())}")
    for i, op in enumerate(ops):
        marker = "  <-- " + ", ".join(sorted(failure.failures)) if i == failure.step else ""
        lines.append(f"  {i:>3}. {op}{marker}")
    for name, problems in failure.failures.items():
        lines += [f"  {name}: {p}" for p in problems[:3]]
    return lines


def not_started(name: str, options: Options, status: Status, error: str) -> Report:
    """The report of a check whose adapter could not even be built: every verdict unknown."""
    result = Result(name, "", options.profile.name, options.seed, now(), Tally(), status=status, error=error)
    return result.report()


def applicable_invariants(adapter: Adapter, refine: bool = True) -> frozenset[str]:
    """Invariants that can be judged for this adapter (refinement needs declared exact semantics; each
    invariant says which semantics it can judge: Invariant.applies)."""
    semantics = adapter.capabilities.semantics
    exact = semantics.exact and refine
    return frozenset(
        inv.name for inv in INVARIANTS if (inv.kind != "refinement" or exact) and inv.applies(semantics)
    ) | {ADAPTER_CONTRACT}


# -- replaying and minimising ----------------------------------------------------------------------


def replay_ops(
    adapter: Adapter,
    config: Config,
    ops: Sequence[Op],
    tally: Tally | None = None,
    *,
    refine: bool = True,
    target: str | None = None,
) -> Violation | None:
    """Run ``ops`` on a fresh pool; the first violation, or None when every invariant held.

    ``target``: step past violations (keep-going, the spec re-synchronised after each) and return the first
    violation of that invariant, wherever in the ops it comes; None when it never breaks.
    """
    tally = tally if tally is not None else Tally()
    if target is not None:
        tally.step_past, tally.past = True, {}
    try:
        harness = Harness(adapter, config, tally, refine=refine)
        for op in ops:
            harness.step(op)
        harness.finish()
    except Violation as violation:
        if target is None or violation.invariant == target:
            return violation
        return tally.past.get(target)
    return tally.past.get(target) if target is not None else None


def minimize_ops(
    adapter: Adapter,
    config: Config,
    ops: Sequence[Op],
    violation: Violation,
    *,
    refine: bool = True,
    ignore: frozenset[str] = frozenset(),
    full_check_every: int = 1,
    step_past: bool = False,
) -> tuple[list[Op], Violation]:
    """Drop ops one at a time while the same invariant still breaks (1-minimal, by replay).

    Hypothesis shrinks the choices that generated the ops; deleting a step there can
    change what later steps draw. Replaying concrete ops has no such coupling, so
    this pass finishes what shrinking leaves. Passes repeat until one drops nothing: dropping a later op
    can make an earlier one unnecessary, and a single pass would leave it (a swarm walk's long failures
    showed it, tests/test_swarm.py). ``step_past`` (keep-going): the invariant may break after others, each
    stepped past; the case kept is the shortest that still breaks it anywhere.
    """
    best, best_violation = list(ops[: violation.step + 1]), violation
    dropped = True
    while dropped:
        dropped, i = False, 0
        while i < len(best):
            candidate = best[:i] + best[i + 1 :]
            tally = Tally(ignored=ignore, full_check_every=full_check_every)
            target = violation.invariant if step_past else None
            again = replay_ops(adapter, config, candidate, tally, refine=refine, target=target) if candidate else None
            if again is not None and again.invariant == violation.invariant:
                best, best_violation, dropped = candidate[: again.step + 1], again, True
            else:
                i += 1
    return best, best_violation


# -- recording what was found ---------------------------------------------------------------------


def case_of(name: str, config: Config, ops: Sequence[Op], violation: Violation) -> Case:
    """The replayable case of a violation: the adapter, the pool, the ops, and what they broke where."""
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


def record_failure(
    result: Result,
    factory: AdapterFactory,
    config: Config,
    ops: Sequence[Op],
    violation: Violation,
    options: Options,
) -> None:
    """Replay the shrunk case on a fresh adapter, minimise it further, save it, and report what broke."""
    result.status = "violated"
    fresh: Adapter = factory()
    ignored = result.tally.ignored  # known violations stay unjudged while the new one is confirmed
    every = result.tally.full_check_every  # replayed and minimised under the same K as it was found
    target = violation.invariant if options.keep_going else None
    try:
        tally = Tally(ignored=ignored, full_check_every=every)
        again = replay_ops(fresh, config, ops, tally, refine=options.refine, target=target)
        if again is None or again.invariant != violation.invariant:
            seen = "nothing" if again is None else again.invariant
            result.findings.append(
                {"kind": "flaky", "message": f"the shrunk case did not reproduce on a fresh adapter (got {seen})"}
            )
        else:
            ops, violation = minimize_ops(
                fresh, config, ops, again, refine=options.refine, ignore=ignored, full_check_every=every,
                step_past=options.keep_going,
            )  # fmt: skip
    finally:
        fresh.close()
    result.failure, result.failure_ops, result.failure_config = violation, list(ops), config
    _name_first_violations(result, violation)
    result.cases.append(str(case_of(result.adapter, config, ops, violation).save(options.cases_dir)))


def _name_first_violations(result: Result, violation: Violation) -> None:
    """The shrunk example is the one reported; earlier, longer examples only count as checked steps."""
    first = result.tally.first_violation
    for inv in list(first):
        if inv not in violation.failures:
            del first[inv]
    for inv, problems in violation.failures.items():
        first[inv] = {"step": violation.step, "op": _op_json(violation.op), "problems": problems[:5]}
        kind = next((i.kind for i in INVARIANTS if i.name == inv), "adapter")
        if kind != "safety":
            result.findings.append({"kind": kind, "invariant": inv, "step": violation.step, "problems": problems[:5]})


def record_failures(result: Result, factory: AdapterFactory, found: Sequence[Violation], options: Options) -> None:
    """keep_going: record each distinct invariant's first failure (shrunk, replayed, saved) once; the first found
    is ``result.failure``, the others ``result.more_failures``; each row keeps its own shrunk example."""
    first_rows: dict[str, dict[str, Any]] = {}
    recorded: list[tuple[Violation, list[Op], Config | None]] = []
    for violation in found:
        if violation.invariant in {v.invariant for v, _, _ in recorded}:
            continue
        record_failure(result, factory, violation.config or Config(), violation.ops, violation, options)
        assert result.failure is not None
        recorded.append((result.failure, result.failure_ops, result.failure_config))
        for inv, row in result.tally.first_violation.items():
            first_rows.setdefault(inv, row)
    result.tally.first_violation = first_rows
    (result.failure, result.failure_ops, result.failure_config), *more = recorded
    result.more_failures = more


def keep_what_was_found(result: Result, options: Options) -> None:
    """An interrupted run keeps its finding: the failure seen last (shrunk as far as it got) is saved as a case."""
    found = result.tally.last_failure
    if found is None or result.cases:
        return
    config, ops, violation = found
    result.failure, result.failure_ops, result.failure_config = violation, list(ops), config
    result.cases.append(str(case_of(result.adapter, config, ops, violation).save(options.cases_dir)))


def record_hang(result: Result, hung: AdapterHung, options: Options) -> None:
    """A step that did not return: an adapter_contract violation, its ops saved as a case (no shrinking)."""
    result.status = "violated"
    problems = [str(hung)]
    result.tally.first_violation.setdefault(
        ADAPTER_CONTRACT, {"step": hung.step, "op": _op_json(hung.op), "problems": problems}
    )
    result.findings.append({"kind": ADAPTER_CONTRACT, "message": str(hung)})
    config, ops = result.tally.hung or (Config(), [] if hung.op is None else [hung.op])
    result.failure_ops, result.failure_config = ops, config
    case = Case(result.adapter, config, ops, {"invariant": ADAPTER_CONTRACT, "step": hung.step, "problems": problems})
    result.cases.append(str(case.save(options.cases_dir)))


def _op_json(op: Op | None) -> dict[str, Any] | None:
    return None if op is None else op.to_json()


def quality_finding(
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


# -- one search, whichever engine explores -----------------------------------------------------------------


@dataclass
class Search:
    """What an engine explores with: the options, the adapter built first (``adapter``) and fresh ones
    (``make``: each in its own child process unless ``options.isolate`` is off), the tally of every step, the
    result being built, the policy quality of every example, and under keep_going the failures kept so far.

    Invariant: a failure reaches the report only through :meth:`failed` (or, for Hypothesis's own
    failures, :func:`record_failure`), so it is replayed, minimised and saved whatever engine found it.
    """

    name: str
    options: Options
    profile: Profile
    make: AdapterFactory
    adapter: Adapter
    tally: Tally
    result: Result
    quality: PolicyQuality = field(default_factory=PolicyQuality)
    series: list[tuple[int, float, int]] = field(default_factory=list)  # (steps, orphaned share, evictions)
    found: list[Violation] = field(default_factory=list)

    def failed(self, violation: Violation, config: Config | None = None, ops: Sequence[Op] | None = None) -> bool:
        """A failure was found (on ``config`` and ``ops``: the violation's own by default). Without keep_going
        it is recorded now and the search ends (True); with it, kept for the end, once per invariant (False)."""
        if not self.options.keep_going:
            config = config or violation.config or Config()
            record_failure(
                self.result, self.make, config, violation.ops if ops is None else ops, violation, self.options
            )
            return True
        if config is not None:
            violation.config = config
        if violation.invariant not in {v.invariant for v in self.found}:
            self.found.append(violation)
        return False

    def replay(self, cases: Sequence[Case], held: Callable[[Case], None] | None = None) -> bool:
        """Replay ``cases`` on the adapter (``held``: told of each that broke nothing); True when one failed and
        the search ends there."""
        for case in cases:
            violation = replay_ops(self.adapter, case.config, case.ops, self.tally, refine=self.options.refine)
            if violation is None:
                if held is not None:
                    held(case)
            elif self.failed(violation, case.config, case.ops):
                return True
        return False


def run_search(
    factory: AdapterFactory,
    name: str,
    options: Options,
    explore: Callable[[Search], None],
    *,
    engine: str,
    seed: int | None,
    adapter: Adapter | None = None,
    states: set[Hashable] | None = None,
    finish: Callable[[Result], None] | None = None,
) -> Result:
    """One check by one engine: build the adapter (``adapter``: a first instance already built), let
    ``explore`` search, then record what it left, whatever ended it: the failures kept under keep_going, a
    hang, an interrupt (the last failure seen is saved), an adapter that could not be built or reset
    (status error); ``finish`` adds the engine's own part; the adapter is always closed."""
    t0 = time.perf_counter()
    profile = options.profile
    tally = Tally(
        ignored=options.ignore,
        step_past=options.keep_going,
        deadline=None if options.time_budget_s is None else time.monotonic() + options.time_budget_s,
        states=states,
        full_check_every=options.full_check_every or profile.full_check_every,
    )
    result = Result(name, "", profile.name, seed, now(), tally, time_budget_s=options.time_budget_s, engine=engine)
    make: AdapterFactory = isolated(factory, options.step_timeout) if options.isolate else factory
    search: Search | None = None
    try:
        try:
            if adapter is None:
                adapter = make()
            caps = adapter.capabilities
            result.adapter_version = caps.version
            result.applicable = applicable_invariants(adapter, options.refine)
            result.bad_kinds = bad_input_kinds(caps.ops, caps.semantics.granularity)
            search = Search(name, options, profile, make, adapter, tally, result)
            explore(search)
            for violation in tally.past.values():  # keep-going: each invariant broken and stepped past
                search.failed(violation)
            if search.found:
                record_failures(result, make, search.found, options)
        except AdapterHung as hung:
            record_hang(result, hung, options)
    except KeyboardInterrupt:  # at any moment: while searching, shrinking, or replaying the shrunk case
        stop.clear()
        result.status, result.error = "interrupted", "interrupted"
        keep_what_was_found(result, options)
    except Exception as exc:  # the adapter could not be built or reset: the check could not run
        if stop.requested():  # an error that a signal's KeyboardInterrupt left behind (it unwound a library's state)
            stop.clear()
            result.status, result.error = "interrupted", "interrupted"
            keep_what_was_found(result, options)
        else:
            result.status = "error"
            result.error = f"{type(exc).__name__}: {exc}"
    finally:
        _close(search, result, adapter, finish)
        result.duration_s = time.perf_counter() - t0
    return result


def _close(
    search: Search | None, result: Result, adapter: Adapter | None, finish: Callable[[Result], None] | None
) -> None:
    """The end of every search: the engine's own part, the policy quality, the adapter closed."""
    if finish is not None:
        finish(result)
    if search is not None and search.quality.steps:
        result.findings.append(quality_finding(search.adapter, search.quality, search.series))
    if adapter is not None:
        try:
            adapter.close()
        except Exception as exc:
            result.findings.append({"kind": "close", "message": f"adapter.close() raised {exc!r}"})


__all__ = [
    "BAD_INPUT_REJECTED",
    "Result",
    "Search",
    "applicable_invariants",
    "case_of",
    "failure_lines",
    "keep_what_was_found",
    "minimize_ops",
    "not_started",
    "quality_finding",
    "record_failure",
    "record_failures",
    "record_hang",
    "replay_ops",
    "run_search",
]
