"""``kvspec gpu-check``: KV block byte sizes against torch, vLLM and, on a CUDA device, the allocator.

Exit codes: 0 every assertion that ran held (skipped sections say why in the JSON); 1 a
footprint mismatch; 2 could not run (bad usage, a CUDA error, or ``--require-cuda`` without CUDA).
The JSON (``--json``) is written whatever the outcome.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from kvspec.gpu_checks.sections import gpu_check
from kvspec.report import ExitCode

from .common import fail, unwritable


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``gpu-check`` to the ``kvspec`` command line; the handler is ``args.handler``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "gpu-check",
        help="KV block byte sizes: arithmetic, torch and vLLM agreement, CUDA footprint (skipped without CUDA)",
        description=(
            "The byte side of the spec's block count: KV block sizes from shape and dtype, checked against "
            "torch (meta/CPU tensors), vLLM's page size and, on a CUDA device, the caching allocator's measured "
            "growth. Sections that cannot run here are skipped with the reason; exit 0 held, 1 mismatch, "
            "2 could not run."
        ),
    )
    parser.add_argument("--json", type=Path, default=None, metavar="OUT", help="write the JSON result here")
    parser.add_argument(
        "--require-cuda", action="store_true", help="exit 2 instead of 0 when there is no CUDA device to measure"
    )
    parser.add_argument("--repeats", type=int, default=3, help="repetitions of each CUDA case (default 3)")
    parser.add_argument("--quick", action="store_true", help="measure one dtype's CUDA cases only (bfloat16)")
    parser.set_defaults(handler=cmd_gpu_check)
    return parser


def cmd_gpu_check(args: argparse.Namespace) -> int:
    """Run the sections, print a line each, write the JSON; the exit code."""
    if args.repeats <= 0:
        return fail("--repeats must be positive", "kvspec gpu-check")
    problem = unwritable(args.json)
    if problem is not None:
        return fail(problem, "kvspec gpu-check")
    code, record = gpu_check(
        args.repeats, quick=args.quick, require_cuda=args.require_cuda, out=sys.stdout, json_path=args.json
    )
    if code == ExitCode.COULD_NOT_RUN and args.require_cuda and "skipped" in record.get("cuda", {}):
        print("kvspec gpu-check: --require-cuda given and the CUDA part could not run", file=sys.stderr)
    return code
