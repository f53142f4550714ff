"""The sections of ``kvspec gpu-check``: the byte side of the spec's block count, on whatever this machine has.

Each section runs where it can and is otherwise recorded as skipped with its reason:

- ``arithmetic``: the kit's sizes for a few published model shapes (no dependency);
- ``torch``: the dtype table and meta/CPU tensor sizes against torch (needs torch);
- ``vllm``: the kit's per-layer size against vLLM's ``page_size_bytes`` (needs vLLM);
- ``cuda``: the footprint assertions of :mod:`gpu_checks.cuda_probe` (needs a CUDA device).

:func:`gpu_check` runs them all and keeps the kit's exit-code contract: 0 every assertion that
ran held (without CUDA the CPU sections run and the CUDA one is skipped, so a CPU CI passes);
1 a footprint mismatch; 2 could not run (an allocator configuration the probe does not model,
a CUDA error, or ``require_cuda`` on a machine without CUDA).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

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
from kvspec.gpu_checks.vllm_agreement import check_page_sizes
from kvspec.report import ExitCode
from kvspec.vllm_env import vllm_missing, vllm_version

SCHEMA_VERSION = 1


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
    try:
        checks = check_page_sizes(_kv_shapes_torch_has())
    except ImportError as exc:  # installed, but its KV cache spec is not where this kit looks
        return Section("vllm", skipped=f"vLLM's KV cache spec cannot be imported: {exc}")
    return Section("vllm", checks=checks, extra={"vllm": vllm_version()})


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


def print_section(section: Section, out: TextIO) -> None:
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


def gpu_check(
    repeats: int = 3,
    *,
    quick: bool = False,
    require_cuda: bool = False,
    out: TextIO | None = None,
    json_path: Path | None = None,
) -> tuple[ExitCode, dict[str, Any]]:
    """Run every section, printing a line each to ``out``; the exit code and the JSON record.

    The record is written to ``json_path`` whatever the outcome, Ctrl-C included.
    """
    show: Callable[[Section], None] = (lambda s: print_section(s, out)) if out is not None else (lambda s: None)
    started = time.monotonic()
    record: dict[str, Any] = {
        "kvspec_gpu_check": SCHEMA_VERSION,
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    sections: list[Section] = []
    could_not_run = False
    code = ExitCode.COULD_NOT_RUN
    try:
        for make in (arithmetic_section, torch_section, vllm_section):
            section = make()
            sections.append(section)
            show(section)
        cuda, cuda_failed = cuda_section(repeats, quick)
        sections.append(cuda)
        show(cuda)
        could_not_run = cuda_failed or (cuda.skipped is not None and require_cuda)
    finally:
        if any(s.violated for s in sections):
            code = ExitCode.VIOLATED
        elif could_not_run:
            code = ExitCode.COULD_NOT_RUN
        else:
            code = ExitCode.HELD
        record["duration_s"] = round(time.monotonic() - started, 3)
        record["exit_code"] = int(code)
        record["verdict"] = {ExitCode.HELD: "held", ExitCode.VIOLATED: "violated"}.get(code, "could_not_run")
        record["environment"] = environment()
        for section in sections:
            record[section.name] = section.to_json()
        if json_path is not None:
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps(record, indent=2) + "\n")
    return code, record
