"""The Hypothesis engine: the state machine (machine.py) run against one adapter, every step judged.

The counterexamples kept in the example database and the given cases are replayed first; then
Hypothesis generates op sequences in rounds (rounds.py). A failure is shrunk by Hypothesis and handed to
the findings pipeline (findings.py), which replays it on a fresh adapter, minimises it, saves it and
reports it; one that Hypothesis itself cannot reproduce is a ``flaky`` finding.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence

import hypothesis
from hypothesis import HealthCheck, Phase, Verbosity, settings
from hypothesis.database import ExampleDatabase
from hypothesis.errors import Flaky

from kvspec.adapter import Adapter, AdapterFactory
from kvspec.case import Case
from kvspec.spec import Config

from .case_db import forget_case, kept_cases
from .example_db import open_example_db
from .findings import Result, Search, case_of, record_failure, run_search
from .harness import Tally, Violation
from .machine import build_machine
from .options import Options, Profile
from .rounds import derandomized_seed, run_in_rounds


def run_check(
    factory: AdapterFactory,
    name: str,
    options: Options,
    *,
    adapter: Adapter | None = None,
    extra_cases: Sequence[Case] = (),
    progress: Callable[[Tally], None] | None = None,
) -> Result:
    """Check one adapter: replay the kept cases and ``extra_cases`` first, then the random stateful phase.

    ``options`` say everything else (options.py): the profile, the seed, where cases and the example
    database go, keep_going, the time budget, the invariants ignored, K of ``full_check_every``.
    ``refine=False`` checks the safety invariants only, even for adapters that declare exact semantics.
    ``isolate`` (default): every adapter runs in its own child process, each call under ``step_timeout``
    (adapters/isolation.py); off, it runs in this process (a debugger sees it; a hang is not cut off).
    ``adapter``: a first instance already built (the dispatch builds one to read its capabilities); fresh
    ones come from ``factory``. ``progress`` sees the tally after each example.
    """
    profile, seed = options.profile, options.seed
    if options.example_db is not None and seed is None and profile.derandomize:
        seed = 0  # Hypothesis keeps no database for a derandomized run; a fixed seed is as repeatable
    if seed is None and not profile.derandomize:
        seed = random.SystemRandom().getrandbits(32)  # drawn here, so that the report names it and --seed replays it

    def explore(search: Search) -> None:
        _explore(search, seed, extra_cases, progress)

    return run_search(factory, name, options, explore, engine="hypothesis", seed=seed, adapter=adapter)


def _explore(
    search: Search, seed: int | None, extra_cases: Sequence[Case], progress: Callable[[Tally], None] | None
) -> None:
    """The search itself: the kept and given cases, then the machine in rounds; Hypothesis's failures recorded."""
    options, result, tally = search.options, search.result, search.tally
    result.given_cases = len(extra_cases)
    machine = build_machine(search.adapter, tally, search.profile.ranges, refine=options.refine)
    if progress is not None:
        machine = _with_progress(machine, tally, progress)
    machine = _with_quality(machine, search)
    # Derandomized (the ci profile, or --seed with its seed): Hypothesis's own derandomized run, rounds included;
    # the report names the seed that run draws from.
    derandomized = seed is None or (seed == derandomized_seed(machine) and options.example_db is None)
    if derandomized:
        result.seed = seed = derandomized_seed(machine)
    result.derandomized = derandomized
    database = open_example_db(options.example_db, search.name)
    kept = kept_cases(database) if database is not None else []
    result.kept_cases = len(kept)

    def fixed(case: Case) -> None:  # a kept case that fails no more: the bug it found was fixed
        if database is not None and case in kept:
            forget_case(database, case)

    try:
        if search.replay([*kept, *extra_cases], held=fixed):
            return
        hypothesis_seed = None if derandomized else seed
        if hypothesis_seed is not None:
            machine = hypothesis.seed(hypothesis_seed)(machine)
        try:
            run_in_rounds(machine, _settings(search.profile, options.max_examples, derandomized, database),
                          hypothesis_seed, tally.deadline)  # fmt: skip
        except (Violation, BaseExceptionGroup) as raised:
            if not options.keep_going or isinstance(raised, Flaky):
                raise
            search.found += _all_reported(raised)
        result.budget_spent = tally.deadline is not None and time.monotonic() >= tally.deadline
    except Flaky as exc:  # first: Hypothesis's FlakyFailure is an ExceptionGroup too
        result.status = "violated"
        result.findings.append({"kind": "flaky", "message": f"a failure did not reproduce under Hypothesis: {exc}"})
        if tally.last_failure is not None:
            config, ops, seen = tally.last_failure
            result.cases.append(str(case_of(search.name, config, ops, seen).save(options.cases_dir)))
    except (Violation, BaseExceptionGroup) as raised:
        final = _reported(raised, tally.first_invariant)
        record_failure(result, search.make, final.config or Config(), final.ops, final, options)


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


def _all_reported(raised: BaseException) -> list[Violation]:
    """Every failure Hypothesis shrank (one per invariant broken first), in the order the group lists them."""
    if isinstance(raised, Violation):
        return [raised]
    assert isinstance(raised, BaseExceptionGroup)
    violations, rest = raised.split(Violation)
    if violations is None:
        raise rest if rest is not None else raised
    return [v for v in violations.exceptions if isinstance(v, Violation)]


def _reported(raised: BaseException, first: str | None) -> Violation:
    """Of the failures Hypothesis shrank (one per invariant), the one of the invariant broken first."""
    found = _all_reported(raised)
    return next((v for v in found if v.invariant == first), found[0])


def _with_quality(machine: type, search: Search) -> type:
    """Wrap the machine so that each example's policy-quality counts add up into the search's, and its series
    gets the running figures after each example (steps checked, orphaned capacity share, evictions)."""
    quality, series, tally = search.quality, search.series, search.tally

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


def _with_progress(machine: type, tally: Tally, progress: Callable[[Tally], None]) -> type:
    """Wrap the machine so that ``progress`` sees the tally after each example's first step."""

    class WithProgress(machine):  # type: ignore[misc]
        def teardown(self) -> None:
            progress(tally)
            super().teardown()

    WithProgress.__name__ = machine.__name__
    return WithProgress


__all__ = ["run_check"]
