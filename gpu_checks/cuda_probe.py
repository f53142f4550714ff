"""CUDA footprint assertions: N KV blocks, allocated as torch tensors, take what the arithmetic says.

For each case (a block shape, a block count N, a layout) and each of R repetitions, from a
freshly emptied allocator cache:

1. allocate the N blocks as torch tensors, write them, ``torch.cuda.synchronize()``;
2. the growth of ``requested_bytes.all.current`` equals N x bytes_per_block exactly;
3. the growth of ``memory_allocated()`` is what :mod:`gpu_checks.rounding` allows for
   that many tensors of that size (exactly N x L x round_512(bytes_per_layer) for
   ``per_block`` tensors up to 1 MiB), and the growth of ``max_memory_allocated()``
   equals it (the peak is the final state: the probe only allocates);
4. after the tensors are dropped and the device synchronized, ``memory_allocated()``
   is back at its baseline;
5. every repetition measures the same figures (the footprint is stable).

Layouts: ``per_block`` allocates one tensor ``(2, block_tokens, kv_heads, head_dim)`` per
block and layer (N x L tensors); ``per_layer_pool`` allocates one tensor
``(2, N, block_tokens, kv_heads, head_dim)`` per layer (L tensors), as engines do.

The allocator is reached through :class:`AllocatorBackend`, so the comparison logic runs on
a CPU against a simulated allocator in the tests; :class:`TorchCudaBackend` is the real one.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from kvspec.gpu_checks.checks import Check, compare
from kvspec.gpu_checks.footprint import KV_DTYPES, KVBlockShape
from kvspec.gpu_checks.rounding import Expected, expandable_segments, expected_growth, unsupported_alloc_conf

Layout = Literal["per_block", "per_layer_pool"]
LAYOUTS: tuple[Layout, ...] = ("per_block", "per_layer_pool")


class CannotProbe(RuntimeError):
    """The probe cannot run here (no CUDA, an allocator configuration it does not model)."""


class AllocatorBackend(Protocol):
    """What the probe needs from a device allocator."""

    def allocate(self, shape: tuple[int, ...], dtype: str) -> object:
        """Allocate and write one tensor; the returned handle keeps it alive."""

    def synchronize(self) -> None: ...

    def empty_cache(self) -> None: ...

    def reset_peak(self) -> None: ...

    def memory_allocated(self) -> int: ...

    def max_memory_allocated(self) -> int: ...

    def memory_reserved(self) -> int: ...

    def requested_bytes(self) -> int | None:
        """The allocator's unrounded count of live bytes, or None where it keeps none."""

    @property
    def expandable_segments(self) -> bool: ...


@dataclass(frozen=True)
class ProbeCase:
    """N blocks of one shape, in one layout."""

    shape: KVBlockShape
    n_blocks: int
    layout: Layout = "per_block"

    def __post_init__(self) -> None:
        if isinstance(self.n_blocks, bool) or not isinstance(self.n_blocks, int) or self.n_blocks <= 0:
            raise ValueError(f"n_blocks must be a positive int, got {self.n_blocks!r}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")

    @property
    def theoretical_bytes(self) -> int:
        """N x bytes_per_block: what the kit's arithmetic says these blocks take."""
        return self.n_blocks * self.shape.bytes_per_block

    @property
    def tensors(self) -> tuple[int, tuple[int, ...]]:
        """How many tensors the layout allocates, and the shape of each."""
        s = self.shape
        if self.layout == "per_block":
            return self.n_blocks * s.num_layers, s.tensor_shape
        return s.num_layers, (2, self.n_blocks, s.block_tokens, s.kv_heads, s.head_dim)

    def expected(self, expandable: bool = False) -> Expected:
        count, _ = self.tensors
        return expected_growth(count, self.theoretical_bytes // count, expandable_segments=expandable)

    def label(self) -> str:
        s = self.shape
        return f"N={self.n_blocks} {self.layout} {s.tensor_shape} {s.dtype} x{s.num_layers} layers"


@dataclass(frozen=True)
class Run:
    """The figures of one repetition, as deltas from its baseline."""

    allocated: int
    peak: int
    requested: int | None
    reserved: int
    after_free: int

    def to_json(self) -> dict[str, int | None]:
        return {
            "allocated_delta": self.allocated,
            "max_allocated_delta": self.peak,
            "requested_delta": self.requested,
            "reserved_delta": self.reserved,
            "allocated_after_free_delta": self.after_free,
        }


def measure(backend: AllocatorBackend, case: ProbeCase) -> Run:
    """One repetition: empty the cache, allocate the case's tensors, read the deltas, free, read again."""
    count, tensor_shape = case.tensors
    backend.synchronize()
    backend.empty_cache()
    backend.reset_peak()
    base_alloc = backend.memory_allocated()
    base_peak = backend.max_memory_allocated()
    base_requested = backend.requested_bytes()
    base_reserved = backend.memory_reserved()
    live = [backend.allocate(tensor_shape, case.shape.dtype) for _ in range(count)]
    backend.synchronize()
    allocated = backend.memory_allocated() - base_alloc
    peak = backend.max_memory_allocated() - base_peak
    now_requested = backend.requested_bytes()
    requested = None if now_requested is None or base_requested is None else now_requested - base_requested
    reserved = backend.memory_reserved() - base_reserved
    live.clear()
    backend.synchronize()
    after_free = backend.memory_allocated() - base_alloc
    backend.empty_cache()
    return Run(allocated=allocated, peak=peak, requested=requested, reserved=reserved, after_free=after_free)


def judge(case: ProbeCase, runs: Sequence[Run], expandable: bool = False) -> list[Check]:
    """The assertions of the module docstring, over the repetitions of one case."""
    expected = case.expected(expandable)
    checks: list[Check] = []
    for i, run in enumerate(runs):
        tag = f"rep {i}"
        if run.requested is not None:
            checks.append(
                compare(f"{tag}: requested_bytes growth == N x bytes_per_block", expected.requested, run.requested)
            )
        rule = "== tensors x round_512(bytes)" if expected.exact else "within the large-pool split slack"
        checks.append(
            Check(
                name=f"{tag}: memory_allocated growth {rule}",
                held=expected.admits(run.allocated),
                expected=expected.low if expected.exact else [expected.low, expected.high],
                measured=run.allocated,
                detail=f"{expected.count} tensors of {expected.nbytes} B",
            )
        )
        checks.append(
            compare(f"{tag}: max_memory_allocated growth == memory_allocated growth", run.allocated, run.peak)
        )
        checks.append(compare(f"{tag}: memory_allocated back at baseline after free", 0, run.after_free))
    if runs:
        first = runs[0]
        checks.append(
            Check(
                name="stable across repetitions",
                held=all(r.allocated == first.allocated and r.requested == first.requested for r in runs),
                expected=first.allocated,
                measured=sorted({r.allocated for r in runs}),
            )
        )
    return checks


def probe(backend: AllocatorBackend, cases: Iterable[ProbeCase], repeats: int = 3) -> tuple[list[Check], list[Any]]:
    """Run every case ``repeats`` times; return all checks and a JSON-able record per case."""
    if repeats <= 0:
        raise ValueError(f"repeats must be positive, got {repeats}")
    expandable = backend.expandable_segments
    checks: list[Check] = []
    records: list[Any] = []
    for case in cases:
        runs = [measure(backend, case) for _ in range(repeats)]
        case_checks = judge(case, runs, expandable)
        checks.extend(case_checks)
        count, tensor_shape = case.tensors
        records.append(
            {
                "case": case.label(),
                "shape": case.shape.to_json(),
                "n_blocks": case.n_blocks,
                "layout": case.layout,
                "tensors": count,
                "tensor_shape": list(tensor_shape),
                "theoretical_bytes": case.theoretical_bytes,
                "expected": case.expected(expandable).to_json(),
                "runs": [r.to_json() for r in runs],
                "held": all(c.held for c in case_checks),
                "failed": [c.to_json() for c in case_checks if not c.held],
            }
        )
    return checks, records


def default_cases(dtypes: Iterable[str] = KV_DTYPES) -> list[ProbeCase]:
    """The grid the GPU run measures: several N, block sizes, shapes and dtypes, both layouts.

    Includes a shape whose per-layer size is no multiple of 512 bytes, so the rounding rule
    is exercised and not only trivially met. Peak footprint stays under 3 GiB.
    """
    llama = KVBlockShape(block_tokens=16, kv_heads=8, head_dim=128, dtype="bfloat16", num_layers=32)
    shapes = [
        llama,
        KVBlockShape(block_tokens=32, kv_heads=8, head_dim=128, dtype="bfloat16", num_layers=4),
        KVBlockShape(block_tokens=16, kv_heads=4, head_dim=128, dtype="bfloat16", num_layers=28),
        KVBlockShape(block_tokens=32, kv_heads=2, head_dim=32, dtype="bfloat16", num_layers=2),
        KVBlockShape(block_tokens=3, kv_heads=1, head_dim=100, dtype="bfloat16", num_layers=2),  # 1200 B -> 1536
    ]
    cases: list[ProbeCase] = []
    for dtype in dtypes:
        for shape in shapes:
            typed = shape.with_dtype(dtype)
            for n in (1, 7, 64):
                cases.append(ProbeCase(typed, n, "per_block"))
            for n in (1, 64, 1000):
                cases.append(ProbeCase(typed, n, "per_layer_pool"))
    cases.append(ProbeCase(llama, 512, "per_block"))  # 16384 tensors, 1 GiB
    return cases


class TorchCudaBackend:
    """The real allocator: ``torch.cuda`` on one device (the current one by default)."""

    def __init__(self, device: int | None = None) -> None:
        reason = cuda_missing()
        if reason is not None:
            raise CannotProbe(reason)
        import torch

        self._torch = torch
        self.device = torch.device("cuda", torch.cuda.current_device() if device is None else device)
        conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        backend = torch.cuda.get_allocator_backend()
        if backend != "native":
            raise CannotProbe(f"the CUDA allocator backend is {backend!r}; the probe models the native one")
        why = unsupported_alloc_conf(conf)
        if why is not None:
            raise CannotProbe(why)
        self._expandable = expandable_segments(conf)

    @property
    def expandable_segments(self) -> bool:
        return self._expandable

    def allocate(self, shape: tuple[int, ...], dtype: str) -> object:
        tensor = self._torch.empty(shape, dtype=getattr(self._torch, dtype), device=self.device)
        tensor.view(self._torch.uint8).fill_(0)  # write every byte: no lazily backed memory
        return tensor

    def synchronize(self) -> None:
        self._torch.cuda.synchronize(self.device)

    def empty_cache(self) -> None:
        self._torch.cuda.empty_cache()

    def reset_peak(self) -> None:
        self._torch.cuda.reset_peak_memory_stats(self.device)

    def memory_allocated(self) -> int:
        return int(self._torch.cuda.memory_allocated(self.device))

    def max_memory_allocated(self) -> int:
        return int(self._torch.cuda.max_memory_allocated(self.device))

    def memory_reserved(self) -> int:
        return int(self._torch.cuda.memory_reserved(self.device))

    def requested_bytes(self) -> int | None:
        value = self._torch.cuda.memory_stats(self.device).get("requested_bytes.all.current")
        return None if value is None else int(value)


def cuda_missing() -> str | None:
    """Why the CUDA measurement cannot run here, or None when a CUDA device is usable."""
    try:
        import torch
    except ImportError:
        return "no CUDA device: torch is not installed (install the kit's gpu extra: pip install 'kvspec[gpu]')"
    if not torch.cuda.is_available():
        build = torch.version.cuda
        what = f"a CUDA {build} build" if build else "a CPU-only build"
        return (
            f"no CUDA device: torch {torch.__version__} is {what} and sees no GPU (torch.cuda.is_available() is False)"
        )
    return None


def environment(backend: TorchCudaBackend | None = None) -> dict[str, Any]:
    """Versions and device facts for the JSON record."""
    env: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform()}
    try:
        import torch
    except ImportError:
        env["torch"] = None
        return env
    env["torch"] = torch.__version__
    env["torch_cuda"] = torch.version.cuda
    env["pytorch_cuda_alloc_conf"] = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if backend is not None:
        props = torch.cuda.get_device_properties(backend.device)
        env["device_name"] = torch.cuda.get_device_name(backend.device)
        env["device_total_memory"] = int(props.total_memory)
        env["device_capability"] = list(torch.cuda.get_device_capability(backend.device))
        env["cuda_driver"] = _driver_version(torch)
        env["allocator_backend"] = torch.cuda.get_allocator_backend()
    return env


def _driver_version(torch: Any) -> int | None:
    try:
        return int(torch._C._cuda_getDriverVersion())
    except Exception:
        return None
