"""One entry point for every adapter: ``check_adapter(factory, name, options) -> Report``.

Which runner an adapter needs is declared by its capabilities, read from the one
instance the run starts with: an in-process adapter (``apply``/``observe``) goes to an
engine (:func:`.hypothesis_engine.run_check`, or with ``Options.engine`` ``swarm`` the
swarm explorer, :func:`.swarm.run_swarm`), a live one (``Capabilities.live``, the
:class:`~kvspec.adapter.LiveAdapter` protocol) to the live runner (:func:`.live.run_live`).
The CLI, the pytest plugin and its fixture all come through here, so they cannot drift apart.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import cast

from kvspec.adapter import Adapter, AdapterFactory, LiveAdapter
from kvspec.adapters.isolation import IsolatedAdapter, RemoteError
from kvspec.case import Case
from kvspec.report import Report

from .bad_inputs import bad_input_cases
from .findings import not_started
from .harness import Tally
from .hypothesis_engine import run_check
from .live import LIVE_PROFILES, run_live
from .options import LiveTarget, Options
from .swarm import run_swarm

ENGINES = {"hypothesis": run_check, "swarm": run_swarm}
"""The explorers of an in-process adapter, by ``Options.engine``."""


def check_adapter(factory: AdapterFactory, name: str, options: Options) -> Report:
    """Build the adapter, read its capabilities, run the suite that fits it; the report, whatever happened."""
    try:
        adapter = IsolatedAdapter(factory, options.step_timeout) if options.isolate else factory()
        live = adapter.capabilities.live
        if live:  # a live adapter drives a server from this process: it is built here, not in a child
            adapter.close()
            built: object = factory()
    except KeyboardInterrupt:
        return not_started(name, options, "interrupted", "interrupted")
    except Exception as exc:  # the adapter could not be built: the check could not run
        return not_started(name, options, "error", f"the adapter could not start: {_reason(exc)}")
    if live:
        return _check_live(built, name, options)
    given = _live_flags_given(options)
    if given:  # they would be ignored without a word
        adapter.close()
        what = "is an option" if len(given) == 1 else "are options"
        why = f"{', '.join(given)} {what} of live adapters; {name} is not one"
        return not_started(name, options, "error", why)
    scenarios = _scenario_cases(adapter) if options.scenarios else []
    extra = [*options.given_cases, *scenarios]
    progress = None if options.quiet else _progress()
    run = ENGINES[options.engine]
    return run(factory, name, options, adapter=adapter, extra_cases=extra, progress=progress).report()


def _scenario_cases(adapter: Adapter) -> list[Case]:
    """The bounded model's coverage cases (committed, found by Z3), then one short case per class of bad input
    the adapter can be given (bad_inputs.py); none for an adapter whose pool is fixed."""
    caps = adapter.capabilities
    if caps.fixed_config is not None:
        return []
    from .bounded import coverage_cases  # Z3 is needed only when they are

    cases = coverage_cases(ops=caps.ops) + bad_input_cases(caps.ops, caps.semantics.granularity)
    return [case for case in cases if all(caps.allows(op) for op in case.ops)]


def _check_live(built: object, name: str, options: Options) -> Report:
    """A live adapter through the live runner; an adapter that declares ``live`` without the protocol, or an
    engine or profile the live runner does not have, is a check that could not run."""
    problem = None
    if options.engine != "hypothesis":
        problem = f"the {options.engine} engine drives in-process adapters, not live ones"
    elif options.profile.name not in LIVE_PROFILES:
        problem = f"live adapters have the profiles {', '.join(sorted(LIVE_PROFILES))}, not {options.profile.name!r}"
    elif _missing_live(built):
        missing = ", ".join(_missing_live(built))
        problem = f"{name} declares Capabilities(live=True) but lacks the LiveAdapter protocol's {missing}"
    if problem is not None:
        close = getattr(built, "close", None)
        if callable(close):
            close()
        return not_started(name, options, "error", problem)
    server = cast(LiveAdapter, built)  # the protocol's members are all there (_missing_live)
    target = options.live
    server.configure(url=target.url, events=target.events, replay=target.replay, record=target.record)
    profile = LIVE_PROFILES[options.profile.name]
    progress = None if options.quiet else _say
    return run_live(server, profile=profile, seed=options.seed, mode=target.mode, cases_dir=options.cases_dir,
                    progress=progress).report()  # fmt: skip


_LIVE_MEMBERS = tuple(m for m in dir(LiveAdapter) if not m.startswith("_"))


def _missing_live(built: object) -> list[str]:
    """The LiveAdapter protocol's methods and properties that ``built``'s class lacks (read on the class: a property
    such as ``url`` may raise before ``start``, so ``isinstance`` on the runtime protocol cannot be used)."""
    return [m for m in _LIVE_MEMBERS if not hasattr(type(built), m)]


def _live_flags_given(options: Options) -> list[str]:
    """The live adapters' flags given other values than their defaults."""
    default = LiveTarget()
    names = {"url": "--url", "events": "--events", "replay": "--replay", "record": "--record", "mode": "--mode"}
    return [flag for field, flag in names.items() if getattr(options.live, field) != getattr(default, field)]


def _reason(exc: Exception) -> str:
    kind = exc.type_name if isinstance(exc, RemoteError) else type(exc).__name__
    return f"{kind}: {exc}"


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


__all__ = ["ENGINES", "check_adapter", "not_started"]
