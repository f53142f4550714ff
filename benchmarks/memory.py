"""Peak memory and time of the spec on long prompts, and of a long ``kvspec check`` run.

Prints three tables, every figure measured in a fresh subprocess:
1. ``ledger``: LedgerModel alone, one admit of N tokens (block_size 16, a pool that
   holds it) then its release: peak traced Python memory (tracemalloc, in one
   process), and the peak RSS and seconds of the same two ops untraced (in another).
2. ``harness``: the same two ops through the Harness on the ``reference`` adapter
   (the spec's prediction and every invariant after each step).
3. ``check``: ``kvspec check --adapter reference --max-examples N``: the child's
   peak RSS and seconds, and whether the peak grows with N.

``--growth N`` runs one check of N examples in this process and prints the object
types whose live memory (a gc census: count and shallow size) grew most between
example N/5 and example N: what a long run keeps per example.

Usage: python benchmarks/memory.py [--tokens 1000 10000 100000] [--examples 200 2000 10000]
                                   [--growth N] [--json OUT]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

BLOCK_SIZE = 16
VOCAB = 32_000
MB = 1 << 20


def _prompt(n: int) -> tuple[int, ...]:
    rng = random.Random(n)
    return tuple(rng.randrange(VOCAB) for _ in range(n))


def _maxrss_mb(who: int = resource.RUSAGE_SELF) -> float:
    return resource.getrusage(who).ru_maxrss / 1024  # KiB on Linux


def measure_one(kind: str, n: int, traced: bool) -> dict[str, Any]:
    """In this (fresh) process: admit ``n`` tokens and release them, through the ledger or the harness.

    traced: the peak of tracemalloc; untraced: the seconds and the process's peak RSS.
    """
    from kvspec.adapters.reference_paged import ReferencePagedAdapter
    from kvspec.spec import Config, Op, Semantics
    from kvspec.spec.ledger import LedgerModel
    from kvspec.spec.ops import blocks_for
    from kvspec.stateful_tests import Harness

    prompt = _prompt(n)
    config = Config(capacity=blocks_for(n, BLOCK_SIZE) + 8, block_size=BLOCK_SIZE)
    ops = [Op("admit", "r0", prompt), Op("release", "r0")]
    rss0 = _maxrss_mb()
    if traced:
        tracemalloc.start()
    t0 = time.perf_counter()
    if kind == "ledger":
        model = LedgerModel(config, Semantics())
        statuses = [model.step(op).outcome.status for op in ops]
    else:
        harness = Harness(ReferencePagedAdapter(), config)
        statuses = [harness.step(op).status for op in ops]
    seconds = time.perf_counter() - t0
    assert statuses == ["ok", "ok"], statuses
    if traced:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return {"peak_traced_mb": round(peak / MB, 1)}
    return {"peak_rss_mb": round(_maxrss_mb(), 1), "rss_at_start_mb": round(rss0, 1), "seconds": round(seconds, 2)}


def _child(kind: str, n: int) -> dict[str, Any]:
    from kvspec.spec.ops import blocks_for

    row: dict[str, Any] = {"what": kind, "tokens": n, "blocks": blocks_for(n, BLOCK_SIZE)}
    for mode in ("traced", "untraced"):
        cmd = [sys.executable, __file__, "--one", kind, str(n), mode]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        row.update(json.loads(out.splitlines()[-1]))
    return row


def check_row(examples: int) -> dict[str, Any]:
    """``kvspec check`` in a child process: its peak RSS (wait4) and wall time."""
    kvspec = Path(sys.executable).with_name("kvspec")
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [str(kvspec), "check", "--adapter", "reference", "--max-examples", str(examples), "--quiet"]
        cmd += ["--cases-dir", tmp, "--report", str(report)]
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        data = json.loads(report.read_text()) if report.exists() else {}
    return {
        "max_examples": examples,
        "examples": data.get("examples"),
        "steps": data.get("steps"),
        "status": data.get("status", f"exit {os.waitstatus_to_exitcode(status)}"),
        "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
        "seconds": round(seconds, 1),
    }


def _census() -> tuple[Counter[str], Counter[str]]:
    """Live gc-tracked objects by type: how many, and their shallow sizes in bytes."""
    gc.collect()
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    for obj in gc.get_objects():
        kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
        counts[kind] += 1
        sizes[kind] += sys.getsizeof(obj)
    return counts, sizes


def growth(examples: int, top: int = 12) -> list[dict[str, Any]]:
    """The object types whose live memory grew most from the first fifth of a check to its end (a gc census)."""
    from kvspec.adapters import load
    from kvspec.stateful_tests import PROFILES, Options, Tally, run_check

    censuses: dict[int, tuple[Counter[str], Counter[str]]] = {}

    def progress(tally: Tally) -> None:
        if tally.examples in (examples // 5, examples) and tally.examples not in censuses:
            censuses[tally.examples] = _census()

    with tempfile.TemporaryDirectory() as tmp:
        run_check(
            load("reference"),
            "reference",
            Options(profile=PROFILES["ci"], max_examples=examples, cases_dir=Path(tmp)),
            progress=progress,
        )
    (count0, size0), (count1, size1) = censuses[examples // 5], censuses[examples]
    grown = sorted(size1, key=lambda kind: size0[kind] - size1[kind])[:top]
    return [
        {"grew_kb": round((size1[k] - size0[k]) / 1024, 1), "objects": count1[k] - count0[k], "type": k} for k in grown
    ]


def show(title: str, rows: list[dict[str, Any]]) -> None:
    print(title)
    keys = list(rows[0])
    widths = [max(len(k), *(len(str(r[k])) for r in rows)) for k in keys]
    print("  ".join(k.ljust(w) for k, w in zip(keys, widths, strict=True)))
    for r in rows:
        print("  ".join(str(r[k]).ljust(w) for k, w in zip(keys, widths, strict=True)))
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="*", default=[1_000, 10_000, 100_000])
    parser.add_argument("--examples", type=int, nargs="*", default=[200, 2_000, 10_000])
    parser.add_argument("--growth", type=int, default=0, help="census one check of this many examples in-process")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--one", nargs=3, metavar=("KIND", "N", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure_one(args.one[0], int(args.one[1]), args.one[2] == "traced")))
        return
    result: dict[str, Any] = {}
    for kind in ("ledger", "harness"):
        if args.tokens:
            result[kind] = [_child(kind, n) for n in args.tokens]
            show(f"{kind}: admit N tokens + release, block_size {BLOCK_SIZE}", result[kind])
    if args.examples:
        result["check"] = [check_row(n) for n in args.examples]
        show("kvspec check --adapter reference --max-examples N", result["check"])
    if args.growth:
        result["growth"] = growth(args.growth)
        show(f"live objects grown from example {args.growth // 5} to {args.growth} (gc census)", result["growth"])
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
