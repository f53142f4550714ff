"""A tiny vLLM OpenAI server started by the kit, always stopped again.

:class:`TinyServer` builds a random-weight Llama with a word-level tokenizer in a private
temp folder (nothing is downloaded), starts ``python -m vllm.entrypoints.openai.api_server``
on 127.0.0.1 with prefix caching, a small block pool (so capacity pressure is reachable),
prompt token details and KV cache events on ``ipc://`` endpoints inside that folder (never a
wildcard bind), and waits for ``/health``. The invariant it keeps: once :meth:`TinyServer.start`
has spawned the server, its whole process group is killed on :meth:`TinyServer.stop`, on
leaving the ``with`` block (error and Ctrl-C included) and at interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from kvspec.adapter import ServerStartError
from kvspec.vllm_env import vllm_missing

from .client import healthy, served_model

TINY_CONFIG: dict[str, Any] = {
    "vocab_size": 1024,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,  # the CPU attention kernel's minimum
    "max_position_embeddings": 512,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
EVENTS_TOPIC = "kv-events"
SERVED_MODEL_NAME = "kvspec-tiny"
LOG_TAIL_CHARS = 4000


def server_missing() -> str | None:
    """Why this interpreter cannot run the server (vLLM, transformers or torch missing), or None."""
    return vllm_missing("transformers", "torch")


def build_tiny_model(folder: Path, config: dict[str, Any] | None = None) -> dict[str, Any]:
    """Save a random bf16 Llama with a word-level tokenizer in ``folder``; return its config.json.

    Token ``t<i>`` has id i (0-2 are unk, bos, eos), so token-id prompts need no tokenizer round trip.
    """
    import torch

    # vLLM's own dependencies, not the kit's: imported by name, so type checking needs neither.
    tk: Any = importlib.import_module("tokenizers")
    tf: Any = importlib.import_module("transformers")

    shape = config or TINY_CONFIG
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(**shape)).to(torch.bfloat16)
    model.save_pretrained(folder)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"t{i}": i for i in range(3, shape["vocab_size"])}
    core = tk.Tokenizer(tk.models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = tk.pre_tokenizers.Whitespace()
    tokenizer = tf.PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    tokenizer.save_pretrained(folder)
    saved: dict[str, Any] = json.loads((folder / "config.json").read_text())
    return saved


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class ServerConfig:
    """The server's shape. ``num_gpu_blocks`` includes vLLM's reserved null block (usable = n - 1).

    ``num_gpu_blocks=None`` lets vLLM size the pool from ``kv_cache_memory_bytes``.
    """

    block_size: int = 32  # a multiple of 32 on the CPU backend with prefix caching
    num_gpu_blocks: int | None = 64
    kv_cache_memory_bytes: int = 4 * 1024 * 1024
    max_model_len: int = 512
    max_num_seqs: int = 8
    prefix_caching: bool = True
    kv_events: bool = True
    dev_mode: bool = True  # POST /reset_prefix_cache
    startup_timeout_s: float = 240.0
    extra_args: tuple[str, ...] = ()
    model: dict[str, Any] = field(default_factory=lambda: dict(TINY_CONFIG))


@dataclass(frozen=True)
class Endpoints:
    """Where a running server answers: HTTP, the KV event PUB socket and its replay ROUTER socket."""

    url: str
    events: str | None
    replay: str | None
    topic: str = EVENTS_TOPIC
    model: str = SERVED_MODEL_NAME

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "events": self.events, "replay": self.replay, "topic": self.topic, "model": self.model}


def attach(url: str, events: str | None = None, replay: str | None = None, topic: str = "") -> Endpoints:
    """Endpoints of a server the kit did not start: its model name is read from /v1/models."""
    base = url.rstrip("/")
    return Endpoints(base, events, replay, topic=topic, model=served_model(base))


def wait_healthy(url: str, server: subprocess.Popen[bytes], timeout: float) -> str | None:
    """None once GET /health answers 200; else why not (the server exited, or the time ran out)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return f"the server exited with code {server.returncode} before it was healthy"
        if healthy(url, timeout=2):
            return None
        time.sleep(0.5)
    return f"the server was not healthy within {timeout:.0f} s"


def stop_process_group(server: subprocess.Popen[bytes], grace_s: float = 20.0) -> None:
    """SIGTERM the server's process group (the API server and its engine core), SIGKILL it if it lingers."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.wait(timeout=grace_s)
    # The engine core may outlive the API server's exit: kill whatever is left of the group.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.wait(timeout=10)
    # The engine core's processes are reaped by init, not by us: return once none of them still runs.
    deadline = time.monotonic() + 10
    while group_alive(server.pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs. Zombies are dead (only init's reaping is left)."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for stat in proc.glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid pgrp ...": comm may hold spaces, so split after its closing paren.
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


class TinyServer:
    """``with TinyServer() as ep: ...`` runs a tiny vLLM server for the block; ``ep`` is its :class:`Endpoints`.

    Everything it writes (model, tokenizer, ipc sockets, server.log) lives in one private temp folder,
    removed on stop unless ``workdir`` was given.
    """

    def __init__(self, config: ServerConfig | None = None, *, workdir: Path | None = None, python: str = "") -> None:
        self.config = config or ServerConfig()
        self.python = python or sys.executable
        self._given_workdir = workdir
        self.workdir: Path | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.endpoints: Endpoints | None = None
        self.command: list[str] = []
        self.startup_s: float | None = None
        self.model_config: dict[str, Any] = {}

    @property
    def log_path(self) -> Path | None:
        return self.workdir / "server.log" if self.workdir else None

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        path = self.log_path
        if path is None or not path.exists():
            return ""
        return path.read_text(errors="replace")[-chars:]

    def _command(self, model_dir: Path, port: int, events: str, replay: str) -> list[str]:
        c = self.config
        cmd = [
            self.python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(model_dir), "--served-model-name", SERVED_MODEL_NAME,
            "--host", "127.0.0.1", "--port", str(port),
            "--block-size", str(c.block_size), "--kv-cache-memory-bytes", str(c.kv_cache_memory_bytes),
            "--max-model-len", str(c.max_model_len), "--max-num-seqs", str(c.max_num_seqs),
            "--enforce-eager", "--dtype", "bfloat16", "--enable-prompt-tokens-details",
        ]  # fmt: skip
        if c.num_gpu_blocks is not None:
            cmd += ["--num-gpu-blocks-override", str(c.num_gpu_blocks)]
        cmd.append("--enable-prefix-caching" if c.prefix_caching else "--no-enable-prefix-caching")
        if c.kv_events:
            events_config = {
                "enable_kv_cache_events": True,
                "publisher": "zmq",
                "endpoint": events,
                "replay_endpoint": replay,
                "topic": EVENTS_TOPIC,
            }
            cmd += ["--kv-events-config", json.dumps(events_config)]
        return cmd + list(c.extra_args)

    def start(self) -> Endpoints:
        """Build the model, spawn the server and wait for /health; raise :class:`ServerStartError` if it fails."""
        if self.process is not None:
            raise RuntimeError("TinyServer already started")
        why = server_missing() if self.python == sys.executable else None
        if why is not None:
            raise ServerStartError(why)
        if self._given_workdir is not None:
            self._given_workdir.mkdir(parents=True, exist_ok=True)
            self.workdir = self._given_workdir
        else:
            self.workdir = Path(tempfile.mkdtemp(prefix="kvspec-vllm-live-"))
        os.chmod(self.workdir, 0o700)  # the ipc sockets live here: private to this user
        atexit.register(self.stop)
        try:
            model_dir = self.workdir / "tiny-llama"
            model_dir.mkdir(exist_ok=True)
            self.model_config = build_tiny_model(model_dir, self.config.model)
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            events = f"ipc://{self.workdir / 'kv-events.sock'}"
            replay = f"ipc://{self.workdir / 'kv-replay.sock'}"
            self.command = self._command(model_dir, port, events, replay)
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
            if self.config.dev_mode:
                env["VLLM_SERVER_DEV_MODE"] = "1"
            started = time.monotonic()
            with (self.workdir / "server.log").open("wb") as log:
                # A new session: the server and its engine-core child form one group that stop() kills.
                self.process = subprocess.Popen(
                    self.command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
                )
            why = wait_healthy(url, self.process, self.config.startup_timeout_s)
            self.startup_s = round(time.monotonic() - started, 1)
            if why is not None:
                raise ServerStartError(why, self.log_tail())
        except BaseException:
            self.stop()
            raise
        kv = self.config.kv_events
        self.endpoints = Endpoints(url, events if kv else None, replay if kv else None)
        return self.endpoints

    def stop(self) -> None:
        """Kill the server's process group and remove the private folder (idempotent, safe at exit)."""
        process, self.process = self.process, None
        if process is not None:
            stop_process_group(process)
        atexit.unregister(self.stop)
        if self.workdir is not None and self._given_workdir is None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def __enter__(self) -> Endpoints:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


__all__ = [
    "EVENTS_TOPIC",
    "SERVED_MODEL_NAME",
    "TINY_CONFIG",
    "Endpoints",
    "ServerConfig",
    "ServerStartError",
    "TinyServer",
    "attach",
    "build_tiny_model",
    "free_port",
    "server_missing",
    "stop_process_group",
    "wait_healthy",
]
