"""How hard to look and where results go: the profiles, and ``Options``, one object a run is given whole.

A run option is one field of :class:`Options` with its flag beside it (:func:`flag`): ``kvspec check``
(:func:`add_flags`) and the pytest plugin (``--kvspec-...``, where a flag names one) register the flags
from the fields, and build the object from what was parsed (:func:`options_from`), so the option reaches
every engine, the dispatch and the workers without being passed by name anywhere. The field's reader
(the harness, an engine) is the only other place it appears.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

from kvspec.bounds import at_least_one, step_timeout
from kvspec.case import Case
from kvspec.jsonio import folder_problem

from .example_db import ExampleDbError, ExampleDbLocation, example_db_problem, parse_example_db
from .strategies import DEFAULT_RANGES, PoolRanges


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

ENGINES = ("hypothesis", "swarm")
"""The explorers of an in-process adapter: hypothesis_engine.run_check, swarm.run_swarm."""


@dataclass(frozen=True)
class Flag:
    """How one field is set from a command line.

    ``cli``: the ``kvspec check`` flag; ``plugin``: the pytest plugin's (None: pytest users do not set it);
    ``argparse``: the keywords of ``add_argument`` (type, choices, action, metavar, help); ``value``: the
    parsed flag to the field's value (None: as parsed); ``problem``: why a parsed value cannot run (None:
    it can), said as ``kvspec: <problem>`` with exit 2 before anything runs; ``group``: the help section.
    """

    cli: str
    plugin: str | None
    argparse: Mapping[str, Any]
    value: Callable[[Any], Any] | None = None
    problem: Callable[[str, Any], str | None] | None = None
    group: str | None = None


def flag(
    cli: str,
    *,
    plugin: str | None = None,
    value: Callable[[Any], Any] | None = None,
    problem: Callable[[str, Any], str | None] | None = None,
    group: str | None = None,
    **argparse: Any,
) -> dict[str, Flag]:
    """A field's metadata: it is set by ``cli`` (and ``plugin``); ``argparse``: add_argument's keywords.
    ``field(default=..., metadata=flag("--name", help=...))``."""
    return {"flag": Flag(cli, plugin, argparse, value, problem, group)}


def _example_db(text: str | None) -> ExampleDbLocation | None:
    return None if text is None else parse_example_db(text)


def _example_db_problem(name: str, text: str | None) -> str | None:
    if text is None:
        return None
    try:
        return example_db_problem(parse_example_db(text))
    except ExampleDbError as exc:
        return str(exc)


def _profile(name: str | Profile) -> Profile:
    return name if isinstance(name, Profile) else PROFILES[name]


def _not(value: bool) -> bool:
    return not value


_LIVE = "live adapters (vllm-live)"


def _given(name: str, text: str | None) -> str | None:
    """Why a text option is given empty (an empty endpoint or URL would be read as none at all)."""
    return f"{name} is empty" if text is not None and not text.strip() else None


def _folder(name: str, path: Path | None) -> str | None:
    return None if path is None else folder_problem(path)


def _file(name: str, path: Path | None) -> str | None:
    return None if path is None else folder_problem(path.parent)


@dataclass(frozen=True)
class LiveTarget:
    """Where a live adapter finds its server (``url`` None: the kit starts its tiny one), and what it records."""

    url: str | None = field(
        default=None,
        metadata=flag(
            "--url",
            problem=_given,
            plugin="--kvspec-vllm-url",
            group=_LIVE,
            help="check this running server instead of starting the tiny one",
        ),
    )
    events: str | None = field(
        default=None,
        metadata=flag(
            "--events",
            problem=_given,
            plugin="--kvspec-vllm-events",
            group=_LIVE,
            help="its KV event PUB endpoint (e.g. ipc:///path or tcp://host:port)",
        ),
    )
    replay: str | None = field(
        default=None,
        metadata=flag(
            "--replay",
            problem=_given,
            plugin="--kvspec-vllm-replay",
            group=_LIVE,
            help="its KV event replay endpoint, to fill sequence gaps",
        ),
    )
    record: Path | None = field(
        default=None,
        metadata=flag(
            "--record", group=_LIVE, type=Path, problem=_file, metavar="FILE", help="record the run as JSON lines here"
        ),
    )
    mode: str = field(
        default="both",
        metadata=flag(
            "--mode",
            group=_LIVE,
            choices=("exact", "load", "both"),
            help="exact (sequential), load (concurrent) or both",
        ),
    )


@dataclass(frozen=True)
class Options:
    """How hard to look and where results go; the same for every adapter (live ones read ``live`` too).

    Every engine, the dispatch and the workers take it whole. A field with a :func:`flag` is a flag of
    ``kvspec check`` (and of the pytest plugin where it names one); the others are set by the gate and by
    code that calls ``check_adapter`` itself.
    """

    profile: Profile = field(
        default=PROFILES["ci"],
        metadata=flag(
            "--profile",
            plugin="--kvspec-profile",
            value=_profile,
            choices=sorted(PROFILES),
            default="ci",
            help="ci: deterministic, bounded (default)",
        ),
    )
    seed: int | None = field(
        default=None,
        metadata=flag(
            "--seed",
            plugin="--kvspec-seed",
            type=int,
            help="seed of the run (default: a drawn one, or the ci profile's derandomized one; the report names it)",
        ),
    )
    max_examples: int | None = field(
        default=None,
        metadata=flag(
            "--max-examples",
            plugin="--kvspec-max-examples",
            type=int,
            problem=at_least_one,
            help="number of random op sequences",
        ),
    )
    cases_dir: Path = field(
        default=Path(".kvspec/cases"),
        metadata=flag("--cases-dir", type=Path, problem=_folder, help="where counterexamples go"),
    )
    step_timeout: float | None = field(
        default=30.0,
        metadata=flag(
            "--step-timeout",
            plugin="--kvspec-step-timeout",
            type=float,
            problem=step_timeout,
            help="seconds before a step counts as hung",
        ),
    )
    refine: bool = field(
        default=True,
        metadata=flag(
            "--safety-only",
            value=_not,
            action="store_true",
            help="skip the refinement checks against the spec's predictions",
        ),
    )
    scenarios: bool = field(
        default=True,
        metadata=flag("--no-scenarios", value=_not, action="store_true", help="skip the bounded-model coverage cases"),
    )
    quiet: bool = field(default=True, metadata=flag("--quiet", action="store_true", help="no progress lines"))
    keep_going: bool = field(
        default=False,
        metadata=flag(
            "--keep-going",
            action="store_true",
            help="step past violations (the spec re-synchronised to the adapter) and keep exploring; report every "
            "violated invariant with its own shrunk case and the steps that broke each",
        ),
    )
    engine: str = field(
        default="hypothesis",
        metadata=flag(
            "--engine",
            choices=ENGINES,
            help="hypothesis: the state machine, shrunk by Hypothesis (default); swarm: seeded random walks, each with "
            "a drawn subset of op kinds and prompt shapes, minimised by replay (docs/swarm.md)",
        ),
    )
    example_db: ExampleDbLocation | None = field(
        default=None,
        metadata=flag(
            "--example-db",
            value=_example_db,
            problem=_example_db_problem,
            metavar="DIR_OR_URL",
            help="example database: a folder, or redis://host:port/db shared by processes and machines; failures "
            "found are kept there and replayed first by the next run (a swarm run's cases included; docs/workers.md)",
        ),
    )
    full_check_every: int | None = field(
        default=None,
        metadata=flag(
            "--full-check-every",
            plugin="--kvspec-full-check-every",
            type=int,
            problem=at_least_one,
            metavar="K",
            help="for adapters that report what a step changed: judge the whole state every K steps and at the end "
            "of each example, the changed part on the steps between (default: the profile's, 1: the whole state "
            "every step)",
        ),
    )
    live: LiveTarget = field(default_factory=LiveTarget)
    isolate: bool = True  # each adapter in its own child process, every call under step_timeout
    time_budget_s: float | None = None  # no example starts after it
    ignore: frozenset[str] = frozenset()  # invariants counted but not judged (a gate's known violations)
    given_cases: tuple[Case, ...] = ()  # replayed before anything else (saved counterexamples)

    def __post_init__(self) -> None:
        # As a user may write them: a profile's name (Options(profile="thorough")), a folder as a str.
        profile: object = self.profile  # user code: the annotations promise nothing
        if isinstance(profile, str):
            object.__setattr__(self, "profile", _profile(profile))
        object.__setattr__(self, "cases_dir", Path(self.cases_dir))


def _flagged(kind: type) -> list[tuple[str, Flag, Any]]:
    """The fields of ``kind`` that have a flag: (field name, flag, default)."""
    found = []
    for f in fields(kind):
        spec = f.metadata.get("flag")
        if spec is not None:
            found.append((f.name, spec, None if f.default is MISSING else f.default))
    return found


FLAGGED: tuple[tuple[type, str | None], ...] = ((Options, None), (LiveTarget, "live"))
"""The classes whose fields have flags, and the field of Options each fills (None: Options itself)."""


def add_flags(add: Callable[[str | None], Callable[..., Any]], which: str = "cli") -> None:
    """Register every flag of ``which`` (``cli`` or ``plugin``); ``add(group)`` gives that help section's
    ``add_argument`` (argparse's, or pytest's ``addoption``)."""
    for kind, _ in FLAGGED:
        for name, spec, default in _flagged(kind):
            flag_name = spec.cli if which == "cli" else spec.plugin
            if flag_name is None:
                continue
            kwargs = {"default": None if spec.argparse.get("action") else default, **spec.argparse}
            if spec.argparse.get("action") == "store_true":
                kwargs.pop("default")
            kwargs.setdefault("dest", f"kvspec_{name}")
            add(spec.group)(flag_name, **kwargs)


def options_from(read: Callable[[str], Any], which: str = "cli", **fixed: Any) -> Options:
    """The Options the parsed flags of ``which`` give (``read(dest)``: one parsed value), with ``fixed`` set
    whatever the flags say (the plugin's cases folder, say); raise ValueError with the flag's problem."""
    parts: dict[str | None, dict[str, Any]] = {None: {}, "live": {}}
    for kind, part in FLAGGED:
        for name, spec, _ in _flagged(kind):
            if (spec.cli if which == "cli" else spec.plugin) is None:
                continue
            raw = read(f"kvspec_{name}")
            if spec.problem is not None:
                problem = spec.problem(spec.cli if which == "cli" else str(spec.plugin), raw)
                if problem is not None:
                    raise ValueError(problem)
            parts[part][name] = spec.value(raw) if spec.value is not None else raw
    live = fixed.pop("live", None) or LiveTarget(**parts["live"])
    return Options(**{**parts[None], "live": live, **fixed})


__all__ = [
    "ENGINES",
    "PROFILES",
    "Flag",
    "Options",
    "Profile",
    "LiveTarget",
    "add_flags",
    "flag",
    "options_from",
]
