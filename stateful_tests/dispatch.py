"""One entry point for every adapter: ``check_adapter(factory, name, options) -> Report``.

Which runner an adapter needs is declared by its capabilities, read from the one
instance the run starts with: an in-process adapter (``apply``/``observe``) goes to the
Hypothesis suite (:func:`.conformance.run_check`, or with ``Options.engine`` ``swarm`` the
swarm explorer, :func:`.swarm.run_swarm`), a live one (``Capabilities.live``) to
the live-server runner (:func:`.live.run_live`). The CLI, the pytest plugin and its
fixture all come through here, so they cannot drift apart.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

from kvspec.adapter import AdapterFactory
from kvspec.adapters.isolation import IsolatedAdapter, RemoteError
from kvspec.case import Case
from kvspec.report import Report, Status, now

from .bad_inputs import bad_input_cases
from .conformance import PROFILES, Result, run_check
from .example_db import ExampleDbLocation
from .harness import Tally
from .live import LIVE_PROFILES, run_live
from .swarm import run_swarm


@dataclass(frozen=True)
class LiveTarget:
    """Where a live adapter finds its server (``url`` None: the kit starts its tiny one), and what it records."""

    url: str | None = None
    events: str | None = None
    replay: str | None = None
    record: Path | None = None
    mode: str = "both"


@dataclass(frozen=True)
class Options:
    """How hard to look and where results go; the same for every adapter (live ones read ``live`` too)."""

    profile: str = "ci"
    seed: int | None = None
    max_examples: int | None = None
    cases_dir: Path = Path(".kvspec/cases")
    step_timeout: float | None = 30.0
    refine: bool = True
    scenarios: bool = True
    quiet: bool = True
    isolate: bool = True  # each adapter in its own child process, every call under step_timeout
    example_db: ExampleDbLocation | None = None  # a folder or a Redis URL: failures kept, replayed first
    time_budget_s: float | None = None  # no example starts after it
    ignore: frozenset[str] = frozenset()  # invariants counted but not judged (a gate's known violations)
    given_cases: tuple[Case, ...] = ()  # replayed before anything else (saved counterexamples)
    keep_going: bool = False  # report each distinct violated invariant once, each with its own shrunk case
    engine: str = "hypothesis"  # in-process adapters: hypothesis (conformance.run_check) or swarm (swarm.run_swarm)
    full_check_every: int | None = None  # K: the whole state every K steps for delta adapters (None: the profile's)
    live: LiveTarget = field(default_factory=LiveTarget)


def check_adapter(factory: AdapterFactory, name: str, options: Options) -> Report:
    """Build the adapter, read its capabilities, run the suite that fits it; the report, whatever happened."""
    profile = PROFILES[options.profile]
    try:
        adapter = IsolatedAdapter(factory, options.step_timeout) if options.isolate else factory()
        live = adapter.capabilities.live
        if live:  # a live adapter drives a server from this process: it is built here, not in a child
            adapter.close()
            adapter = factory()
    except KeyboardInterrupt:
        return not_started(name, options, "interrupted", "interrupted")
    except Exception as exc:  # the adapter could not be built: the check could not run
        return not_started(name, options, "error", f"the adapter could not start: {_reason(exc)}")
    if live and options.engine != "hypothesis":
        adapter.close()
        return not_started(
            name, options, "error", f"the {options.engine} engine drives in-process adapters, not live ones"
        )
    if live:
        from kvspec.adapters.vllm_live.adapter import VllmLiveAdapter

        server = cast(VllmLiveAdapter, adapter)
        target = options.live
        server.configure(url=target.url, events=target.events, replay=target.replay, record=target.record)
        return run_live(
            server,
            profile=LIVE_PROFILES[options.profile],
            seed=options.seed,
            mode=target.mode,
            cases_dir=options.cases_dir,
            progress=None if options.quiet else _say,
        ).report()
    extra = []
    caps = adapter.capabilities
    if options.scenarios and caps.fixed_config is None:
        # The coverage-goal cases of the bounded model (committed, found by Z3) run first; only the ops the
        # adapter implements are kept. Imported here: Z3 is needed only when they are.
        from .bounded import coverage_cases

        # Then one short case per class of bad input the adapter can be given (bad_inputs.py).
        extra = coverage_cases(ops=caps.ops) + bad_input_cases(caps.ops, caps.semantics.granularity)
        extra = [case for case in extra if all(caps.allows(op) for op in case.ops)]
    extra = [*options.given_cases, *extra]
    run = run_swarm if options.engine == "swarm" else run_check
    return run(
        factory,
        name=name,
        profile=profile,
        seed=options.seed,
        max_examples=options.max_examples,
        cases_dir=options.cases_dir,
        step_timeout=options.step_timeout,
        progress=None if options.quiet else _progress(),
        refine=options.refine,
        extra_cases=extra,
        adapter=adapter,
        isolate=options.isolate,
        example_db=options.example_db,
        time_budget_s=options.time_budget_s,
        ignore=options.ignore,
        keep_going=options.keep_going,
        full_check_every=options.full_check_every,
    ).report()


def _reason(exc: Exception) -> str:
    kind = exc.type_name if isinstance(exc, RemoteError) else type(exc).__name__
    return f"{kind}: {exc}"


def not_started(name: str, options: Options, status: Status, error: str) -> Report:
    """The report of a check whose adapter could not even be built: every verdict unknown."""
    result = Result(name, "", options.profile, options.seed, now(), Tally(), status=status, error=error)
    return result.report()


def _say(line: str) -> None:
    print(f"  ... {line}", file=sys.stderr, flush=True)


def _progress() -> Callable[[Tally], None]:
    """A progress line at most every two seconds."""
    last = [time.monotonic()]

    def show(tally: Tally) -> None:
        if time.monotonic() - last[0] >= 2.0:
            last[0] = time.monotonic()
            _say(f"{tally.examples} examples, {tally.steps} steps")

    return show
