"""The launcher of the real server: the kit's tiny vLLM server, one fresh process per run.

Its KV pool is ``--num-gpu-blocks-override`` blocks; the byte budget vLLM is given only has to hold
them, so it is the blocks' size from :mod:`kvspec.gpu_checks.footprint` (bf16), at least 4 MiB.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from kvspec.adapters.vllm_live.server import TINY_CONFIG, ServerConfig, ServerStartError, TinyServer
from kvspec.gpu_checks.vllm_agreement import shape_from_hf_config

from .driver import ServerDidNotStart

# Overrides of the server module's TINY_CONFIG. "tiny" (2 layers, hidden 128) prefills 256 tokens in
# well under a millisecond of compute, less than a step's fixed cost: a prefix hit cannot show in TTFT.
# "small" (4 layers, hidden 512, ~13M parameters) makes the prefill a hit skips cost tens of ms on a CPU.
MODEL_SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {},
    "small": {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 4, "num_attention_heads": 8,
              "num_key_value_heads": 2, "head_dim": 64},
}  # fmt: skip

MIN_KV_BYTES = 4 << 20


class TinyVllmLauncher:
    """Launcher of the kit's tiny vLLM server (adapters/vllm_live/server.py), one fresh process per call.

    KV events are off: the benchmark reads /metrics and usage only, and both arms get the same flags.
    After a run, ``command`` and ``model_config`` hold the last server's command line and config.json.
    """

    def __init__(
        self, block_size: int, num_blocks: int, max_num_seqs: int, startup_timeout_s: float, model: str = "tiny"
    ) -> None:
        shape = TINY_CONFIG | MODEL_SHAPES[model]
        block = shape_from_hf_config(shape, block_size, "bfloat16")
        self.model = model
        self.config = ServerConfig(
            block_size=block_size,
            num_gpu_blocks=num_blocks,
            kv_cache_memory_bytes=max(MIN_KV_BYTES, block.bytes_per_block * num_blocks),
            max_num_seqs=max_num_seqs,
            kv_events=False,
            dev_mode=False,
            startup_timeout_s=startup_timeout_s,
            model=shape,
        )
        self.command: list[str] = []
        self.model_config: dict[str, Any] = {}

    def model_record(self) -> dict[str, Any]:
        """The model as the result records it: what kind it is, and the config.json of the last server."""
        kind = f"{self.model}: random-weight LlamaForCausalLM, bf16, word-level tokenizer"
        return {"kind": kind, **self.model_config}

    @contextlib.contextmanager
    def __call__(self) -> Iterator[str]:
        server = TinyServer(self.config)
        try:
            endpoints = server.start()  # stops what it spawned before raising
        except ServerStartError as exc:
            raise ServerDidNotStart(str(exc).split("\n--- server log")[0], exc.log_tail) from exc
        try:
            self.command, self.model_config = list(server.command), dict(server.model_config)
            yield endpoints.url
        finally:
            server.stop()
