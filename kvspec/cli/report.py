"""``kvspec report merge``: reports of one kind of check merged into one (kvspec/report_merge.py).

The checkers of a fleet (one ``kvspec trace check`` or live check per serving instance) or the
runs of several machines each write a report; merged, they are one verdict table with every
part's violations and cases, and one exit code by the report contract (docs/workers.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .common import fail, unreadable, unwritable


def register(sub: Any) -> None:
    """Add ``report merge`` to the ``kvspec`` subcommands."""
    report = sub.add_parser("report", help="work with kvspec report files")
    actions = report.add_subparsers(dest="report_command", required=True)
    merge = actions.add_parser(
        "merge",
        help="merge reports into one: steps summed, every part's violations and cases, one exit code",
        description="Merge kvspec reports (JSON) into one; exit 1 if any part found a violation, else 2 if any "
        "could not run, else 0.",
    )
    merge.add_argument("reports", type=Path, nargs="+", help="report files (kvspec/schemas/report.schema.json)")
    merge.add_argument("-o", "--out", type=Path, default=None, help="write the merged report here")
    merge.add_argument("--junit", type=Path, default=None, help="write its JUnit XML here")
    merge.set_defaults(handler=cmd_merge)


def cmd_merge(args: argparse.Namespace) -> int:
    """Read, check against the schema, merge; print the table; the merged report's exit code."""
    from kvspec import jsonio
    from kvspec.report import report_problems
    from kvspec.report_merge import merge_reports, report_from_json

    problem = unwritable(args.out, args.junit)
    if problem is not None:
        return fail(problem)
    parts = []
    for path in args.reports:
        try:
            data = jsonio.load(path)
        except (OSError, ValueError) as exc:
            return fail(unreadable(path, exc))
        problems = report_problems(data)
        if problems:
            return fail(f"{path}: not a kvspec report: {' '.join(problems[0].split())}")
        parts.append(report_from_json(data))
    report = merge_reports(parts, title=f"kvspec report merge: {len(parts)} reports")
    report.write(args.out, args.junit)
    print(report.table())
    return report.exit_code
