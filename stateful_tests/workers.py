"""``kvspec check --workers N``: one check per worker process, each with its own seed, merged into one report.

Seed contract. A run of seed ``s`` with ``N`` workers runs, in worker ``i``, the check of seed
:func:`worker_seed` ``(s, i)``: ``s`` itself for worker 0, and for ``i > 0`` the first four bytes
(big-endian) of ``sha256(b"kvspec-worker:<s>:<i>")``. So ``--seed s --workers N`` replays the
whole run, worker ``i`` alone is ``kvspec check --seed <its seed>`` (the report's ``workers``
rows name it), and ``--workers 1`` is the one-process run of seed ``s``, unchanged. Without
``--seed``, ``s`` is 0 under a derandomized profile (ci), as the swarm engine's default,
and a drawn one otherwise; the report names it.

Each worker is a forked process (``multiprocessing``, the ``fork`` context, as the adapters'
own children: adapters/isolation.py) running :func:`.dispatch.check_adapter` with its seed,
its own cases folder (``<cases-dir>/worker-<i>``, so no two workers write one file) and the
shared example database (a folder or Redis: both take concurrent writers); its adapter runs in
its own child under the step timeout as in a one-process run. Each sends its report's JSON
back through a pipe; :func:`kvspec.report_merge.merge_reports` makes the one report (status:
1 if any worker found a violation, else 2 if any could not run, docs/workers.md). A worker
that dies before it reports is a part with status ``error``. Each worker runs in a process group of
its own; an interrupt of the parent (Ctrl-C, SIGTERM) is passed to each worker once, and each ends
with the report of what it had done (status ``interrupted``, exit 2, unless one found a violation).
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import random
import signal
import sys
import time
from dataclasses import replace
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, cast

from kvspec import stop
from kvspec.adapter import AdapterFactory
from kvspec.adapters.isolation import IsolatedAdapter, track, untrack
from kvspec.report import Report
from kvspec.report_merge import merge_reports, report_from_json

from .dispatch import check_adapter
from .findings import not_started
from .options import Options

SEED_BITS = 32


def worker_seed(seed: int, index: int) -> int:
    """The seed worker ``index`` of a run seeded ``seed`` runs: ``seed`` for worker 0, a digest otherwise."""
    if index == 0:
        return seed
    digest = hashlib.sha256(f"kvspec-worker:{seed}:{index}".encode()).digest()
    return int.from_bytes(digest[: SEED_BITS // 8], "big")


def base_seed(options: Options) -> int:
    """The run's seed ``s``: the given one; else 0 under a derandomized profile, a drawn one otherwise."""
    if options.seed is not None:
        return options.seed
    return 0 if options.profile.derandomize else random.SystemRandom().getrandbits(SEED_BITS)


def _work(factory: AdapterFactory, name: str, options: Options, conn: Connection) -> None:
    """A worker's body: its check's report JSON down the pipe. Its own process group: a terminal's Ctrl-C
    reaches the parent only, which passes one SIGINT on to each worker (run_workers)."""
    os.setpgid(0, 0)
    try:
        report = check_adapter(factory, name, options)
    except BaseException as exc:
        report = not_started(name, options, "interrupted" if isinstance(exc, KeyboardInterrupt) else "error", repr(exc))
    conn.send(report.to_json())
    conn.close()


def _is_live(factory: AdapterFactory, options: Options) -> bool | str:
    """Whether the adapter drives a live server (True/False), or why it could not be built (a str)."""
    try:
        adapter = IsolatedAdapter(factory, options.step_timeout) if options.isolate else factory()
        try:
            return adapter.capabilities.live
        finally:
            adapter.close()
    except Exception as exc:
        return f"the adapter could not start: {type(exc).__name__}: {exc}"


def _collect(
    running: dict[Connection, tuple[int, BaseProcess]], parts: dict[int, Report], name: str, options: Options, seed: int
) -> bool:
    """Wait for every worker's report into ``parts`` (a worker that died: an error part); whether interrupted."""
    interrupted = False
    while running:
        try:
            ready = wait(list(running), timeout=0.2)
            if stop.requested():  # a KeyboardInterrupt swallowed by a callback (kvspec.stop)
                raise KeyboardInterrupt
        except KeyboardInterrupt:  # each worker is told once, stops, and sends what it has (its interrupted report)
            stop.clear()
            if not interrupted:
                for _, process in running.values():
                    if process.pid is not None:
                        os.kill(process.pid, signal.SIGINT)
            interrupted = True
            continue
        for conn in cast(list[Connection], ready):
            i, process = running.pop(conn)
            try:
                parts[i] = report_from_json(cast(dict[str, Any], conn.recv()))
            except (EOFError, OSError):
                process.join()
                why = f"worker {i} exited with status {process.exitcode} before it reported"
                parts[i] = not_started(name, replace(options, seed=worker_seed(seed, i)), "error", why)
            process.join()
            untrack(process)
            if not options.quiet:
                print(f"  ... worker {i} done: {parts[i].status}, {parts[i].steps} steps", file=sys.stderr, flush=True)
    return interrupted


def run_workers(factory: AdapterFactory, name: str, options: Options, workers: int) -> Report:
    """Run the check in ``workers`` processes (the module docstring's seed contract) and merge their reports.

    ``workers`` 1 is :func:`.dispatch.check_adapter` itself, in this process.
    """
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    if workers == 1:
        return check_adapter(factory, name, options)
    t0 = time.perf_counter()
    seed = base_seed(options)
    live = _is_live(factory, options)
    if live is not False:
        why = live if isinstance(live, str) else "--workers drives in-process adapters; a live one runs alone"
        return not_started(name, replace(options, seed=seed), "error", why)
    ctx = multiprocessing.get_context("fork")
    running: dict[Connection, tuple[int, BaseProcess]] = {}
    parts: dict[int, Report] = {}
    try:
        for i in range(workers):
            mine = replace(options, seed=worker_seed(seed, i), cases_dir=options.cases_dir / f"worker-{i}", quiet=True)
            receive, send = ctx.Pipe(duplex=False)
            worker = ctx.Process(target=_work, args=(factory, name, mine, send), name=f"kvspec-worker-{i}")
            try:
                worker.start()
            except OSError as exc:  # a process limit, no memory: the kit could not run, nothing was found
                receive.close()
                send.close()
                why = f"could not start worker {i} of {workers}: {exc.strerror or exc}"
                return not_started(name, replace(options, seed=seed), "error", why)
            track(worker)  # a second interrupt (the kit exits at once) kills it: its own group hears no Ctrl-C
            send.close()
            running[receive] = (i, worker)
        interrupted = _collect(running, parts, name, options, seed)
    finally:  # only when something escaped (a second interrupt, an error here): no worker outlives the run
        for _, process in running.values():
            process.kill()
            process.join()
            untrack(process)
    ordered = [parts[i] for i in range(workers)]
    report = merge_reports(
        ordered,
        seed=seed,
        duration_s=time.perf_counter() - t0,
        title=f"kvspec check: adapter {name} {ordered[0].adapter_version}, profile {options.profile.name}, "
        f"seed {seed}, {workers} workers, engine {options.engine}",
        label="worker",
    )
    if interrupted and report.status == "passed":
        report.status, report.error = "interrupted", "interrupted"
    rate = report.steps / report.duration_s if report.duration_s else 0.0
    report.details.insert(
        1, f"{report.examples} examples, {report.steps} steps in {report.duration_s:.1f} s ({rate:.0f} steps/s)"
    )
    return report


__all__ = ["base_seed", "run_workers", "worker_seed"]
