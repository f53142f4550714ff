"""A gate declared once, in the engine's repository: ``[tool.kvspec]`` in pyproject.toml, or kvspec.toml.

::

    [tool.kvspec]                         # in kvspec.toml: the same keys at the top level
    profile = "ci"                        # every key is optional; these are the defaults
    seed = 0                              # none: the profile's (ci is derandomized)
    max-examples = 200                    # none: the profile's
    time-budget = 300                     # seconds per adapter; none: no budget
    step-timeout = 30
    safety-only = false
    cases-dir = ".kvspec/cases"           # counterexamples: saved here, replayed first next run
    example-db = ".kvspec/examples"       # Hypothesis's failing examples, replayed first next run
    baseline = "kvspec-baseline.json"     # known violations; none: every violation fails
    report = ".kvspec/gate.json"
    junit = ".kvspec/gate.xml"
    summary = ".kvspec/gate.md"           # $GITHUB_STEP_SUMMARY is appended to as well when set
    html = ".kvspec/gate.html"            # none by default: one page, new violations drawn (kvspec[show])

    [[tool.kvspec.adapters]]              # at least one
    name = "tinyalloc"                    # a registered name, an entry point, or "pkg.mod:Factory"
    time-budget = 60                      # any of profile, seed, max-examples, time-budget,
                                          # step-timeout, safety-only may be set per adapter

Paths are relative to the file's folder. A file that is not valid TOML, an unknown key or a
value of the wrong type is a :class:`GateConfigError` naming the key.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvspec.stateful_tests.example_db import ExampleDbError, ExampleDbLocation, parse_example_db

CONFIG_FILES = ("kvspec.toml", "pyproject.toml")
"""Where the gate looks, in this order, in the folder it is run from."""

PROFILES = ("ci", "thorough")  # stateful_tests.PROFILES, named here so reading a config imports no runner


class GateConfigError(ValueError):
    """The gate's declaration is not usable; the message names the file and the key."""


@dataclass(frozen=True)
class AdapterRun:
    """How hard to check one adapter: the gate's defaults with this adapter's own overrides."""

    name: str
    profile: str = "ci"
    seed: int | None = None
    max_examples: int | None = None
    time_budget_s: float | None = None
    step_timeout: float = 30.0
    safety_only: bool = False


@dataclass(frozen=True)
class GateConfig:
    """Everything ``kvspec gate`` runs and where it writes; ``source``: the file it came from."""

    adapters: tuple[AdapterRun, ...]
    cases_dir: Path = Path(".kvspec/cases")
    example_db: ExampleDbLocation | None = Path(".kvspec/examples")  # a folder or a redis:// URL
    baseline: Path | None = None
    report: Path | None = Path(".kvspec/gate.json")
    junit: Path | None = Path(".kvspec/gate.xml")
    summary: Path | None = Path(".kvspec/gate.md")
    html: Path | None = None
    source: Path | None = None
    defaults: AdapterRun = field(default_factory=lambda: AdapterRun(""))


_RUN_KEYS = {
    "profile": "profile",
    "seed": "seed",
    "max-examples": "max_examples",
    "time-budget": "time_budget_s",
    "step-timeout": "step_timeout",
    "safety-only": "safety_only",
}
_PATH_KEYS = {
    "cases-dir": "cases_dir",
    "example-db": "example_db",
    "baseline": "baseline",
    "report": "report",
    "junit": "junit",
    "summary": "summary",
    "html": "html",
}


def find(folder: Path) -> Path | None:
    """The file that declares the gate in ``folder``: kvspec.toml, or a pyproject.toml with [tool.kvspec]."""
    for name in CONFIG_FILES:
        path = folder / name
        if path.is_file() and (name == "kvspec.toml" or "kvspec" in _tool(_toml(path), path)):
            return path
    return None


def _tool(data: dict[str, Any], path: Path) -> dict[str, Any]:
    """pyproject.toml's [tool] table ({} when absent); GateConfigError when ``tool`` is something else."""
    tool = data.get("tool", {})
    if not isinstance(tool, dict):
        raise GateConfigError(f"{path}: 'tool' must be a table ([tool.kvspec]), not {type(tool).__name__}")
    return tool


def load(path: Path) -> GateConfig:
    """The gate declared in ``path`` (kvspec.toml, or pyproject.toml's [tool.kvspec])."""
    data: Any = _toml(path)
    if path.name != "kvspec.toml":
        data = _tool(data, path).get("kvspec")
        if data is None:
            raise GateConfigError(f"{path}: no [tool.kvspec] section")
    if not isinstance(data, dict):
        raise GateConfigError(f"{path}: [tool.kvspec] must be a table")
    where = f"{path}: "
    unknown = set(data) - set(_RUN_KEYS) - set(_PATH_KEYS) - {"adapters"}
    if unknown:
        raise GateConfigError(f"{where}unknown key {sorted(unknown)[0]!r}")
    defaults = _run(data, AdapterRun(""), where)
    entries = data.get("adapters")
    if not isinstance(entries, list) or not entries:
        raise GateConfigError(f"{where}'adapters' must list at least one adapter ([[tool.kvspec.adapters]] name = ...)")
    adapters = []
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            entry = {"name": entry}
        here = f"{where}adapters[{i}]."
        if not isinstance(entry, dict):
            raise GateConfigError(f"{here[:-1]} must be a table or a name")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise GateConfigError(f"{here}name must be a non-empty string")
        unknown = set(entry) - set(_RUN_KEYS) - {"name"}
        if unknown:
            raise GateConfigError(f"{here}{sorted(unknown)[0]} is not a per-adapter key")
        adapters.append(_run(entry, replace(defaults, name=name), here))
    paths: dict[str, ExampleDbLocation | None] = {}
    for key, attr in _PATH_KEYS.items():
        if key in data:
            value = data[key]
            if not (isinstance(value, str) and value):  # TOML has no null: a key is a path or absent
                raise GateConfigError(f"{where}{key} must be a path")
            paths[attr] = path.parent / value
    if "example-db" in data and "://" in data["example-db"]:  # a Redis URL, not a path beside the file
        try:
            paths["example_db"] = parse_example_db(data["example-db"])
        except ExampleDbError as exc:
            raise GateConfigError(f"{where}example-db: {exc}") from None
    return GateConfig(adapters=tuple(adapters), source=path, defaults=defaults, **paths)  # type: ignore[arg-type]


def _run(table: dict[str, Any], base: AdapterRun, where: str) -> AdapterRun:
    """``base`` with the run keys ``table`` sets, each type-checked."""
    changes: dict[str, Any] = {}
    for key, attr in _RUN_KEYS.items():
        if key not in table:
            continue
        value = table[key]
        if key == "profile" and value not in PROFILES:
            raise GateConfigError(f"{where}profile must be one of {', '.join(PROFILES)}, not {value!r}")
        if key in ("seed", "max-examples") and (type(value) is not int or (key == "max-examples" and value < 1)):
            raise GateConfigError(f"{where}{key} must be {'an integer' if key == 'seed' else 'a positive integer'}")
        if key in ("time-budget", "step-timeout") and not _positive(value):
            raise GateConfigError(f"{where}{key} must be a positive number of seconds")
        if key == "safety-only" and type(value) is not bool:
            raise GateConfigError(f"{where}safety-only must be true or false")
        changes[attr] = float(value) if key in ("time-budget", "step-timeout") else value
    return replace(base, **changes)


def _positive(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and value > 0


def _toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise GateConfigError(f"{path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise GateConfigError(f"{path}: not valid TOML: {exc}") from None


__all__ = ["CONFIG_FILES", "AdapterRun", "GateConfig", "GateConfigError", "find", "load"]
