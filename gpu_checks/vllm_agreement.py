"""Agreement of the kit's KV block size with vLLM's: its KV cache spec, and a live server's block budget.

Invariants:
- page size: for a model configuration, vLLM's ``FullAttentionSpec(...).page_size_bytes``
  (one block of one layer) equals :attr:`footprint.KVBlockShape.bytes_per_layer`;
- budget: a server given ``kv_cache_memory_bytes`` of KV memory reports ``num_gpu_blocks``
  blocks with ``num_gpu_blocks x bytes_per_block <= budget`` (they fit), and, unless
  ``--num-gpu-blocks-override`` was given, ``num_gpu_blocks == budget // bytes_per_block``
  (it uses the whole budget, as vLLM's ``available_memory // bytes_per_block`` does).

vLLM is optional: :func:`kvspec.vllm_env.vllm_missing` says why the in-process check cannot run. The
comparison functions take the other side as an argument, so their logic is tested
without vLLM (and a wrong formula is shown to be caught).
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kvspec.gpu_checks.checks import Check, compare
from kvspec.gpu_checks.footprint import KVBlockShape, blocks_in_budget

PageSizeOf = Callable[[KVBlockShape], int]


def vllm_page_size(shape: KVBlockShape) -> int:
    """vLLM's own page size in bytes for one layer of ``shape``: ``FullAttentionSpec.page_size_bytes``."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    spec = FullAttentionSpec(
        block_size=shape.block_tokens,
        num_kv_heads=shape.kv_heads,
        head_size=shape.head_dim,
        dtype=getattr(torch, shape.dtype),
    )
    return int(spec.page_size_bytes)


def kit_page_size(shape: KVBlockShape) -> int:
    """The kit's figure for the same thing: one block of one layer."""
    return shape.bytes_per_layer


def check_page_sizes(
    shapes: Iterable[KVBlockShape],
    reference: PageSizeOf | None = None,
    kit: PageSizeOf = kit_page_size,
) -> list[Check]:
    """Compare the kit's per-layer block size with ``reference`` (vLLM's, by default) for each shape.

    Both sides are arguments so that the comparison itself can be shown to catch a wrong
    formula (one that forgets the factor 2 for K and V, say) without vLLM installed.
    """
    ref = vllm_page_size if reference is None else reference
    return [
        compare(
            f"page size {shape.tensor_shape} {shape.dtype} ({shape.num_layers} layers)",
            ref(shape),
            kit(shape),
            detail=f"model: {ref(shape) * shape.num_layers} vs {kit(shape) * shape.num_layers} bytes per block",
        )
        for shape in shapes
    ]


def shape_from_hf_config(config: Mapping[str, Any], block_tokens: int, dtype: str | None = None) -> KVBlockShape:
    """The KV block shape of a Hugging Face ``config.json`` (decoder with full attention).

    head_dim is the config's ``head_dim`` when present, else ``hidden_size // num_attention_heads``;
    KV heads default to the attention heads (no GQA); dtype defaults to the config's ``torch_dtype``
    (or ``dtype``).
    """
    try:
        heads = int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
        kv_heads = int(config.get("num_key_value_heads") or heads)
        layers = int(config["num_hidden_layers"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a decoder config with attention sizes: {exc!r}") from exc
    chosen = dtype or str(config.get("torch_dtype") or config.get("dtype") or "")
    if not chosen:
        raise ValueError("the config names no dtype: pass one")
    return KVBlockShape(
        block_tokens=block_tokens, kv_heads=kv_heads, head_dim=head_dim, dtype=chosen, num_layers=layers
    )


_INFO_LINE = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.MULTILINE)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_cache_config_info(metrics_text: str) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info`` in a Prometheus /metrics page; ValueError if absent."""
    match = _INFO_LINE.search(metrics_text)
    if match is None:
        raise ValueError("no vllm:cache_config_info line in the metrics page")
    return dict(_LABEL.findall(match.group("labels")))


def check_budget(num_blocks: int, shape: KVBlockShape, budget_bytes: int, *, overridden: bool = False) -> list[Check]:
    """A server's block count against its KV memory budget (see the module's invariants)."""
    used = num_blocks * shape.bytes_per_block
    checks = [
        Check(
            name="blocks x bytes_per_block fits the KV cache budget",
            held=used <= budget_bytes,
            expected=f"<= {budget_bytes}",
            measured=used,
            detail=f"{num_blocks} blocks x {shape.bytes_per_block} B",
        )
    ]
    if not overridden:
        checks.append(
            compare(
                "num_gpu_blocks == budget // bytes_per_block",
                blocks_in_budget(budget_bytes, shape),
                num_blocks,
                detail=f"budget {budget_bytes} B, {shape.bytes_per_block} B per block",
            )
        )
    return checks


def check_live_server(
    base_url: str, shape: KVBlockShape, budget_bytes: int, *, overridden: bool = False, timeout: float = 10.0
) -> tuple[list[Check], dict[str, str]]:
    """Read a running server's /metrics and check its block count against ``budget_bytes``.

    The block size the server reports must equal ``shape.block_tokens`` (a check too).
    Returns the checks and the ``cache_config_info`` labels it read.
    """
    with urllib.request.urlopen(f"{base_url.rstrip('/')}/metrics", timeout=timeout) as response:
        text = response.read().decode()
    info = parse_cache_config_info(text)
    try:
        num_blocks = int(info["num_gpu_blocks"])
        block_size = int(info["block_size"])
    except (KeyError, ValueError) as exc:
        raise ValueError(f"cache_config_info lacks num_gpu_blocks/block_size: {info}") from exc
    checks = [compare("server block_size == shape.block_tokens", shape.block_tokens, block_size)]
    return checks + check_budget(num_blocks, shape, budget_bytes, overridden=overridden), info
