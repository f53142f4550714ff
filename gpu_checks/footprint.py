"""Theoretical byte size of KV-cache blocks, from shape and dtype alone.

Invariant: one KV block of one attention layer holds a key and a value vector for
each of its token slots, for each KV head, so

    bytes_per_layer = 2 x block_tokens x kv_heads x head_dim x element_bytes(dtype)
    bytes_per_block = bytes_per_layer x num_layers

and a pool of ``capacity`` blocks (the spec's unit) occupies ``capacity x bytes_per_block``
bytes. A partial tail block still costs a whole block (the spec's tail rounding).

This module needs no torch: element sizes come from :data:`DTYPE_BYTES`, a table that
``gpu_checks.torch_crosscheck`` compares with ``torch.finfo(dtype).bits`` and
``Tensor.element_size()`` wherever torch is installed.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvspec.spec import Config
from kvspec.spec.ops import blocks_for

#: Bytes per element of the dtypes a KV cache is stored in, by torch's attribute name.
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2fnuz": 1,
}

#: Other spellings, as engines write them (vLLM's ``--kv-cache-dtype`` and ``--dtype``).
DTYPE_ALIASES: dict[str, str] = {
    "fp32": "float32",
    "float": "float32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}

#: The dtypes the issue names: the ones KV caches are actually kept in.
KV_DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")


def canonical_dtype(name: str) -> str:
    """The table's name for ``name`` (an alias, or ``torch.bfloat16``'s str form); ValueError if unknown."""
    if not isinstance(name, str):
        raise ValueError(f"dtype must be a name such as 'bfloat16', got {type(name).__name__} {name!r}")
    key = name.strip().lower().removeprefix("torch.")
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPE_BYTES:
        known = ", ".join(sorted(DTYPE_BYTES) + sorted(DTYPE_ALIASES))
        raise ValueError(f"unknown KV cache dtype {name!r}; known: {known}")
    return key


def element_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype`` (any spelling :func:`canonical_dtype` accepts)."""
    return DTYPE_BYTES[canonical_dtype(dtype)]


def _positive_int(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{field} must be an int, got {type(value).__name__} {value!r}")
    if value <= 0:
        raise ValueError(f"{field} must be positive, got {value}")
    return value


@dataclass(frozen=True)
class KVBlockShape:
    """The physical shape of one KV block: tokens per block, KV heads, head size, dtype, layers.

    ``dtype`` is stored under its canonical name (``"bf16"`` becomes ``"bfloat16"``).
    Every field is validated: a non-positive or non-integer size, or an unknown dtype,
    raises ValueError naming the field.
    """

    block_tokens: int
    kv_heads: int
    head_dim: int
    dtype: str
    num_layers: int = 1

    def __post_init__(self) -> None:
        for field in ("block_tokens", "kv_heads", "head_dim", "num_layers"):
            _positive_int(field, getattr(self, field))
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))

    @property
    def element_bytes(self) -> int:
        """Bytes of one element of this shape's dtype."""
        return DTYPE_BYTES[self.dtype]

    @property
    def tensor_shape(self) -> tuple[int, int, int, int]:
        """The per-layer tensor one block is, K and V stacked: (2, block_tokens, kv_heads, head_dim)."""
        return (2, self.block_tokens, self.kv_heads, self.head_dim)

    @property
    def bytes_per_layer(self) -> int:
        """Bytes of one block in one layer: 2 x block_tokens x kv_heads x head_dim x element size."""
        return 2 * self.block_tokens * self.kv_heads * self.head_dim * self.element_bytes

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one block across all ``num_layers`` layers."""
        return self.bytes_per_layer * self.num_layers

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token's K and V take across all layers (a full block's share per slot)."""
        return 2 * self.kv_heads * self.head_dim * self.element_bytes * self.num_layers

    def with_dtype(self, dtype: str) -> KVBlockShape:
        """The same shape stored in another dtype."""
        return KVBlockShape(self.block_tokens, self.kv_heads, self.head_dim, dtype, self.num_layers)

    def to_json(self) -> dict[str, int | str]:
        return {
            "block_tokens": self.block_tokens,
            "kv_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "dtype": self.dtype,
            "num_layers": self.num_layers,
            "element_bytes": self.element_bytes,
            "bytes_per_layer": self.bytes_per_layer,
            "bytes_per_block": self.bytes_per_block,
        }


def kv_bytes_for_pool(config: Config, shape: KVBlockShape) -> int:
    """Bytes of KV memory a spec pool of ``config.capacity`` blocks occupies on the device.

    The spec counts blocks (block and record granularity); this ties that count to bytes.
    ``config.block_size`` and ``shape.block_tokens`` must agree, or the two describe
    different pools: ValueError.
    """
    if not isinstance(config, Config):
        raise ValueError(f"config must be a kvspec.spec.Config, got {type(config).__name__}")
    if config.block_size != shape.block_tokens:
        raise ValueError(
            f"the spec's block_size ({config.block_size} tokens) differs from the shape's "
            f"block_tokens ({shape.block_tokens}): they describe different pools"
        )
    return config.capacity * shape.bytes_per_block


def kv_bytes_for_tokens(tokens: int, shape: KVBlockShape) -> int:
    """Bytes a request of ``tokens`` tokens holds: whole blocks, the partial tail included."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens must be a non-negative int, got {tokens!r}")
    return blocks_for(tokens, shape.block_tokens) * shape.bytes_per_block


def blocks_in_budget(budget_bytes: int, shape: KVBlockShape) -> int:
    """Whole blocks (all layers) that fit in ``budget_bytes`` of KV memory: floor division."""
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes < 0:
        raise ValueError(f"budget_bytes must be a non-negative int, got {budget_bytes!r}")
    return budget_bytes // shape.bytes_per_block


#: Published attention shapes of a few models (block size 16, bf16), for the CLI's table and the tests.
MODEL_SHAPES: dict[str, KVBlockShape] = {
    # 32 layers, 32 query heads, 8 KV heads (GQA), hidden 4096 -> head_dim 128.
    "llama-3-8b": KVBlockShape(block_tokens=16, kv_heads=8, head_dim=128, dtype="bfloat16", num_layers=32),
    # 80 layers, 64 query heads, 8 KV heads, hidden 8192 -> head_dim 128.
    "llama-3-70b": KVBlockShape(block_tokens=16, kv_heads=8, head_dim=128, dtype="bfloat16", num_layers=80),
    # 28 layers, 28 query heads, 4 KV heads, hidden 3584 -> head_dim 128.
    "qwen2.5-7b": KVBlockShape(block_tokens=16, kv_heads=4, head_dim=128, dtype="bfloat16", num_layers=28),
    # The random model the live-server checks build on CPU: 2 layers, 2 KV heads, head_dim 32, block 32.
    "tiny-llama-cpu": KVBlockShape(block_tokens=32, kv_heads=2, head_dim=32, dtype="bfloat16", num_layers=2),
}
