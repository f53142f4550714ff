"""The entry point of ``kvspec bench live``: options in, the A/B run, the table printed, the JSON written.

:func:`run_benchmark` writes the JSON whatever happens: the whole result when the A/B ran, else
``error``, ``server_log_tail`` and the runs done so far when a server did not start or the run
was interrupted (KeyboardInterrupt; the CLI turns SIGTERM into one). :func:`redraw` prints the
table (and draws the plot) of a saved result without running anything.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvspec.report import ExitCode
from kvspec.vllm_env import vllm_release

from .driver import Launcher, ServerDidNotStart, run_ab
from .launcher import TinyVllmLauncher
from .render import plot, table
from .schema import SCHEMA_VERSION, schema_problems
from .workload import WorkloadShape

PREFIX = "kvspec bench live"


@dataclass(frozen=True)
class LiveOptions:
    """One benchmark: the workload, the servers it starts, and where its result goes.

    ``command`` is recorded in the JSON as the command that produced it.
    """

    shape: WorkloadShape = field(default_factory=WorkloadShape)
    pairs: int = 2
    block_size: int = 32  # the CPU backend's minimum with prefix caching
    num_blocks: int = 64  # the KV pool, vLLM's null block included
    max_num_seqs: int = 8
    model: str = "small"  # a key of launcher.MODEL_SHAPES
    startup_timeout_s: float = 240.0
    request_timeout_s: float = 120.0
    settle_s: float = 1.0  # between the last answer and the second /metrics read
    json_path: Path | None = None
    plot_path: Path | None = None
    quiet: bool = False
    command: tuple[str, ...] = ()

    def problems(self) -> list[str]:
        """What makes these options unusable (empty when they are fine)."""
        return self.shape.problems() + (["--pairs must be at least 1"] if self.pairs < 1 else [])


def configuration(options: LiveOptions) -> dict[str, Any]:
    """What the result was measured on: workload figures, server flags, software and machine."""
    shape = options.shape
    return {
        "requests": shape.requests,
        "prompt_tokens": shape.prompt_tokens,
        "shared_tokens": shape.shared_tokens,
        "output_tokens": shape.output_tokens,
        "concurrency": shape.concurrency,
        "pairs": options.pairs,
        "seed": shape.seed,
        "block_size": options.block_size,
        "num_blocks": options.num_blocks,
        "usable_blocks": options.num_blocks - 1,  # vLLM reserves block 0 as the null block
        "blocks_per_request": math.ceil((shape.prompt_tokens + shape.output_tokens) / options.block_size),
        "shared_prefix_blocks": shape.shared_tokens // options.block_size,
        "max_num_seqs": options.max_num_seqs,
        "model_shape": options.model,
        "vllm": vllm_release(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
    }


def _say(line: str) -> None:
    print(f"{PREFIX}: {line}", file=sys.stderr)


def _progress(quiet: bool) -> Callable[[str], None]:
    def say(line: str) -> None:
        if not quiet:
            print(line, file=sys.stderr, flush=True)

    return say


def _write_json(path: Path | None, result: dict[str, Any]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1) + "\n")


def _could_not_run(
    result: dict[str, Any], exc: BaseException, error: str, log_tail: str, started: float, path: Path | None
) -> ExitCode:
    """Write what there is of a benchmark that could not finish: why, the server's log tail, the runs done."""
    result |= {"error": error, "server_log_tail": log_tail, "runs": getattr(exc, "partial", [])}
    result |= {"duration_s": time.perf_counter() - started, "exit_code": ExitCode.COULD_NOT_RUN}
    _write_json(path, result)
    return ExitCode.COULD_NOT_RUN


def redraw(source: Path, plot_path: Path | None = None) -> ExitCode:
    """Print the table of a saved result (and draw its plot); COULD_NOT_RUN when it is not a complete result."""
    try:
        result = json.loads(source.read_text())
    except (OSError, ValueError) as exc:
        _say(f"cannot read {source}: {exc}")
        return ExitCode.COULD_NOT_RUN
    problems = schema_problems(result)
    if problems or result["exit_code"] != ExitCode.DONE:
        _say(f"{source} is not a complete result: {'; '.join(problems[:5])}")
        return ExitCode.COULD_NOT_RUN
    print(table(result))
    if plot_path is not None and not plot(result, plot_path):
        _say("matplotlib is not installed; no plot drawn")
    return ExitCode.DONE


def run_benchmark(options: LiveOptions, launcher: Launcher | None = None) -> ExitCode:
    """Run the A/B on fresh servers from ``launcher`` (the kit's tiny vLLM server by default).

    DONE when it ran (request failures are figures, not an error); COULD_NOT_RUN when the options
    are unusable, a server did not start, or the run was interrupted.
    """
    problems = options.problems()
    if problems:
        _say("; ".join(problems))
        return ExitCode.COULD_NOT_RUN
    result: dict[str, Any] = {
        "kvspec_bench_live": SCHEMA_VERSION,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": list(options.command),
        "configuration": configuration(options),
    }
    started = time.perf_counter()
    try:
        if launcher is None:
            launcher = TinyVllmLauncher(
                options.block_size, options.num_blocks, options.max_num_seqs, options.startup_timeout_s, options.model
            )
        result |= run_ab(
            launcher,
            options.shape,
            options.pairs,
            request_timeout=options.request_timeout_s,
            settle_s=options.settle_s,
            progress=_progress(options.quiet),
        )
    except KeyboardInterrupt as exc:
        _say("interrupted; the servers are stopped")
        return _could_not_run(result, exc, "interrupted", "", started, options.json_path)
    except (ServerDidNotStart, ImportError) as exc:
        tail = getattr(exc, "log_tail", "")
        _say(f"the server could not start: {exc}")
        if tail:
            print(f"--- server log (tail) ---\n{tail}", file=sys.stderr)
        return _could_not_run(result, exc, str(exc), tail, started, options.json_path)
    if isinstance(launcher, TinyVllmLauncher):
        result["configuration"]["model"] = launcher.model_record()
        result["configuration"]["server_command"] = launcher.command
    reported = result["runs"][0]["cache_config"] if result["runs"] else {}
    result["configuration"]["server_cache_config"] = reported
    result |= {"duration_s": time.perf_counter() - started, "exit_code": ExitCode.DONE}
    print(table(result))
    if options.plot_path is not None and not plot(result, options.plot_path):
        _say("matplotlib is not installed; no plot drawn")
        result["plot"] = None
    elif options.plot_path is not None:
        result["plot"] = str(options.plot_path)
    _write_json(options.json_path, result)
    return ExitCode.DONE
