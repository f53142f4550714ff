"""The ``kvspec`` command line.

One module per command group; each has ``register(subparsers)``, which adds its subcommands
and sets ``handler`` (parsed arguments -> :class:`~kvspec.report.ExitCode`) on each. A new
command is a new module here and one entry in ``GROUPS``.

Exit codes (a stable contract, :class:`kvspec.report.ExitCode`): 0 every invariant held;
1 a violation was found (the report and a case file say which); 2 the check could not be run.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from types import ModuleType

from kvspec.report import ExitCode

from . import bench, check, formal, gpu, serve, trace
from .common import interrupts

GROUPS: tuple[ModuleType, ...] = (check, gpu, formal, serve, bench, trace)
"""The command groups, in the order ``kvspec --help`` lists them."""

DESCRIPTION = "The `kvspec` command line."


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvspec", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, run the command's handler with SIGINT/SIGTERM as a clean stop; its exit code."""
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # the command as typed, for results that record it
    handler: Callable[[argparse.Namespace], int] = args.handler
    with interrupts():
        try:
            return int(handler(args))
        except KeyboardInterrupt:
            print("kvspec: interrupted", file=sys.stderr)
            return ExitCode.COULD_NOT_RUN
        except BrokenPipeError:  # the reader of stdout went away (``| head``): no traceback at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return ExitCode.COULD_NOT_RUN


__all__ = ["GROUPS", "build_parser", "main"]
