"""Cross-check of the kit's byte arithmetic against torch, on meta and CPU tensors (no GPU needed).

Invariants:
- for every dtype of :data:`footprint.DTYPE_BYTES` that this torch build has,
  ``torch.finfo(dtype).bits / 8`` and ``Tensor.element_size()`` equal the table's figure;
- a tensor of a block's per-layer shape ``(2, block_tokens, kv_heads, head_dim)`` has
  ``numel() x element_size()`` bytes, and its storage ``nbytes()``, equal to
  :attr:`footprint.KVBlockShape.bytes_per_layer` (on the meta device, which allocates
  nothing, and on the CPU).

torch is optional: :func:`torch_missing` says why these checks cannot run without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from kvspec.gpu_checks.checks import Check, compare
from kvspec.gpu_checks.footprint import DTYPE_BYTES, KVBlockShape

if TYPE_CHECKING:
    import torch

MISSING_TORCH = "torch is not installed (install the kit's gpu extra: pip install 'kvspec[gpu]')"


def torch_missing() -> str | None:
    """Why torch cannot be used here, or None when it imports."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:
        return f"{MISSING_TORCH}: {exc}"
    return None


def torch_dtype(name: str) -> torch.dtype | None:
    """torch's dtype object for a table name, or None when this torch build (or torch itself) lacks it."""
    try:
        import torch
    except ImportError:
        return None

    found = getattr(torch, name, None)
    return found if isinstance(found, torch.dtype) else None


def check_dtype_table(table: dict[str, int] | None = None) -> tuple[list[Check], list[str]]:
    """Compare an element-size table (the kit's by default) with torch; also list the dtypes torch lacks."""
    import torch

    table = DTYPE_BYTES if table is None else table
    checks: list[Check] = []
    absent: list[str] = []
    for name, size in sorted(table.items()):
        dtype = torch_dtype(name)
        if dtype is None:
            absent.append(name)
            continue
        checks.append(compare(f"{name}: finfo bits / 8", size, torch.finfo(dtype).bits // 8))
        checks.append(compare(f"{name}: element_size()", size, torch.empty((), dtype=dtype).element_size()))
    return checks, absent


def tensor_bytes(shape: KVBlockShape, device: str = "meta") -> tuple[int, int]:
    """(numel x element_size, storage nbytes) of one block's per-layer tensor on ``device``."""
    import torch

    dtype = torch_dtype(shape.dtype)
    if dtype is None:
        raise ValueError(f"this torch build ({torch.__version__}) has no {shape.dtype}")
    tensor = torch.empty(shape.tensor_shape, dtype=dtype, device=device)
    return tensor.numel() * tensor.element_size(), tensor.untyped_storage().nbytes()


def check_tensor_bytes(
    shapes: Iterable[KVBlockShape],
    devices: tuple[str, ...] = ("meta", "cpu"),
    formula: Callable[[KVBlockShape], int] | None = None,
) -> list[Check]:
    """The kit's per-layer formula (or ``formula``, to show the check bites) against torch's tensor sizes."""
    kit = formula or (lambda s: s.bytes_per_layer)
    checks: list[Check] = []
    for shape in shapes:
        if torch_dtype(shape.dtype) is None:
            continue
        label = f"{shape.tensor_shape} {shape.dtype}"
        for device in devices:
            numel_bytes, storage_bytes = tensor_bytes(shape, device)
            checks.append(compare(f"{label} on {device}: numel x element_size", kit(shape), numel_bytes))
            checks.append(compare(f"{label} on {device}: storage nbytes", kit(shape), storage_bytes))
    return checks
