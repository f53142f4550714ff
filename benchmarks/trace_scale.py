"""Bytes per step, check throughput and peak memory of kvspec traces: full snapshots (v1) against deltas (v2).

For each pool size, ``kvspec trace record --adapter reference --seed 1`` writes the same steps twice:
``--snapshot-every 1`` (version 1, the whole ledger every step) and ``--snapshot-every 64``
(version 2, deltas between full snapshots). ``kvspec trace check`` then checks each in a fresh
child: CPU seconds, steps/s, MB/s and peak RSS. A second v2 trace four times as long shows whether
the check's memory follows the trace's length (it should not: the check streams).

Usage: python benchmarks/trace_scale.py [--quick] [--pools 64 1024 16384 65536] [--steps 2000]
           [--json docs/benchmarks/trace-scale.json] [--md docs/benchmarks/trace-scale.md]
``--quick``: pools 64 and 1,024, 150 steps (CI: about a minute on 2 loaded cores).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from kvspec import jsonio
from kvspec.bench.child import kvspec_in_child

MB = 2**20


def run_child(argv: list[str]) -> dict[str, Any]:
    """``kvspec ARGV`` in a child process: exit code, wall and CPU seconds, peak RSS of the child."""
    run = kvspec_in_child(argv)
    return {
        "exit_code": run.exit_code,
        "wall_s": round(run.wall_s, 2),
        "cpu_s": round(run.cpu_s, 2),
        "rss_mb": run.peak_rss_mb,
    }


def one(pool: int, steps: int, every: int, where: Path) -> dict[str, Any]:
    path = where / f"trace-{pool}-{steps}-{every}.jsonl"
    record = ["trace", "record", "--adapter", "reference", "--seed", "1", "--steps", str(steps)]
    record += ["--capacity", str(pool), "--snapshot-every", str(every), "--out", str(path)]
    recorded = run_child(record)
    if recorded["exit_code"] != 0:
        raise SystemExit(f"recording failed: {record}")
    size = path.stat().st_size
    checked = run_child(["trace", "check", str(path), "--report", str(where / "report.json")])
    report = json.loads((where / "report.json").read_text())
    path.unlink()
    cpu = max(checked["cpu_s"], 1e-9)
    return {
        "pool": pool,
        "steps": steps,
        "snapshot_every": every,
        "version": 1 if every == 1 else 2,
        "bytes": size,
        "bytes_per_step": round(size / steps),
        "record_wall_s": recorded["wall_s"],
        "status": report["status"],
        "check_cpu_s": checked["cpu_s"],
        "check_wall_s": checked["wall_s"],
        "steps_per_cpu_s": round(steps / cpu),
        "mb_per_cpu_s": round(size / MB / cpu, 2),
        "check_peak_rss_mb": round(checked["rss_mb"], 1),
    }


def markdown(result: dict[str, Any]) -> str:
    rows = [
        "| pool | steps | trace | bytes/step | MB | status | check CPU s | steps/s | MB/s | peak RSS MB |",
        "|---:|---:|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in result["runs"]:
        kind = "v1 (full)" if r["version"] == 1 else f"v2 (K={r['snapshot_every']})"
        rows.append(
            f"| {r['pool']:,} | {r['steps']:,} | {kind} | {r['bytes_per_step']:,} | {r['bytes'] / MB:,.1f} | "
            f"{r['status']} | {r['check_cpu_s']} | {r['steps_per_cpu_s']:,} | {r['mb_per_cpu_s']} | "
            f"{r['check_peak_rss_mb']} |"
        )
    return "\n".join(
        [
            "# kvspec traces: full snapshots against deltas",
            "",
            f"`{result['command']}` on {result['machine']}. Each check runs in a fresh child; peak RSS is the "
            "checking process's, Python and imports included. The last row of each pool is a v2 trace four "
            "times as long: its peak memory against the row above says whether the check follows the trace's "
            "length.",
            "",
            *rows,
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="pools 64 and 1,024, 150 steps")
    parser.add_argument("--pools", type=int, nargs="+", default=[64, 1024, 16384, 65536])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--md", type=Path)
    args = parser.parse_args(argv)
    pools, steps = ([64, 1024], 150) if args.quick else (args.pools, args.steps)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for pool in pools:
            for n, every in ((steps, 1), (steps, 64), (4 * steps, 64)):
                run = one(pool, n, every, Path(tmp))
                print(json.dumps(run), flush=True)
                runs.append(run)
    result = {
        "command": " ".join(["python benchmarks/trace_scale.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end",
        "runs": runs,
    }
    if args.json:
        jsonio.write(args.json, result)
    if args.md:
        jsonio.write_text(args.md, markdown(result))
    print(markdown(result))
    return 0 if all(r["status"] == "passed" for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
