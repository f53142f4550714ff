"""The ``kvspec`` command line.

One module per command group; each has ``register(subparsers)``, which adds its subcommands
and sets ``handler`` (parsed arguments -> :class:`~kvspec.report.ExitCode`) on each, and, where
the command writes a report, ``on_interrupt`` (parsed arguments -> None: write what an
interrupted run has). A new command is a new module here and one entry in ``GROUPS``, which
names the commands it registers: a command line imports only the module of its own command
(``kvspec trace check`` does not pay for the imports of ``kvspec check``, about 0.5 s), and
``kvspec --help`` or an unknown command all of them.

Exit codes (a stable contract, :class:`kvspec.report.ExitCode`): 0 every invariant held;
1 a violation was found (the report and a case file say which); 2 the check could not be run.

Signals: :func:`main` installs its SIGINT/SIGTERM handling before it imports anything slow
(this module imports only the standard library), and keeps both signals blocked until the
command line is parsed, so an interrupt at any moment of a run reaches a command that knows
where its report goes.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Callable
from typing import NoReturn

GROUPS: dict[str, tuple[str, ...]] = {
    "check": ("check", "replay", "adapters"),
    "show": ("show",),
    "gate": ("gate", "baseline"),
    "gpu": ("gpu-check",),
    "formal": ("bmc", "prove", "explore", "scenarios", "crosshair"),
    "serve": ("serve-tiny",),
    "bench": ("bench",),
    "trace": ("trace",),
    "report": ("report",),
}
"""The command group modules, in the order ``kvspec --help`` lists them, each with the commands it registers
(tests/test_cli_commands.py holds each module to its entry)."""

DESCRIPTION = "The `kvspec` command line."
COULD_NOT_RUN = 2  # kvspec.report.ExitCode.COULD_NOT_RUN, before anything is imported


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage error is one line (exit 2, as every error of the kit), naming ``--help``."""

    def error(self, message: str) -> NoReturn:
        self.exit(COULD_NOT_RUN, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command; of only the group that registers ``command`` where one does."""
    parser = _Parser(prog="kvspec", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    groups = [group for group, commands in GROUPS.items() if command in commands] or list(GROUPS)
    for group in groups:
        importlib.import_module(f"{__name__}.{group}").register(sub)
    return parser


def main(argv: list[str] | None = None, *, started_mask: set[int] | None = None, for_good: bool = False) -> int:
    """Parse ``argv``, run the command's handler with SIGINT/SIGTERM as a clean stop; its exit code.

    ``started_mask``: the signal mask before the console script held SIGINT and SIGTERM back (kvspec.console);
    ``for_good``: the process ends after this call, so the handlers are never restored: a signal from then on
    exits at once with the command's code (common.interrupts).
    """
    from .common import block_signals, finished, interrupts, restore_signals

    with interrupts(for_good=for_good):
        held = block_signals()  # an interrupt now is handled once the command knows where its report goes
        if started_mask is not None:
            held = started_mask
        try:
            typed = sys.argv[1:] if argv is None else argv
            args = build_parser(typed[0] if typed else None).parse_args(typed)
        except BaseException as exc:  # --help or a usage error (SystemExit, argparse's own code), or an interrupt
            if isinstance(exc, SystemExit):
                finished(exc.code if isinstance(exc.code, int) else COULD_NOT_RUN)
            with contextlib.suppress(KeyboardInterrupt):
                restore_signals(held)
            raise
        args.argv = list(typed)  # the command as typed, for results that record it
        code = _run(args, held)
        finished(code)
        return code


def _run(args: argparse.Namespace, held: set[int] | None) -> int:
    """The command's handler, signals delivered from its first line; an interrupt writes what the run has."""
    from .common import restore_signals

    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        restore_signals(held)
        return int(handler(args))
    except KeyboardInterrupt:
        from kvspec import stop

        stop.clear()
        print("kvspec: interrupted", file=sys.stderr)
        on_interrupt: Callable[[argparse.Namespace], None] | None = getattr(args, "on_interrupt", None)
        if on_interrupt is not None:
            on_interrupt(args)
        return COULD_NOT_RUN
    except BrokenPipeError:  # the reader of stdout went away (``| head``): no traceback at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return COULD_NOT_RUN


__all__ = ["GROUPS", "build_parser", "main"]
