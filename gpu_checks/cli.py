"""``kvspec gpu-check``: the byte side of the spec's block count, on whatever this machine has.

Sections, each run where it can and otherwise recorded as skipped with its reason:

- ``arithmetic``: the kit's sizes for a few published model shapes (no dependency);
- ``torch``: the dtype table and meta/CPU tensor sizes against torch (needs torch);
- ``vllm``: the kit's per-layer size against vLLM's ``page_size_bytes`` (needs vLLM);
- ``cuda``: the footprint assertions of :mod:`gpu_checks.cuda_probe` (needs a CUDA device).

Exit codes (the kit's contract): 0 every assertion that ran held (a section may be skipped:
without CUDA the CPU sections run and the CUDA one is skipped, so a CPU CI passes);
1 a footprint mismatch was found; 2 the check could not be run (bad usage, an allocator
configuration the probe does not model, a CUDA error, or ``--require-cuda`` on a machine
without CUDA). The JSON (``--json``) is written whatever the outcome.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kvspec.gpu_checks.checks import Check, Section, compare
from kvspec.gpu_checks.cuda_probe import (
    CannotProbe,
    ProbeCase,
    TorchCudaBackend,
    cuda_missing,
    default_cases,
    environment,
    probe,
)
from kvspec.gpu_checks.footprint import DTYPE_BYTES, KV_DTYPES, MODEL_SHAPES, KVBlockShape
from kvspec.gpu_checks.torch_crosscheck import check_dtype_table, check_tensor_bytes, torch_dtype, torch_missing
from kvspec.gpu_checks.vllm_agreement import check_page_sizes, vllm_missing, vllm_version

EXIT_HELD, EXIT_VIOLATED, EXIT_COULD_NOT_RUN = 0, 1, 2
SCHEMA_VERSION = 1


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
    parser.set_defaults(handler=run)
    return parser


def arithmetic_section() -> Section:
    """The kit's figures for the model table, and the hand-computed anchors they must hit."""
    figures = {
        name: {dtype: shape.with_dtype(dtype).to_json() for dtype in KV_DTYPES} for name, shape in MODEL_SHAPES.items()
    }
    llama = MODEL_SHAPES["llama-3-8b"]
    checks = [
        # 2 x 16 tokens x 8 KV heads x 128 x 2 bytes (bf16)
        compare("llama-3-8b bf16 bytes per layer per block", 65536, llama.bytes_per_layer),
        compare("llama-3-8b bf16 bytes per block (32 layers)", 2 * 1024 * 1024, llama.bytes_per_block),
        compare("llama-3-8b fp8 bytes per block", 1024 * 1024, llama.with_dtype("float8_e4m3fn").bytes_per_block),
        compare("llama-3-8b bf16 bytes per token (all layers)", 131072, llama.bytes_per_token),
    ]
    return Section("arithmetic", checks=checks, extra={"models": figures})


def _kv_shapes_torch_has() -> list[KVBlockShape]:
    return [s.with_dtype(d) for s in MODEL_SHAPES.values() for d in KV_DTYPES if torch_dtype(d) is not None]


def torch_section() -> Section:
    reason = torch_missing()
    if reason is not None:
        return Section("torch", skipped=reason)
    import torch

    table_checks, absent = check_dtype_table()
    tensor_checks = check_tensor_bytes(_kv_shapes_torch_has())
    extra = {
        "torch": torch.__version__,
        "dtypes_absent": absent,
        "dtypes_checked": sorted(set(DTYPE_BYTES) - set(absent)),
    }
    return Section("torch", checks=table_checks + tensor_checks, extra=extra)


def vllm_section() -> Section:
    reason = torch_missing() or vllm_missing()
    if reason is not None:
        return Section("vllm", skipped=reason)
    return Section("vllm", checks=check_page_sizes(_kv_shapes_torch_has()), extra={"vllm": vllm_version()})


def cuda_section(repeats: int, quick: bool) -> tuple[Section, bool]:
    """The CUDA measurement; the flag is True when it could not run for a reason other than no CUDA."""
    reason = cuda_missing()
    if reason is not None:
        return Section("cuda", skipped=reason, extra={"environment": environment()}), False
    try:
        backend = TorchCudaBackend()
    except CannotProbe as exc:
        return Section("cuda", skipped=str(exc), extra={"environment": environment()}), True
    dtypes = ("bfloat16",) if quick else tuple(d for d in KV_DTYPES if torch_dtype(d) is not None)
    cases: list[ProbeCase] = default_cases(dtypes)
    env = environment(backend)
    try:
        checks, records = probe(backend, cases, repeats=repeats)
    except (RuntimeError, MemoryError) as exc:  # torch.cuda.OutOfMemoryError is a RuntimeError
        return Section("cuda", skipped=f"the CUDA measurement failed: {exc}", extra={"environment": env}), True
    extra = {"environment": env, "repeats": repeats, "cases": records}
    return Section("cuda", checks=checks, extra=extra), False


def _print_section(section: Section, out: Any) -> None:
    if section.skipped is not None:
        print(f"SKIP {section.name}: {section.skipped}", file=out)
        return
    failed: list[Check] = [c for c in section.checks if not c.held]
    verdict = "held" if not failed else "VIOLATED"
    print(
        f"{verdict:<8} {section.name}: {len(section.checks) - len(failed)}/{len(section.checks)} checks held", file=out
    )
    for check in failed[:20]:
        print(check.line(), file=out)


def run(args: argparse.Namespace) -> int:
    """The ``gpu-check`` handler: run the sections, print a line each, write the JSON, return the exit code."""
    if args.repeats <= 0:
        print("kvspec gpu-check: --repeats must be positive", file=sys.stderr)
        return EXIT_COULD_NOT_RUN
    started = time.monotonic()
    record: dict[str, Any] = {
        "kvspec_gpu_check": SCHEMA_VERSION,
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    sections: list[Section] = []
    could_not_run = False
    try:
        for make in (arithmetic_section, torch_section, vllm_section):
            section = make()
            sections.append(section)
            _print_section(section, sys.stdout)
        cuda, cuda_failed = cuda_section(args.repeats, args.quick)
        sections.append(cuda)
        _print_section(cuda, sys.stdout)
        could_not_run = cuda_failed or (cuda.skipped is not None and args.require_cuda)
    finally:
        if any(s.violated for s in sections):
            code = EXIT_VIOLATED
        elif could_not_run:
            code = EXIT_COULD_NOT_RUN
        else:
            code = EXIT_HELD
        record["duration_s"] = round(time.monotonic() - started, 3)
        record["exit_code"] = code
        record["verdict"] = {EXIT_HELD: "held", EXIT_VIOLATED: "violated", EXIT_COULD_NOT_RUN: "could_not_run"}[code]
        record["environment"] = environment()
        for section in sections:
            record[section.name] = section.to_json()
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(record, indent=2) + "\n")
    if code == EXIT_COULD_NOT_RUN and args.require_cuda and sections[-1].skipped:
        print("kvspec gpu-check: --require-cuda given and the CUDA part could not run", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m kvspec.gpu_checks.cli``), the same as ``kvspec gpu-check``."""
    parser = argparse.ArgumentParser(prog="kvspec")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    handler: Any = args.handler
    return int(handler(args))


if __name__ == "__main__":
    sys.exit(main())
