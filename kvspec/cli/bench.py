"""``kvspec bench``: workload files, the eviction-policy A/B, and the live-server A/B.

``register(subparsers)`` adds ``bench`` with one sub-subcommand per function in
``SUBCOMMANDS``; each function takes the ``bench`` group's subparsers and sets
``handler`` (parsed args -> exit code). A new sub-subcommand is one more such
function in ``SUBCOMMANDS``.

Exit codes: 0 done; 2 could not run (bad usage, an adapter that does not load,
vLLM asked for with ``--vllm on`` but not installed). The A/B is a measurement,
not a check: a policy that hits less, or a vLLM divergence, is a result, not a failure.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kvspec.bench.live.benchmark import LiveOptions, redraw, run_benchmark
from kvspec.bench.live.launcher import MODEL_SHAPES
from kvspec.bench.live.workload import WorkloadShape
from kvspec.bench.policy_ab import DEFAULT_FRACTIONS, BenchError, default_policies, load_policy, plot, run_ab, table
from kvspec.bench.workloads import GENERATORS, Workload, generate
from kvspec.bounds import at_least_one, first_problem, positive
from kvspec.report import ExitCode
from kvspec.spec import SpecError
from kvspec.vllm_env import INSTALL_HINT, vllm_installed

from .common import fail, unwritable

DEFAULT_SEED = 0
DEFAULT_BLOCK_SIZE = 16


def _csv(kind: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    def parse(text: str) -> list[Any]:
        return [kind(part) for part in text.split(",") if part.strip()]

    return parse


def _workload_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"generator seed (default {DEFAULT_SEED})")
    parser.add_argument(
        "--block-size", type=int, default=DEFAULT_BLOCK_SIZE, help=f"tokens per block (default {DEFAULT_BLOCK_SIZE})"
    )
    parser.add_argument(
        "--only", action="append", default=None, choices=sorted(GENERATORS), help="just this workload (repeatable)"
    )


def register_workloads(bench_sub: Any) -> None:
    """``bench workloads --out DIR``: write every generated workload as DIR/<name>.json."""
    p = bench_sub.add_parser("workloads", help="generate the A/B workloads and save them as JSON")
    _workload_args(p)
    p.add_argument("--out", type=Path, required=True, help="folder for the workload files")
    p.set_defaults(handler=cmd_workloads)


def register_policies(bench_sub: Any) -> None:
    """``bench policies``: replay each workload through each policy at several pool sizes."""
    p = bench_sub.add_parser("policies", help="A/B of eviction policies (and vLLM) on the workloads")
    _workload_args(p)
    p.add_argument("--workloads", type=Path, default=None, help="replay the saved workloads in this folder instead")
    p.add_argument(
        "--policies",
        type=_csv(str),
        default=None,
        help="comma-separated adapter names (default: every built-in adapter named reference*)",
    )
    p.add_argument(
        "--pool-fractions",
        type=_csv(float),
        default=list(DEFAULT_FRACTIONS),
        help="pool sizes as fractions of each workload's footprint, floored at its live peak "
        f"(default {','.join(map(str, DEFAULT_FRACTIONS))})",
    )
    p.add_argument(
        "--vllm",
        choices=("auto", "on", "off"),
        default="auto",
        help="also replay on vLLM's KVCacheManager and compare hits with the lru reference (auto: if importable)",
    )
    p.add_argument(
        "--baselines",
        type=_csv(str),
        default=["reference", "reference-lru-uncached-first"],
        help="policies whose per-request hits are compared with vLLM's "
        "(default: reference,reference-lru-uncached-first, the two lru free queues)",
    )
    p.add_argument("--json", type=Path, default=None, help="write the full results here")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG of hit rate per pool size (needs matplotlib)")
    p.add_argument("--markdown", action="store_true", help="print the tables as markdown")
    p.set_defaults(handler=cmd_policies)


def register_live(bench_sub: Any) -> None:
    """``bench live``: the A/B on a live vLLM server (kvspec/bench/live/)."""
    p = bench_sub.add_parser(
        "live", help="A/B benchmark on a live vLLM server: unique prompts vs one long shared prefix"
    )
    shape, options = WorkloadShape(), LiveOptions()
    p.add_argument("--requests", "-n", type=int, default=shape.requests, help="requests per run (N)")
    p.add_argument("--prompt-tokens", type=int, default=shape.prompt_tokens, help="prompt length P, both arms")
    p.add_argument(
        "--shared-tokens", type=int, default=shape.shared_tokens, help="shared prefix S of the shared arm (S < P)"
    )
    p.add_argument("--output-tokens", type=int, default=shape.output_tokens, help="max_tokens O (ignore_eos)")
    p.add_argument("--concurrency", "-c", type=int, default=shape.concurrency, help="requests in flight (C)")
    p.add_argument(
        "--pairs", type=int, default=options.pairs, help="pairs of runs, order alternating (default %(default)s)"
    )
    p.add_argument("--seed", type=int, default=shape.seed, help="seed of the random prompts")
    p.add_argument(
        "--block-size", type=int, default=options.block_size, help="tokens per KV block (32: the CPU minimum)"
    )
    p.add_argument(
        "--num-blocks",
        type=int,
        default=options.num_blocks,
        help="KV pool size incl. the null block (default %(default)s)",
    )
    p.add_argument(
        "--max-num-seqs", type=int, default=options.max_num_seqs, help="vLLM --max-num-seqs (default %(default)s)"
    )
    p.add_argument(
        "--model",
        choices=sorted(MODEL_SHAPES),
        default=options.model,
        help="random Llama shape: small (default) or tiny",
    )
    p.add_argument(
        "--startup-timeout", type=float, default=options.startup_timeout_s, help="seconds for a server to come up"
    )
    p.add_argument(
        "--request-timeout", type=float, default=options.request_timeout_s, help="seconds before a request fails"
    )
    p.add_argument(
        "--settle", type=float, default=options.settle_s, help="seconds between the last answer and /metrics"
    )
    p.add_argument("--json", type=Path, default=None, metavar="OUT", help="write the JSON result here")
    p.add_argument("--plot", type=Path, default=None, metavar="OUT.png", help="draw a figure (matplotlib)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument(
        "--from-json", type=Path, default=None, metavar="IN", help="run nothing: print the table (and --plot) of IN"
    )
    p.set_defaults(handler=cmd_live)


SUBCOMMANDS: list[Callable[[Any], None]] = [register_workloads, register_policies, register_live]
"""Each adds one ``bench`` sub-subcommand; append to add another (e.g. ``bench live``)."""


def register(subparsers: Any) -> None:
    """Add ``bench`` and its sub-subcommands to the ``kvspec`` subcommands."""
    bench = subparsers.add_parser("bench", help="benchmarks: workloads, eviction-policy A/B")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    for add in SUBCOMMANDS:
        add(bench_sub)


def _generated(args: argparse.Namespace) -> list[Workload]:
    return [generate(name, args.seed, block_size=args.block_size) for name in (args.only or GENERATORS)]


def cmd_workloads(args: argparse.Namespace) -> int:
    problem = at_least_one("--block-size", args.block_size) or unwritable(args.out / ".kvspec-probe")
    if problem is not None:
        return fail(problem)
    try:
        workloads = _generated(args)
    except (SpecError, TypeError) as exc:
        return fail(f"cannot generate workloads: {exc}")
    for workload in workloads:
        path = args.out / f"{workload.name}.json"
        workload.save(path)
        print(f"{path}: {len(workload.ops)} ops, footprint {workload.footprint()} blocks")
    return ExitCode.DONE


def _loaded(folder: Path, only: list[str] | None) -> list[Workload]:
    workloads = [Workload.load(path) for path in sorted(folder.glob("*.json"))]
    if only:
        workloads = [w for w in workloads if w.name in only]
    if not workloads:
        raise SpecError(f"no workload files in {folder}")
    return workloads


def cmd_policies(args: argparse.Namespace) -> int:
    problem = at_least_one("--block-size", args.block_size) or unwritable(args.json, args.plot)
    if problem is not None:
        return fail(problem)
    try:
        workloads = _loaded(args.workloads, args.only) if args.workloads else _generated(args)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return fail(f"cannot load workloads: {exc}")
    policies = args.policies or default_policies()
    why_not = _vllm_unusable() if args.vllm != "off" else "--vllm off"
    if why_not and args.vllm == "on":
        return fail(f"--vllm on, but {why_not}")
    use_vllm = why_not is None
    if why_not:
        print(f"vLLM comparison skipped: {why_not}")
    try:
        result = run_ab(
            workloads,
            policies,
            args.pool_fractions,
            vllm=use_vllm,
            baselines=args.baselines,
            progress=lambda line: print(f"  ... {line}", file=sys.stderr, flush=True),
        )
    except BenchError as exc:
        return fail(str(exc))
    result["command"] = " ".join(["kvspec", "bench", "policies", *_argv_tail(args)])
    result["created_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    print(table(result, markdown=args.markdown))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"results: {args.json}")
    if args.plot:
        why_not = plot(result, str(args.plot))
        print(why_not or f"plot: {args.plot}")
    return ExitCode.DONE


def _live_out_of_bounds(args: argparse.Namespace) -> str | None:
    """Why a number of ``bench live`` is out of its bounds (counts at least 1, timeouts positive), or None."""
    counts = {"--requests": args.requests, "--prompt-tokens": args.prompt_tokens, "--output-tokens": args.output_tokens}
    counts |= {"--concurrency": args.concurrency, "--pairs": args.pairs, "--block-size": args.block_size}
    counts |= {"--num-blocks": args.num_blocks, "--max-num-seqs": args.max_num_seqs}
    problems = [at_least_one(name, value) for name, value in counts.items()]
    problems.append(positive("--startup-timeout", args.startup_timeout))
    problems.append(positive("--request-timeout", args.request_timeout))
    if args.shared_tokens < 0:
        problems.append(f"--shared-tokens must be at least 0, not {args.shared_tokens}")
    if not math.isfinite(args.settle) or args.settle < 0:
        problems.append(f"--settle must be a number of seconds of at least 0, not {args.settle:g}")
    return first_problem(*problems)


def cmd_live(args: argparse.Namespace) -> int:
    """Redraw a saved result (``--from-json``), or run the benchmark with the options as given."""
    if args.from_json is not None:  # a redraw: only the picture is written
        problem = unwritable(args.plot)
    else:
        problem = _live_out_of_bounds(args) or unwritable(args.json, args.plot)
    if problem is not None:
        return fail(problem, "kvspec bench live")
    if args.from_json is not None:
        return redraw(args.from_json, args.plot)
    shape = WorkloadShape(
        args.requests, args.prompt_tokens, args.shared_tokens, args.output_tokens, args.concurrency, seed=args.seed
    )
    options = LiveOptions(
        shape=shape,
        pairs=args.pairs,
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        max_num_seqs=args.max_num_seqs,
        model=args.model,
        startup_timeout_s=args.startup_timeout,
        request_timeout_s=args.request_timeout,
        settle_s=args.settle,
        json_path=args.json,
        plot_path=args.plot,
        quiet=args.quiet,
        command=(Path(sys.argv[0]).name, *args.argv),
    )
    return run_benchmark(options)


def _vllm_unusable() -> str | None:
    """Why the vllm adapter cannot run here (None: it can)."""
    if not vllm_installed():
        return f"vLLM is not importable here ({INSTALL_HINT})"
    try:
        load_policy("vllm")().close()
    except Exception as exc:  # any failure to build it means: no comparison, said so
        return f"the vllm adapter does not start: {exc}"
    return None


def _argv_tail(args: argparse.Namespace) -> list[str]:
    """The arguments after ``policies`` as typed, for the record in the JSON."""
    argv: list[str] = args.argv
    return argv[argv.index("policies") + 1 :] if "policies" in argv else argv
