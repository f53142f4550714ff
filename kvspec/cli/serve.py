"""``kvspec serve-tiny``: the kit's tiny vLLM server in the foreground, until Ctrl-C or SIGTERM.

Exit 0 after a clean stop, 2 when the server did not come up or died.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from kvspec import jsonio
from kvspec.adapters.vllm_live.server import ServerConfig, ServerStartError, TinyServer
from kvspec.bounds import at_least_one, first_problem, positive
from kvspec.report import ExitCode

from .common import fail, unwritable


def register(subparsers: Any) -> None:
    """Add ``serve-tiny`` to the ``kvspec`` command line; the handler is ``args.handler``."""
    parser = subparsers.add_parser(
        "serve-tiny",
        help="run the kit's tiny vLLM server in the foreground (Ctrl-C stops it)",
        description=(
            "Build a tiny random-weight model (nothing is downloaded) and serve it with vLLM's OpenAI server on "
            "127.0.0.1: prefix caching on, a small block pool, prompt token details, KV events on ipc:// in a "
            "private temp folder. Prints the URL and event endpoints, then runs until Ctrl-C or SIGTERM, and "
            "always stops the server. Exit 0 after a clean stop, 2 when the server did not come up or died."
        ),
    )
    defaults = ServerConfig()
    parser.add_argument("--num-gpu-blocks", type=int, default=defaults.num_gpu_blocks, help="pool size incl. null")
    parser.add_argument("--block-size", type=int, default=defaults.block_size, help="tokens per block")
    parser.add_argument("--max-model-len", type=int, default=defaults.max_model_len)
    parser.add_argument("--max-num-seqs", type=int, default=defaults.max_num_seqs)
    parser.add_argument("--timeout", type=float, default=defaults.startup_timeout_s, help="seconds to wait for health")
    parser.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write the endpoints here")
    parser.set_defaults(handler=serve_tiny)


def serve_tiny(args: argparse.Namespace) -> int:
    """Run :class:`TinyServer` until interrupted; print its endpoints once it is healthy."""
    sizes = {"--num-gpu-blocks": args.num_gpu_blocks, "--block-size": args.block_size}
    sizes |= {"--max-model-len": args.max_model_len, "--max-num-seqs": args.max_num_seqs}
    problems = [at_least_one(name, value) for name, value in sizes.items()]
    problem = first_problem(*problems, positive("--timeout", args.timeout)) or unwritable(args.json)
    if problem is not None:
        return fail(problem, "kvspec serve-tiny")
    config = ServerConfig(
        block_size=args.block_size,
        num_gpu_blocks=args.num_gpu_blocks,
        max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs,
        startup_timeout_s=args.timeout,
    )
    # Ctrl-C and SIGTERM both raise KeyboardInterrupt here (kvspec.cli.common.interrupts): a clean stop.
    server = TinyServer(config)
    try:
        print("kvspec serve-tiny: building the model and starting vLLM ...", file=sys.stderr, flush=True)
        endpoints = server.start()
        info = {
            **endpoints.to_json(),
            "startup_s": server.startup_s,
            "pid": server.process.pid if server.process else None,
        }
        for key in ("url", "events", "replay", "model", "startup_s", "pid"):
            print(f"{key}={info[key]}", flush=True)
        if args.json is not None:
            jsonio.write(args.json, info)
        while server.running:
            time.sleep(0.5)
        print(f"kvspec serve-tiny: the server exited\n{server.log_tail()}", file=sys.stderr)
        return ExitCode.COULD_NOT_RUN
    except ServerStartError as exc:
        print(f"kvspec serve-tiny: {exc}", file=sys.stderr)
        return ExitCode.COULD_NOT_RUN
    except KeyboardInterrupt:
        print("kvspec serve-tiny: stopping", file=sys.stderr)
        return ExitCode.DONE
    finally:
        server.stop()
