"""The formal subcommands of ``kvspec``: bmc, prove, explore, scenarios, crosshair.

Exit codes: 0 held or proved, 1 a counterexample was found, 2 the check could not run or
could not decide within its limits (never read that as a pass).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvspec import stop
from kvspec.bounds import at_least_one, at_most, first_problem, positive, step_timeout
from kvspec.jsonio import folder_problem
from kvspec.report import ExitCode, now

from .common import fail, unwritable

if TYPE_CHECKING:
    from kvspec.spec.formal.symbolic import Encoding


MAX_BMC_DEPTH = 64
"""``kvspec bmc --depth``: each depth is one bit-blasted query over the whole path (depth 9 of 4 blocks already
takes minutes here)."""
MAX_K = 16
"""``kvspec prove --max-k``: the induction's path grows with k as BMC's does; the committed proofs need k <= 2."""
_SECONDS = ("time_limit", "time_per_goal", "per_condition_timeout", "budget")


def _out_of_bounds(args: argparse.Namespace) -> str | None:
    """Why a numeric option of a formal command is out of its bounds (in the words of kvspec.bounds), or None:
    judged before any work starts, so a value that would check nothing or never end is exit 2."""
    given = [dest for dest in _SECONDS if hasattr(args, dest)]
    problems = [positive("--" + dest.replace("_", "-"), getattr(args, dest)) for dest in given]
    if hasattr(args, "step_timeout"):
        problems.append(step_timeout("--step-timeout", args.step_timeout))
    if args.command == "bmc":
        problems.append(at_most("--depth", args.depth, MAX_BMC_DEPTH, "one query over the whole path per depth"))
    elif hasattr(args, "depth"):
        problems.append(at_least_one("--depth", args.depth))
    if hasattr(args, "max_k"):
        problems.append(at_most("--max-k", args.max_k, MAX_K, "the induction's path grows with k"))
    if getattr(args, "variant", None) == "" or getattr(args, "adapter", None) == "":
        problems.append("--variant and --adapter name a module:Class or an adapter, not an empty string")
    for dest in ("cases_dir", "out"):  # where the counterexamples or the scenarios go, known before the search
        if getattr(args, dest, None) is not None:
            problems.append(folder_problem(getattr(args, dest)))
    return first_problem(*problems)


def _bounds_args(parser: argparse.ArgumentParser, blocks: int = 4) -> None:
    parser.add_argument("--blocks", type=int, default=blocks, help=f"pool size N in blocks (default {blocks})")
    parser.add_argument("--requests", type=int, default=2, help="number of requests R, named r0.. (default 2)")
    parser.add_argument("--block-size", type=int, default=2, help="tokens per block B (default 2)")
    parser.add_argument("--alphabet", type=int, default=2, help="token ids 0..A-1 (default 2)")
    parser.add_argument("--max-append", type=int, default=0, help="tokens per append (default B + 1)")


def _report_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--report", type=Path, default=None, help="write the JSON report (as kvspec check) here")
    parser.add_argument("--junit", type=Path, default=None, help="write JUnit XML here")


def register(subparsers: Any) -> None:
    """Add bmc, prove, scenarios and crosshair to the `kvspec` subcommands."""
    bmc = subparsers.add_parser("bmc", help="bounded model checking of the spec's Z3 encoding")
    _bounds_args(bmc)
    bmc.add_argument("--depth", type=int, default=4, help="check every op sequence of up to K ops (default 4)")
    bmc.add_argument("--time-limit", type=float, default=None, help="stop after this many seconds")
    bmc.add_argument("--invariant", action="append", default=None, help="check only this invariant (repeatable)")
    bmc.add_argument(
        "--variant",
        default=None,
        metavar="MODULE:CLASS",
        help="check a variant of the spec's encoding: a subclass of kvspec.spec.formal.symbolic.Encoding, "
        "e.g. a model of your allocator's change",
    )
    bmc.add_argument("--lemmas", action="store_true", help="assume the auxiliary invariants proved inductive")
    bmc.add_argument("--cases-dir", type=Path, default=Path(".kvspec/cases"), help="where a counterexample goes")
    bmc.add_argument("--quiet", action="store_true", help="no per-depth progress lines")
    _report_args(bmc)
    bmc.set_defaults(handler=cmd_bmc, on_interrupt=formal_interrupted)

    prove = subparsers.add_parser("prove", help="prove the invariants by k-induction (and the score properties)")
    _bounds_args(prove)
    prove.add_argument("--max-k", type=int, default=2, help="try plain k-induction up to this k (default 2)")
    prove.add_argument("--invariant", action="append", default=None, help="prove only this invariant (repeatable)")
    prove.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="give up after this many seconds (--engine pdr: per invariant, a hard wall-clock stop, default 60)",
    )
    prove.add_argument(
        "--engine",
        choices=("k-induction", "pdr"),
        default="k-induction",
        help="k-induction with the auxiliary invariants (default), or pdr: Z3's Spacer, nothing assumed",
    )
    prove.add_argument(
        "--variant",
        default=None,
        metavar="MODULE:CLASS",
        help="--engine pdr: prove (or refute) on a variant of the spec's encoding, as kvspec bmc --variant",
    )
    prove.add_argument(
        "--direction",
        choices=("forward", "backward"),
        default="forward",
        help="--engine pdr: Spacer over the reachable states (forward, default) or over the states that can "
        "reach a violation (backward: searches from the empty pool, finds violations sooner)",
    )
    prove.add_argument(
        "--lemmas",
        action="store_true",
        help="--engine pdr: give Spacer the auxiliary invariants that are inductive (found first, as kvspec bmc "
        "--lemmas does); the checked invariant then includes them",
    )
    prove.add_argument("--cases-dir", type=Path, default=Path(".kvspec/cases"), help="where a counterexample goes")
    _report_args(prove)
    prove.set_defaults(handler=cmd_prove, on_interrupt=formal_interrupted)

    explore = subparsers.add_parser("explore", help="breadth-first search of every reachable state of the spec")
    _bounds_args(explore)
    explore.add_argument("--depth", type=int, default=100, help="at most this many ops from the empty pool")
    explore.add_argument("--time-limit", type=float, default=None, help="stop after this many seconds")
    explore.add_argument(
        "--adapter", default=None, help="also drive this adapter (name or pkg.module:Factory) through every state"
    )
    explore.add_argument("--step-timeout", type=float, default=30.0, help="seconds before an adapter step hangs")
    explore.add_argument("--no-symmetry", action="store_true", help="no reduction by renaming requests, blocks, tokens")
    explore.add_argument("--cases-dir", type=Path, default=Path(".kvspec/cases"), help="where a counterexample goes")
    explore.add_argument("--quiet", action="store_true", help="no per-depth progress lines")
    _report_args(explore)
    explore.set_defaults(handler=cmd_explore, on_interrupt=formal_interrupted)

    scen = subparsers.add_parser("scenarios", help="find the shortest op sequence to each coverage goal")
    _bounds_args(scen)
    scen.add_argument("--depth", type=int, default=8, help="longest sequence searched (default 8)")
    scen.add_argument("--out", type=Path, default=None, help="folder (default: the bundled scenarios folder)")
    scen.add_argument("--case-files", action="store_true", help="also write one replayable case file per goal")
    scen.add_argument("--time-per-goal", type=float, default=60.0, help="seconds per goal (default 60)")
    scen.set_defaults(handler=cmd_scenarios)

    ch = subparsers.add_parser("crosshair", help="check the reference simulators' contracts with CrossHair")
    ch.add_argument("targets", nargs="*", help="modules, classes or files (default: the reference package)")
    ch.add_argument("--per-condition-timeout", type=float, default=2.0, help="seconds per contract (default 2)")
    ch.add_argument("--budget", type=float, default=600.0, help="total seconds before giving up (default 600)")
    ch.set_defaults(handler=cmd_crosshair)


def formal_interrupted(args: argparse.Namespace) -> None:
    """Ctrl-C before the command had a report of its own (while it imported Z3, say): an interrupted report."""
    if args.report is None and args.junit is None:
        return
    from kvspec.report import Report
    from kvspec.stateful_tests.formal_reports import SPEC

    report = Report(adapter=SPEC, rows=[], profile=args.command, status="interrupted")
    report.error = "interrupted before anything was decided"
    report.write(args.report, args.junit)


def _bounds(args: argparse.Namespace) -> Any:
    from kvspec.spec.formal.symbolic import Bounds

    return Bounds(args.blocks, args.requests, args.block_size, args.alphabet, args.max_append)


def _variant(path: str) -> type[Encoding]:
    """The subclass of the spec's Encoding that ``path`` ('module:Class') names; ValueError, in one line, if none."""
    from kvspec.dotted import DottedPathError, import_object
    from kvspec.spec.formal.symbolic import Encoding

    try:
        variant = import_object(path, "module:Class")
    except DottedPathError as exc:
        raise ValueError(str(exc)) from exc
    if not (isinstance(variant, type) and issubclass(variant, Encoding)):
        raise ValueError(f"{path!r} is not a subclass of kvspec.spec.formal.symbolic.Encoding")
    return variant


def cmd_bmc(args: argparse.Namespace) -> int:
    from kvspec.spec.formal.bmc import bmc
    from kvspec.spec.formal.symbolic_invariants import SAFETY
    from kvspec.stateful_tests.formal_reports import bmc_report, save_counterexample

    problem = _out_of_bounds(args) or unwritable(args.report, args.junit)
    if problem is not None:
        return fail(problem)
    started = now()
    try:
        bounds = _bounds(args)
        variant = _variant(args.variant) if args.variant else None
        progress = None if args.quiet else (lambda k, t: print(f"  depth {k}: held ({t:.1f} s)", flush=True))
        what = f"N={bounds.blocks} blocks, R={bounds.requests} requests, B={bounds.block_size}, A={bounds.alphabet}"
        checked = f"variant {args.variant}" if args.variant else "the spec"
        print(f"bounded model checking {checked}: {what}, depth {args.depth}")
        result = bmc(
            bounds,
            args.depth,
            variant=variant,
            invariants=args.invariant,
            time_limit=args.time_limit,
            lemmas=args.lemmas,
            progress=progress,
        )
    except ValueError as exc:
        return fail(str(exc))
    if result.lemmas is not None:
        lem = result.lemmas
        print(f"  (assumed {len(lem.conjuncts)} auxiliary conjuncts, proved inductive first in {lem.seconds:.1f} s)")
    cex = result.counterexample
    if cex is None:
        report = bmc_report(result, started_at=started, invariants=args.invariant, variant=args.variant)
        report.write(args.report, args.junit)
        if not result.complete:
            why = "interrupted" if result.interrupted else "time limit reached"
            print(f"holds up to {result.depth} (of {args.depth} requested) in {result.seconds:.1f} s: {why}")
            return report.exit_code
        print(f"holds up to {result.depth} ({result.seconds:.1f} s)")
        return report.exit_code
    first = next(n for n in SAFETY if n in cex.invariants)
    print(f"COUNTEREXAMPLE at depth {len(cex.ops)} ({result.seconds:.1f} s): {', '.join(cex.invariants)}")
    for i, op in enumerate(cex.ops):
        print(f"  {i:>3}. {op}")
    path = save_counterexample(
        "bmc", bounds, cex.ops, cex.invariants, cex.step, args.cases_dir, invariant=first, variant=args.variant
    )
    print(f"case saved: {path}  (replay: kvspec replay {path} --adapter NAME)")
    report = bmc_report(result, started_at=started, invariants=args.invariant, variant=args.variant, cases=[str(path)])
    report.write(args.report, args.junit)
    return report.exit_code


def cmd_prove(args: argparse.Namespace) -> int:
    from kvspec.spec.formal.bmc import Proof, prove
    from kvspec.spec.formal.parametric import check_refinement, prove_every_n
    from kvspec.spec.formal.score_proofs import check_score, spec_score
    from kvspec.spec.formal.symbolic_invariants import AUXILIARY
    from kvspec.stateful_tests.formal_reports import interrupted_report, prove_report

    problem = _out_of_bounds(args) or unwritable(args.report, args.junit)
    if problem is not None:
        return fail(problem)
    if args.engine == "pdr":
        return _prove_pdr(args)
    if args.variant is not None or args.direction != "forward" or args.lemmas:
        return fail("--variant, --direction and --lemmas are options of --engine pdr")
    started, t0 = now(), time.monotonic()
    try:
        bounds = _bounds(args)

        decided: list[Proof] = []

        def show(p: Proof) -> None:
            decided.append(p)
            if p.proved:
                how = "alone" if not p.strengthened else "with the auxiliary invariants"
                verdict = f"proved: {p.k}-inductive {how}"
            else:
                verdict = "VIOLATED" if p.counterexample is not None else p.note
            print(f"  {p.invariant:<30} {verdict:<58} {p.seconds:6.1f} s", flush=True)

        print(f"k-induction, N={bounds.blocks} blocks, R={bounds.requests} requests, B={bounds.block_size}:")
        aux, proofs = prove(bounds, args.invariant, max_k=args.max_k, time_limit=args.time_limit, progress=show)
    except ValueError as exc:
        return fail(str(exc))
    except KeyboardInterrupt:  # the invariants decided so far stand; the rest were not
        stop.clear()
        report = interrupted_report(bounds, decided, started_at=started, seconds=time.monotonic() - t0)
        report.write(args.report, args.junit)
        print(f"interrupted: {len(decided)} invariants decided", file=sys.stderr)
        return report.exit_code
    state = "1-inductive" if aux.proved else f"NOT inductive ({', '.join(aux.failing)})"
    print(f"  auxiliary invariants ({', '.join(AUXILIARY)}): {state}, {aux.seconds:.1f} s")
    every = prove_every_n()
    refinement = check_refinement(bounds, time_limit=args.time_limit)
    print("every pool size N:")
    print(
        f"  capacity conservation of the counting abstraction: {'proved' if every.proved else 'NOT proved'}"
        f" ({every.seconds:.2f} s)"
    )
    print(
        f"  the bounded encoding refines the abstraction at N={bounds.blocks}: "
        f"{'proved' if refinement.holds else refinement.answer} ({refinement.seconds:.1f} s)"
    )
    scores = check_score(spec_score)
    print("retention score, for all reals:")
    for r in scores:
        print(f"  {r.prop:<30} {'proved' if r.proved else 'COUNTEREXAMPLE ' + str(r.counterexample)}")
    report = prove_report(
        bounds, aux, proofs, every, refinement, scores, started_at=started, seconds=time.monotonic() - t0
    )
    report.write(args.report, args.junit)
    return report.exit_code


def _prove_pdr(args: argparse.Namespace) -> int:
    from kvspec.spec.formal.pdr import PdrProof, prove_pdr
    from kvspec.stateful_tests.formal_reports import pdr_report, save_counterexample

    started = now()
    limit = 60.0 if args.time_limit is None else args.time_limit
    decided: list[PdrProof] = []

    def show(p: PdrProof) -> None:
        decided.append(p)
        verdict = {"proved": "proved", "violated": "VIOLATED"}.get(p.verdict, "unknown")
        if p.timed_out:
            verdict += " (time limit)"
        if p.verdict == "proved":
            verdict += ", inductive invariant checked" if p.checked else ", NOT confirmed by the independent check"
        given = f"  ({p.assumed} auxiliary conjuncts assumed)" if p.assumed else ""
        print(f"  {p.invariant:<30} {verdict:<48} {p.seconds:6.1f} s  {p.note}{given}", flush=True)
        if p.inductive is not None:
            print(f"    inductive invariant: {' '.join(str(p.inductive).split())}")
        if p.counterexample is not None:
            for i, op in enumerate(p.counterexample.ops):
                print(f"  {i:>5}. {op}")

    try:
        bounds = _bounds(args)
    except ValueError as exc:
        return fail(str(exc))
    try:
        variant = _variant(args.variant) if args.variant else None
        with_lemmas = ", with the auxiliary invariants that are inductive" if args.lemmas else ""
        print(
            f"PDR (Z3 Spacer, {args.direction}{with_lemmas}), N={bounds.blocks} blocks, R={bounds.requests} requests, "
            f"B={bounds.block_size}, {limit:g} s per invariant:"
        )
        proofs = prove_pdr(
            bounds,
            args.invariant,
            variant=variant,
            time_limit=limit,
            direction=args.direction,
            lemmas=args.lemmas,
            progress=show,
        )
    except ValueError as exc:
        return fail(str(exc))
    except KeyboardInterrupt:  # the invariants decided so far stand
        stop.clear()
        report = pdr_report(bounds, decided, started_at=started, time_limit=limit, direction=args.direction)
        report.status, report.error = "interrupted", f"interrupted: {len(decided)} invariants decided"
        report.write(args.report, args.junit)
        print(f"interrupted: {len(decided)} invariants decided", file=sys.stderr)
        return report.exit_code
    cases = []
    for p in proofs:
        if p.counterexample is not None:
            cex = p.counterexample
            path = save_counterexample(
                "pdr",
                bounds,
                cex.ops,
                cex.invariants,
                cex.step,
                args.cases_dir,
                invariant=p.invariant,
                variant=args.variant,
            )
            print(f"case saved: {path}  (replay: kvspec replay {path} --adapter NAME)")
            cases.append(str(path))
    report = pdr_report(bounds, proofs, started_at=started, time_limit=limit, direction=args.direction, cases=cases)
    report.write(args.report, args.junit)
    return report.exit_code


def cmd_explore(args: argparse.Namespace) -> int:
    from kvspec.adapters import AdapterLoadError, load
    from kvspec.adapters.isolation import IsolatedAdapter
    from kvspec.spec.formal.explore import explore
    from kvspec.spec.formal.symbolic import SEMANTICS
    from kvspec.stateful_tests.formal_reports import save_counterexample
    from kvspec.stateful_tests.reachable import Drive, explore_report

    problem = _out_of_bounds(args) or unwritable(args.report, args.junit)
    if problem is not None:
        return fail(problem)
    started = now()
    try:
        bounds = _bounds(args)
    except ValueError as exc:
        return fail(str(exc))
    adapter = None
    semantics = SEMANTICS
    if args.adapter is not None:
        try:
            adapter = IsolatedAdapter(load(args.adapter), args.step_timeout)
        except (AdapterLoadError, Exception) as exc:
            return fail(f"adapter {args.adapter!r} could not start: {exc}")
        declared = adapter.capabilities.semantics
        if declared.granularity != "block" or declared.layout != "one_table":
            adapter.close()
            return fail(f"adapter {args.adapter!r} is not a block cache with one table per request: nothing to explore")
        # The spec's reachable states under the one choice the encoding leaves open and the adapter declares.
        if declared.duplicate_keys in ("unkeyed", "newest"):
            semantics = replace(SEMANTICS, duplicate_keys=declared.duplicate_keys)
    what = f"N={bounds.blocks} blocks, R={bounds.requests} requests, B={bounds.block_size}, A={bounds.alphabet}"
    print(f"explicit-state search of the spec: {what}, depth {args.depth}")

    def layer(k: int, fresh: int, seconds: float) -> None:
        print(f"  depth {k}: {fresh} new states ({seconds:.1f} s)", flush=True)

    result = explore(
        bounds,
        args.depth,
        semantics=semantics,
        time_limit=args.time_limit,
        reduce=not args.no_symmetry,
        progress=None if args.quiet else layer,
    )
    how = (
        f"the whole reachable space (diameter {result.diameter})"
        if result.complete
        else f"every state within depth {result.depth}"
    )
    print(
        f"{how}: {result.distinct} distinct states, {result.states} transitions checked, "
        f"{result.seconds:.1f} s ({result.states_per_s:.0f} states/s)"
        + (" -- time limit reached" if result.timed_out else "")
        + (" -- interrupted" if result.interrupted else "")
    )
    driven: Drive | None = None
    cases: list[str] = []
    cex = result.counterexample
    if cex is not None:
        print(f"COUNTEREXAMPLE at depth {len(cex.ops)}: {', '.join(cex.invariants)}")
        for i, op in enumerate(cex.ops):
            print(f"  {i:>3}. {op}")
        cases.append(
            str(save_counterexample("explore", bounds, cex.ops, cex.invariants, len(cex.ops) - 1, args.cases_dir))
        )
    elif adapter is not None and not result.interrupted:
        driven = _drive(args, adapter, result, bounds, cases)
    if adapter is not None and (cex is not None or result.interrupted):
        adapter.close()  # not driven (closing twice is harmless)
    for path in cases:
        print(f"case saved: {path}  (replay: kvspec replay {path} --adapter NAME)")
    report = explore_report(result, started_at=started, adapter=args.adapter, driven=driven, cases=cases)
    report.write(args.report, args.junit)
    return report.exit_code


def _drive(args: argparse.Namespace, adapter: Any, result: Any, bounds: Any, cases: list[str]) -> Any:
    """Drive ``adapter`` through every state the search reached; a failure saved into ``cases``. None when
    interrupted (the search's own verdicts stand, ``result.interrupted``); the adapter is closed."""
    from kvspec.case import Case
    from kvspec.stateful_tests.reachable import drive

    try:
        driven = drive(adapter, result, time_limit=args.time_limit)
    except KeyboardInterrupt:
        stop.clear()
        result.interrupted = True
        return None
    finally:
        adapter.close()
    print(
        f"adapter {args.adapter}: driven through {driven.states} states on {driven.paths} paths, "
        f"{driven.tally.steps} steps, {driven.seconds:.1f} s"
    )
    failure = driven.violation
    if failure is not None or driven.hung is not None:
        name = failure.invariant if failure is not None else "adapter_contract"
        print(f"VIOLATED {name}:\n{failure if failure is not None else driven.hung}")
        expected = {"invariant": name, "step": len(driven.failed_ops) - 1, "source": "explore"}
        case = Case(args.adapter, bounds.config, driven.failed_ops, expected)
        cases.append(str(case.save(args.cases_dir)))
    return driven


def cmd_scenarios(args: argparse.Namespace) -> int:
    from kvspec.stateful_tests.bounded import SCENARIO_DIR, generate, save

    problem = _out_of_bounds(args)
    if problem is not None:
        return fail(problem)
    try:
        bounds = _bounds(args)

        def show(goal: str, ops: list[str] | None, seconds: float) -> None:
            found = f"{len(ops)} ops: {'; '.join(ops)}" if ops is not None else "not reached"
            print(f"  {goal:<36} {seconds:5.1f} s  {found}", flush=True)

        scenarios = generate(bounds, args.depth, time_per_goal=args.time_per_goal, progress=show)
    except ValueError as exc:
        return fail(str(exc))
    written = save(scenarios, args.out or SCENARIO_DIR, case_files=args.case_files)
    total = len(scenarios.cases) + len(scenarios.unreached)
    print(
        f"{len(scenarios.cases)}/{total} coverage goals reached within depth {args.depth} "
        f"({scenarios.seconds:.1f} s); wrote {written[0]}"
        + (f" and {len(written) - 1} case files" if len(written) > 1 else "")
    )
    return ExitCode.HELD


def cmd_crosshair(args: argparse.Namespace) -> int:
    from kvspec.stateful_tests.crosshair_run import REFERENCE_TARGETS, run_crosshair

    problem = _out_of_bounds(args)
    if problem is not None:
        return fail(problem)
    targets = args.targets or list(REFERENCE_TARGETS)
    limits = f"per condition {args.per_condition_timeout:g} s, budget {args.budget:g} s"
    print(f"crosshair check {' '.join(targets)} ({limits})")
    result = run_crosshair(targets, per_condition_timeout=args.per_condition_timeout, budget=args.budget)
    for line in result.counterexamples:
        print(f"  {line}")
    if result.timed_out:
        print(f"did not finish within the budget of {args.budget:g} s")
    print(f"{result.verdict} ({result.seconds:.1f} s)")
    if result.exit_code == ExitCode.COULD_NOT_RUN and not result.timed_out:
        # CrossHair's own output ends with why (often its traceback): its last line is the reason.
        reason = next((line for line in reversed(result.output.splitlines()) if line.strip()), "no output")
        return fail(f"crosshair could not run: {reason.strip()}")
    return result.exit_code
