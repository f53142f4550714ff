"""``kvspec gate`` and ``kvspec baseline add``: the CI conformance gate declared in the engine's repository."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvspec.bounds import positive, step_timeout
from kvspec.report import ExitCode

from .common import fail, unreadable, unwritable

DEFAULT_BASELINE = Path("kvspec-baseline.json")


def register(sub: Any) -> None:
    """Add gate and baseline to the ``kvspec`` subcommands."""
    gate = sub.add_parser(
        "gate",
        help="check every adapter declared in [tool.kvspec] (pyproject.toml) or kvspec.toml, against the baseline",
    )
    gate.add_argument(
        "--config", type=Path, default=None, help="the declaring file (default: kvspec.toml or pyproject.toml here)"
    )
    gate.add_argument("--adapter", action="append", default=None, help="check this adapter instead (repeatable)")
    gate.add_argument("--profile", choices=("ci", "thorough"), default=None)
    gate.add_argument("--seed", type=int, default=None)
    gate.add_argument("--max-examples", type=int, default=None)
    gate.add_argument("--time-budget", type=float, default=None, help="seconds per adapter; no example starts after it")
    gate.add_argument("--step-timeout", type=float, default=None)
    gate.add_argument("--safety-only", action="store_true", default=None)
    gate.add_argument("--baseline", type=Path, default=None, help="known violations (kvspec baseline add writes them)")
    gate.add_argument("--cases-dir", type=Path, default=None)
    gate.add_argument(
        "--example-db",
        default=None,
        metavar="DIR_OR_URL",
        help="example database: a folder, or redis://host:port/db shared by processes and machines",
    )
    gate.add_argument("--no-example-db", action="store_true", help="keep no example database")
    gate.add_argument("--report", type=Path, default=None, help="the gate's JSON (kvspec/schemas/gate.schema.json)")
    gate.add_argument("--junit", type=Path, default=None)
    gate.add_argument(
        "--summary", type=Path, default=None, help="Markdown summary (also appended to $GITHUB_STEP_SUMMARY)"
    )
    gate.add_argument(
        "--html", type=Path, default=None, help="one self-contained page, each new violation drawn (kvspec[show])"
    )
    gate.set_defaults(handler=cmd_gate)

    baseline = sub.add_parser("baseline", help="manage the known violations a gate tolerates")
    actions = baseline.add_subparsers(dest="action", required=True)
    add = actions.add_parser("add", help="add saved cases to the baseline as known violations")
    add.add_argument("cases", type=Path, nargs="+", help="case files (kvspec check saves them)")
    add.add_argument("--reason", required=True, help="why it is tolerated (a bug report, a release range)")
    add.add_argument(
        "--baseline", type=Path, default=None, help=f"the file (default: the gate's, else {DEFAULT_BASELINE})"
    )
    add.add_argument("--adapter", default=None, help="the adapter it applies to (default: the case's)")
    add.add_argument("--versions", default="", help="the releases it applies to, a version specifier: '>=0.10.2,<0.24'")
    add.set_defaults(handler=cmd_baseline_add)


def _config(args: argparse.Namespace) -> Any:
    """The gate as declared, with the command line's overrides; GateConfigError when it is not usable."""
    from kvspec.gate import AdapterRun, GateConfig, GateConfigError
    from kvspec.gate import config as declared
    from kvspec.stateful_tests.example_db import parse_example_db

    path = args.config or declared.find(Path.cwd())
    if path is None and not args.adapter:
        raise GateConfigError(
            "no [tool.kvspec] in pyproject.toml and no kvspec.toml here (docs/ci.md); or give --adapter"
        )
    config = declared.load(path) if path is not None else GateConfig(adapters=(AdapterRun("reference"),))
    overrides = {
        attr: value
        for attr, value in (
            ("profile", args.profile),
            ("seed", args.seed),
            ("max_examples", args.max_examples),
            ("time_budget_s", args.time_budget),
            ("step_timeout", args.step_timeout),
            ("safety_only", args.safety_only),
        )
        if value is not None
    }
    if args.adapter:  # these adapters instead of the declared ones, with the declared defaults
        runs = [replace(config.defaults, name=name, **overrides) for name in args.adapter]
    else:
        runs = [replace(run, **overrides) for run in config.adapters]
    paths: dict[str, Any] = {
        attr: value
        for attr, value in (
            ("baseline", args.baseline),
            ("cases_dir", args.cases_dir),
            ("example_db", None if args.example_db is None else parse_example_db(args.example_db)),
            ("report", args.report),
            ("junit", args.junit),
            ("summary", args.summary),
            ("html", args.html),
        )
        if value is not None
    }
    if args.no_example_db:
        paths["example_db"] = None
    return replace(config, adapters=tuple(runs), **paths)


def _bad_options(args: argparse.Namespace) -> str | None:
    if args.max_examples is not None and args.max_examples < 1:
        return f"--max-examples must be at least 1, not {args.max_examples}"
    if any(not name.strip() for name in args.adapter or ()):
        return "--adapter names an adapter (kvspec adapters) or a module:Class, not an empty string"
    return step_timeout("--step-timeout", args.step_timeout) or positive("--time-budget", args.time_budget)


def cmd_gate(args: argparse.Namespace) -> int:
    """Run the gate; write its JSON, JUnit and summary; one status line; exit 0, 1 or 2."""
    from kvspec.gate import Baseline, GateConfigError, run_gate, write_outputs
    from kvspec.stateful_tests.example_db import ExampleDbError, example_db_problem

    problem = _bad_options(args)
    if problem is not None:
        return fail(problem)
    try:
        config = _config(args)
    except (GateConfigError, ExampleDbError) as exc:
        return fail(str(exc))
    problem = unwritable(config.report, config.junit, config.summary, config.html)
    if problem is None:
        problem = example_db_problem(config.example_db)
    if problem is None and config.html is not None:
        from kvspec.show import matplotlib_missing

        problem = matplotlib_missing()
    if problem is not None:
        return fail(problem)
    try:
        baseline = Baseline.load(config.baseline) if config.baseline is not None else Baseline()
    except (OSError, ValueError) as exc:
        return fail(unreadable(config.baseline, exc))
    result = run_gate(config, baseline)
    for verdict in result.verdicts:
        print(verdict.report.table(), end="\n\n")
    write_outputs(result, config, os.environ.get("GITHUB_STEP_SUMMARY"))
    could_not_run = result.exit_code == ExitCode.COULD_NOT_RUN  # then its one line goes to stderr, as every exit 2
    print(result.status_line(), file=sys.stderr if could_not_run else sys.stdout)
    return result.exit_code


def cmd_baseline_add(args: argparse.Namespace) -> int:
    """Add each case as a known violation (once per adapter and fingerprint); write the baseline atomically."""
    from kvspec.case import Case
    from kvspec.gate import Baseline, Entry, GateConfigError
    from kvspec.gate import config as declared

    if args.versions and not args.versions.strip():  # given, but blank: not the default "every release"
        return fail("--versions is blank: give a version specifier such as '>=0.10.2,<0.24', or leave it out")
    path = args.baseline
    if path is None:
        try:
            found = declared.find(Path.cwd())
            path = (declared.load(found).baseline if found is not None else None) or DEFAULT_BASELINE
        except GateConfigError as exc:
            return fail(str(exc))
    problem = unwritable(path)
    if problem is not None:
        return fail(problem)
    try:
        baseline = Baseline.load(path)
    except (OSError, ValueError) as exc:
        return fail(unreadable(path, exc))
    for case_path in args.cases:
        try:
            entry = Entry.from_case(Case.load(case_path), args.reason, adapter=args.adapter, versions=args.versions)
        except (OSError, ValueError) as exc:
            return fail(unreadable(case_path, exc))
        added = baseline.add(entry)
        what = "added" if added else "already there"
        print(f"{what}: {entry.adapter} {entry.invariant} (fingerprint {entry.fingerprint})")
    baseline.save(path)
    print(f"baseline: {path} ({len(baseline.entries)} entries)")
    return 0
