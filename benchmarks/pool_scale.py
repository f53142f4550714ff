"""Checked steps per second against the pool's size: incremental checking (deltas, the whole state every K
steps) against the full check of every step, at pools of 64, 1,024, 16,384 and 65,536 blocks.

Workload (seeded, scaled with the pool so that the pool fills and evicts at every size): the reference
adapter (lru, exact: the spec predicts every step) in its child process, as `kvspec check` runs it. First a
fill: unique prompts of pool/16 blocks admitted and released (kept cached) until every block has held a
cached prefix. Then the measured workload: pool/32 sessions (shared two-block prefixes, so hits and shared
blocks), up to pool/64 live requests, each a session's prefix and a unique suffix of 1-3 blocks, appended
to and released; every admission past the fill evicts cached blocks (the eviction counts are in the table).
The same harness measures, on the same pool, three windows: incremental (the whole state every K steps and
at the window's end), incremental with the whole state at the window's end only, and, switched to the full
check of every step (K=1, the adapter's full observation each step), the full window.

Writes docs/benchmarks/pool-scale.{json,md,png}. ``--quick`` (CI): shorter windows, under a minute.
``--adapter NAME`` measures another adapter that reports deltas (e.g. vllm-blockpool, in the vLLM venv) and
writes pool-scale-NAME.{json,md,png} (no png where matplotlib is not installed); ``--pools`` picks the sizes.

Usage: python benchmarks/pool_scale.py [--quick] [--k K] [--adapter NAME] [--pools 64,1024] [--out-dir DIR]
"""

from __future__ import annotations

import argparse
import platform
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvspec import jsonio
from kvspec.adapter import AdapterFactory
from kvspec.adapters import UnknownAdapter, load
from kvspec.adapters.isolation import IsolatedAdapter
from kvspec.report import ExitCode
from kvspec.spec import Config, Op
from kvspec.stateful_tests import Harness, Tally

ROOT = Path(__file__).resolve().parent.parent
POOLS = (64, 1024, 16384, 65536)
BLOCK_SIZE = 4
K_DEFAULT = 256


def fill_ops(pool: int) -> Iterator[Op]:
    """Unique prompts of pool/16 blocks, admitted and released with their blocks kept cached: 20 of them
    take every block of the pool through a cached prefix (the last ones evict the first ones' blocks)."""
    blocks = max(2, pool // 16)
    for n in range(20):
        tokens = tuple(range(n * blocks * BLOCK_SIZE, (n + 1) * blocks * BLOCK_SIZE))
        yield Op("admit", f"fill{n}", tokens)
        yield Op("release", f"fill{n}", keep=True)


class Workload:
    """The measured workload: sessions sharing two-block prefixes, unique suffixes, appends and releases."""

    def __init__(self, pool: int, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.sessions = max(2, pool // 32)
        self.live_max = max(2, pool // 64)
        self.live: list[str] = []
        self.n = 0
        self.base = 10**7  # token ids past the fill's

    def next(self) -> Op:
        rng = self.rng
        if len(self.live) < self.live_max and (not self.live or rng.random() < 0.5):
            session = rng.randrange(self.sessions)
            prefix = tuple(self.base + session * 2 * BLOCK_SIZE + i for i in range(2 * BLOCK_SIZE))
            start = self.base * 2 + self.n * 4 * BLOCK_SIZE
            suffix = tuple(range(start, start + rng.randint(1, 3) * BLOCK_SIZE + rng.randint(0, BLOCK_SIZE - 1)))
            req = f"r{self.n}"
            self.n += 1
            self.live.append(req)
            return Op("admit", req, prefix + suffix)
        if rng.random() < 0.4:
            self.n += 1
            return Op("append", rng.choice(self.live), tuple(range(self.n * 100, self.n * 100 + rng.randint(1, 3))))
        req = self.live.pop(rng.randrange(len(self.live)))
        return Op("release", req, keep=True)


def window(harness: Harness, workload: Workload, steps: int, budget_s: float, least_s: float = 0.0) -> dict[str, Any]:
    """Run ``steps`` workload steps (more until ``least_s`` seconds have passed, so that a fast small pool's
    rate is not read off a few seconds of a shared machine's load; at most ``budget_s``) through ``harness``,
    then its end-of-example
    check (Harness.finish); steps/s over the steps (the periodic full checks among them included), the
    end check's seconds apart, and the evictions."""
    evictions_before = harness.tally.coverage["evict"]
    refused_before = harness.tally.coverage["admit:refused"]
    done = 0
    t0 = time.perf_counter()
    while (done < steps or time.perf_counter() - t0 < least_s) and time.perf_counter() - t0 < budget_s:
        op = workload.next()
        outcome = harness.step(op)
        if op.op == "admit" and outcome.status != "ok":
            workload.live.remove(op.req or "")
        done += 1
    wall = time.perf_counter() - t0
    t1 = time.perf_counter()
    harness.finish()
    return {
        "steps": done,
        "seconds": round(wall, 3),
        "steps_per_s": round(done / wall, 1),
        "end_check_s": round(time.perf_counter() - t1, 3),
        "evictions": harness.tally.coverage["evict"] - evictions_before,
        "refused_admissions": harness.tally.coverage["admit:refused"] - refused_before,
    }


def measure(
    factory: AdapterFactory, pool: int, k: int, steps: int, full_steps: int, budget_s: float, least_s: float = 0.0
) -> dict[str, Any]:
    """One pool: the fill, then on the same harness and pool three windows: incremental with the whole state
    every K steps, incremental with the whole state at the window's end only, and the full check of every step."""
    adapter = IsolatedAdapter(factory, timeout=600.0)
    try:
        harness = Harness(adapter, Config(capacity=pool, block_size=BLOCK_SIZE), Tally(full_check_every=k))
        t0 = time.perf_counter()
        for op in fill_ops(pool):
            harness.step(op)
        fill_s = time.perf_counter() - t0
        fill_evictions = harness.tally.coverage["evict"]
        workload = Workload(pool)
        incremental = window(harness, workload, steps, budget_s, least_s)
        harness.every = 10**9  # the whole state at the window's end only (Harness.finish)
        end_only = window(harness, workload, steps, budget_s, least_s)
        harness.live, harness.every = None, 1  # today's path: the full observation, every invariant, each step
        full = window(harness, workload, full_steps, budget_s)
    finally:
        adapter.close()
    return {
        "pool_blocks": pool,
        "fill": {"steps": 40, "seconds": round(fill_s, 2), "evictions": fill_evictions},
        "incremental": incremental,
        "end_only": end_only,
        "full": full,
        "speedup": round(incremental["steps_per_s"] / full["steps_per_s"], 1),
    }


def markdown(data: dict[str, Any]) -> str:
    rows, w = data["pools"], data["windows"]
    lines = [
        "# Checked steps/s against pool size",
        "",
        f"`{data['command']}` on {data['machine']}; "
        f"{data['adapter']} adapter in its child process, block size {BLOCK_SIZE}. Three windows per pool, on the same "
        f"filled pool: incremental with the whole state judged every K={data['k']} steps and at the window's end; "
        "incremental with the whole state judged at the window's end only (each step's local part still "
        "judged); the full check of every step (K=1, the default). Steps/s counts the steps, the periodic full "
        "checks among them included (the adapter's full observation compared with the state kept from its "
        "deltas, and the invariants that are not incremental judged on it, docs/incremental.md); the "
        "end-of-window check of the whole state (Harness.finish: the comparison and the state invariants) is "
        "timed apart. Absolute rates depend on the load of the machine; read the ratios. "
        f"Each incremental window runs {w['steps']:,} steps and on until {w['least_s']} s have passed (the full "
        f"window {w['full_steps']:,} steps), at most {w['budget_s']} s.",
        "",
        f"| pool blocks | K={data['k']} steps/s | evictions | end-only steps/s | evictions | end check s "
        f"| full steps/s | evictions | K={data['k']} / full |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        inc, end, full = row["incremental"], row["end_only"], row["full"]
        lines.append(
            f"| {row['pool_blocks']:,} | {inc['steps_per_s']:,} | {inc['evictions']:,} | {end['steps_per_s']:,} "
            f"| {end['evictions']:,} | {end['end_check_s']} | {full['steps_per_s']:,} | {full['evictions']:,} "
            f"| {row['speedup']}x |"
        )
    lines.append("")
    for mode, label in (("incremental", f"K={data['k']}"), ("end_only", "the whole state at the end only")):
        base, last = rows[0][mode]["steps_per_s"], rows[-1][mode]["steps_per_s"]
        met = "met" if last * 2 >= base else "not met"
        lines.append(
            f"Goal (issue 17), the {rows[-1]['pool_blocks']:,}-block figure within 2x of the "
            f"{rows[0]['pool_blocks']:,}-block one, {label}: {met} "
            f"({last:,} against {base:,} steps/s, {base / last:.2f}x)."
        )
        lines.append("")
    return "\n".join(lines)


def plot(data: dict[str, Any], path: Path) -> None:
    """Steps/s against pool blocks, both modes, log-log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pools = [row["pool_blocks"] for row in data["pools"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    labels = {
        "incremental": f"incremental, whole state every {data['k']} steps",
        "end_only": "incremental, whole state at the end",
        "full": "full check every step",
    }
    for mode, style in (("incremental", "o-"), ("end_only", "^-"), ("full", "s--")):
        label = labels[mode]
        ax.plot(pools, [row[mode]["steps_per_s"] for row in data["pools"]], style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("pool blocks")
    ax.set_ylabel("checked steps/s")
    ax.set_title(f"kvspec: checked steps/s against pool size ({data['adapter']} adapter)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI: short windows, under a minute")
    parser.add_argument("--k", type=int, default=K_DEFAULT, help=f"full check every K steps (default {K_DEFAULT})")
    parser.add_argument("--adapter", default="reference", help="an adapter that reports deltas (default reference)")
    parser.add_argument("--pools", default=",".join(map(str, POOLS)), help="pool sizes in blocks, comma-separated")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "docs" / "benchmarks", help="where the files go")
    args = parser.parse_args()
    try:
        factory = load(args.adapter)
    except UnknownAdapter as exc:
        print(f"kvspec: {exc}", file=sys.stderr)
        raise SystemExit(ExitCode.COULD_NOT_RUN) from None
    pools = [int(p) for p in args.pools.split(",") if p.strip().isdigit()]
    if len(pools) != len(args.pools.split(",")) or min(pools) < 1 or args.k < 1:
        print(
            f"kvspec: --pools takes positive block counts and --k a positive K, not {args.pools!r} and {args.k}",
            file=sys.stderr,
        )
        raise SystemExit(ExitCode.COULD_NOT_RUN)
    stem = "pool-scale" if args.adapter == "reference" else f"pool-scale-{args.adapter}"
    flags = [
        f
        for f, on in (
            (" --quick", args.quick),
            (f" --adapter {args.adapter}", args.adapter != "reference"),
            (f" --pools {args.pools}", pools != list(POOLS)),
            (f" --k {args.k}", args.k != K_DEFAULT),
        )
        if on
    ]
    steps, full_steps, budget, least = (400, 60, 6.0, 0.0) if args.quick else (4000, 1000, 60.0, 20.0)
    data: dict[str, Any] = {
        "benchmark": "pool_scale",
        "command": "python benchmarks/pool_scale.py" + "".join(flags),
        "adapter": args.adapter,
        "quick": args.quick,
        "k": args.k,
        "block_size": BLOCK_SIZE,
        "windows": {"steps": steps, "least_s": least, "full_steps": full_steps, "budget_s": budget},
        "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
        "pools": [],
    }
    for pool in pools:
        row = measure(factory, pool, args.k, steps, full_steps, budget, least)
        data["pools"].append(row)
        inc, end, full = row["incremental"], row["end_only"], row["full"]
        print(
            f"pool {pool:>6}: K={args.k} {inc['steps_per_s']:>8} steps/s ({inc['evictions']} evictions), "
            f"end-only {end['steps_per_s']:>8} ({end['evictions']}), full {full['steps_per_s']:>8} "
            f"({full['evictions']}), fill {row['fill']['seconds']} s",
            flush=True,
        )
    out = args.out_dir
    jsonio.write(out / f"{stem}.json", data)
    jsonio.write_text(out / f"{stem}.md", markdown(data))
    try:
        plot(data, out / f"{stem}.png")
    except ImportError as exc:
        print(f"no plot: {exc}")
    print(markdown(data))


if __name__ == "__main__":
    main()
