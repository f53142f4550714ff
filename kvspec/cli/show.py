"""``kvspec show``: a case replayed and drawn as a block timeline (SVG, PNG, or a self-contained HTML page)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvspec.bounds import step_timeout
from kvspec.report import ExitCode

from .common import fail, unreadable, unwritable

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kvspec.spec import Op, Semantics


def register(sub: Any) -> None:
    """Add show to the ``kvspec`` subcommands."""
    show = sub.add_parser(
        "show",
        help="draw a case as a block timeline: the spec's replay, and the adapter's below it",
        description="Replay a case on the spec (and on --adapter) and draw objects (rows) over ops (columns).",
    )
    show.add_argument("case", type=Path)
    show.add_argument(
        "--adapter", default=None, help="also replay on this adapter and mark where it and the spec differ"
    )
    show.add_argument("--out", type=Path, required=True, help="where to draw it: a .svg, .png or .html file")
    show.add_argument("--step-timeout", type=float, default=30.0, help="seconds before a step counts as hung")
    show.add_argument("--safety-only", action="store_true", help="judge the adapter without the refinement checks")
    show.set_defaults(handler=cmd_show)


def cmd_show(args: argparse.Namespace) -> int:
    """Replay and draw; exit 0 once the picture is written (the verdict is in it and on stdout), 2 if it cannot be."""
    from kvspec.show import FORMATS, matplotlib_missing

    if args.out.suffix.lstrip(".") not in FORMATS:
        return fail(f"{args.out}: --out must end in {', '.join('.' + f for f in FORMATS)}")
    problem = step_timeout("--step-timeout", args.step_timeout) or unwritable(args.out) or matplotlib_missing()
    if problem is not None:
        return fail(problem)
    from kvspec.adapters import AdapterLoadError, load
    from kvspec.case import Case
    from kvspec.show import draw, replay, timelines, verdict, write_case
    from kvspec.show.draw import op_label
    from kvspec.show.timeline import case_window, window

    try:
        case = Case.load(args.case)
    except (OSError, ValueError) as exc:
        return fail(unreadable(args.case, exc))
    refine, timeout = not args.safety_only, args.step_timeout
    if args.adapter is None:  # the spec alone, under the semantics the case's own adapter declares (or the default)
        runs = replay(case, None, default=_declared(case.adapter, timeout))
    else:
        try:
            factory = load(args.adapter)
        except AdapterLoadError as exc:
            return fail(str(exc))
        try:
            runs = replay(case, factory, refine=refine, step_timeout=timeout)
        except Exception as exc:  # built in its child: the adapter's own error, not the kit's
            return fail(f"adapter {args.adapter!r} could not start: {exc}")
    pool = case.config
    title = f"{args.case.name}: {len(case.ops)} ops, a pool of {pool.capacity} blocks of {pool.block_size} tokens"
    grids = timelines(runs)
    labels: Sequence[Op] | Sequence[str] = case.ops
    steps = [run.broken.step for run in runs if run.broken is not None]
    start, stop = case_window(len(case.ops), min(steps, default=None))
    if (start, stop) != (0, len(case.ops)):  # a long case: the ops up to its first violation, or its last ones
        grids = window(grids, start, stop)
        labels = [op_label(start + i, op, None) for i, op in enumerate(case.ops[start:stop])]
        title += f"; ops {start} to {stop - 1} drawn"
    write_case(args.out, args.case.name, runs, draw(grids, labels, title=title))
    print(verdict(runs))
    print(f"drawn: {args.out}")
    return ExitCode.DONE


def _declared(name: str, step_timeout: float) -> Semantics:
    """The semantics adapter ``name`` declares, or the spec's default when it cannot be loaded here."""
    from kvspec.adapters import load
    from kvspec.show import semantics_of
    from kvspec.spec import Semantics

    try:
        return semantics_of(load(name), step_timeout)[1]
    except Exception:
        return Semantics()
