"""Run ``kvspec`` as a user would: a fresh process, with tests/ importable, under a wall-clock limit."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

TESTS = Path(__file__).resolve().parent


@dataclass
class Run:
    code: int | None  # None: still running at the limit (it was killed)
    out: str
    err: str
    seconds: float


def kvspec(
    *args: str,
    limit: float = 120.0,
    cwd: Path | None = None,
    interrupt_after: float | None = None,
    signals: Sequence[tuple[float, int]] = (),
    from_held: bool = False,
    from_file: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> Run:
    """``python -m kvspec.cli ARGS``; ``signals``: (seconds after the start, signal) to send, in order
    (``interrupt_after=t`` is ``signals=[(t, SIGINT)]``); ``from_held``: count those seconds from the moment
    the process holds SIGINT back (its parse has begun), not from its start, so a slow start on loaded cores
    does not move the signal before it; ``from_file``: count them from the moment that file exists; ``env``:
    variables set on top of this process's (a ``PYTHONPATH`` there comes before tests/)."""
    plan = list(signals) or ([(interrupt_after, signal.SIGINT)] if interrupt_after is not None else [])
    extra = dict(env or {})
    path = [extra.pop("PYTHONPATH", ""), str(TESTS), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, **extra, PYTHONPATH=os.pathsep.join(p for p in path if p))
    command: Sequence[str] = [sys.executable, "-m", "kvspec.cli", *args]
    t0 = time.monotonic()
    proc = subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        if from_held:
            _wait_until_sigint_held(proc, t0 + limit)
            t0 = time.monotonic()
        if from_file is not None:
            while proc.poll() is None and not from_file.exists() and time.monotonic() < t0 + limit:
                time.sleep(0.01)
            t0 = time.monotonic()
        for at, sig in plan:
            try:
                proc.wait(timeout=max(0.0, at - (time.monotonic() - t0)))
                break
            except subprocess.TimeoutExpired:
                proc.send_signal(sig)
        out, err = proc.communicate(timeout=limit)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        _kill_tree(proc.pid)
        out, err = proc.communicate()
        code = None
    return Run(code, out, err, time.monotonic() - t0)


def _kill_tree(pid: int) -> None:
    """SIGKILL the process, its group and every descendant: a worker in a process group of its own
    (``--workers``) holds the pipes open, and ``communicate`` would wait for it past the limit."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        tree.append(todo.pop())
        todo.extend(children.get(tree[-1], []))
    for member in tree:
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(member, signal.SIGKILL)


def _wait_until_sigint_held(proc: subprocess.Popen[str], deadline: float) -> None:
    """Poll /proc/PID/status until SIGINT is in the process's blocked mask (or it ended, or the deadline)."""
    status = Path(f"/proc/{proc.pid}/status")
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            fields = dict(line.split(":", 1) for line in status.read_text().splitlines() if ":" in line)
        except OSError:
            return
        if int(fields.get("SigBlk", "0").strip(), 16) & (1 << (signal.SIGINT - 1)):
            return
        time.sleep(0.005)
