"""Events per second and peak memory of ``kvspec trace check --format vllm-events`` on a synthetic stream.

The stream comes from kvspec.bench.vllm_stream (hash-consistent vLLM 0.32 KV events: stores,
evictions, preemptions, resets, on a pool of ``--blocks``). Each length is generated once, then
checked by the command in a fresh child process: events/s over the child's CPU time (one core)
and its wall time, and its peak RSS. Its peer, in a child of its own on the same stream, is the floor
(benchmarks/stream_floor.py: read, msgspec-decode, rehash with vLLM's recipe; what any exact checker
must do): the checker's share of the floor's speed does not move with the machine's speed. Two
lengths (a quarter and the whole) show whether memory follows the stream's length or the live index.
A calibration figure (``sum(range(10**6))`` in ms on this machine, about 12 ms on an unloaded 2024
desktop core) says how fast the machine was.

Usage: python benchmarks/vllm_events_throughput.py [--quick] [--blocks 65536] [--events 10000000]
           [--json docs/benchmarks/vllm-events.json] [--md docs/benchmarks/vllm-events.md] [--dir DIR]
``--quick``: 4,096 blocks, 200,000 events (CI: under a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

from kvspec import jsonio
from kvspec.bench.child import kvspec_in_child, main_in_child
from kvspec.bench.vllm_stream import StreamShape, generate
from kvspec.report import ExitCode


def calibration_ms() -> float:
    """This machine's speed at plain Python: the best of 5 runs of ``sum(range(10**6))``, in ms."""
    return min(timeit.repeat("sum(range(10**6))", number=1, repeat=5)) * 1000


def check_in_child(path: Path, report: Path) -> dict[str, Any]:
    """``kvspec trace check --format vllm-events`` in a child: exit code, wall and CPU seconds, peak RSS."""
    run = kvspec_in_child(["trace", "check", str(path), "--format", "vllm-events", "--report", str(report)])
    return {"exit_code": run.exit_code, "wall_s": run.wall_s, "cpu_s": run.cpu_s, "peak_rss_mb": run.peak_rss_mb}


def floor_in_child(path: Path) -> dict[str, Any]:
    """The floor (benchmarks/stream_floor.py: read, decode, rehash; nothing checked) on ``path`` in a child."""
    run = main_in_child("stream_floor", [str(path)], path=Path(__file__).resolve().parent)
    done = json.loads(run.stdout) if run.exit_code == 0 else {}
    return {"exit_code": run.exit_code, "cpu_s": round(run.cpu_s, 2), "wall_s": round(run.wall_s, 2), **done}


def measure(shape: StreamShape, where: Path) -> dict[str, Any]:
    path = where / f"vllm-events-{shape.blocks}-{shape.events}.jsonl"
    t0 = time.perf_counter()
    made = generate(path, shape)
    generated_s = time.perf_counter() - t0
    size = path.stat().st_size
    checked = check_in_child(path, where / "report.json")
    report = json.loads((where / "report.json").read_text())
    floor = floor_in_child(path)
    path.unlink()
    # the floor must have done the work: every line read, every event decoded, every stored hash given by the recipe
    floor_ok = floor["exit_code"] == 0 and floor.get("events") == made["events"] and floor.get("mismatched") == 0
    return {
        "blocks": shape.blocks,
        "events": made["events"],
        "stream": made,
        "bytes": size,
        "generate_s": round(generated_s, 2),
        **{k: round(v, 2) if isinstance(v, float) else v for k, v in checked.items()},
        "status": report["status"],
        "events_per_cpu_s": round(made["events"] / checked["cpu_s"]),
        "events_per_wall_s": round(made["events"] / checked["wall_s"]),
        "mb_per_cpu_s": round(size / 2**20 / checked["cpu_s"], 1),
        "checked": {row["name"]: row["checked_steps"] for row in report["invariants"]},
        "floor": floor,
        "floor_ok": floor_ok,
        "floor_events_per_cpu_s": round(made["events"] / floor["cpu_s"]) if floor_ok else None,
        "share_of_floor": round(floor["cpu_s"] / checked["cpu_s"], 3) if floor_ok else None,
    }


# A production event rate, derived (docs/benchmarks/vllm-events.md says how): vLLM serving Llama 3.1 8B on one
# H100 at about 12,500 output tokens/s (a third-party benchmark round-up, morphllm.com/vllm-benchmarks, 2026),
# block size 16. Each block filled is one stored hash and, at steady state, one BlockRemoved later; vLLM
# publishes one BlockStored per request per step (a decode block: one hash) and one BlockRemoved per evicted
# block. With P uncached prompt tokens per output token: events/s <= 2 * (1 + P) * 12,500 / 16.
OUTPUT_TOKENS_PER_S = 12_500
BLOCK_SIZE = 16
RATES = {
    "P = 1 (prompt as long as output)": 2 * 2 * OUTPUT_TOKENS_PER_S // BLOCK_SIZE,
    "P = 8 (1,024 in, 128 out)": 2 * 9 * OUTPUT_TOKENS_PER_S // BLOCK_SIZE,
}


def instances(result: dict[str, Any]) -> list[str]:
    """How many serving instances one core follows at each derived rate (the longest run's events/s)."""
    speed = result["runs"][-1]["events_per_cpu_s"]
    lines = [
        "| production rate (derived) | events/s per instance | instances one core follows here |",
        "|---|---:|---:|",
    ]
    lines += [f"| {name} | {rate:,} | {speed / rate:.1f} |" for name, rate in RATES.items()]
    return lines


def markdown(result: dict[str, Any]) -> str:
    rows = [
        "| blocks | events | MB | status | CPU s | wall s | events/s (CPU) | events/s (wall) | MB/s | peak RSS MB "
        "| floor events/s (CPU) | share of floor |",
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["runs"]:
        floor = (
            f"{r['floor_events_per_cpu_s']:,} | {100 * r['share_of_floor']:.1f}%"
            if r.get("floor_events_per_cpu_s")
            else "not measured | -"
        )
        rows.append(
            f"| {r['blocks']:,} | {r['events']:,} | {r['bytes'] / 2**20:,.0f} | {r['status']} | {r['cpu_s']} | "
            f"{r['wall_s']} | {r['events_per_cpu_s']:,} | {r['events_per_wall_s']:,} | {r['mb_per_cpu_s']} | "
            f"{r['peak_rss_mb']:.0f} | {floor} |"
        )
    return "\n".join(
        [
            "# vLLM KV event stream: check throughput",
            "",
            f"`{result['command']}` on {result['machine']}; calibration `sum(range(10**6))` = "
            f"{result['calibration_ms']:.1f} ms (about 12 ms on an unloaded desktop core).",
            "",
            *rows,
            "",
            "Events are vLLM event objects (BlockStored of one or more blocks, BlockRemoved, AllBlocksCleared); "
            "every stored block's hash is recomputed (sha256 over pickle, vLLM's recipe). Peak RSS is the "
            "checking process's, Python and imports included. Batch lines are decoded straight into typed "
            "msgspec Structs (kvspec/traces/vllm_batch.py: the shape is checked while decoding; a line it "
            "refuses is read the strict way).",
            "",
            "The floor is the peer measured in the same run on the same stream (benchmarks/stream_floor.py, a "
            "child process of its own): reading the lines, decoding the batches with msgspec and recomputing every "
            "stored hash with vLLM's recipe, which any exact checker of the stream must do, and nothing else (no "
            "ledger, no other invariant, no report). Share of floor: the floor's CPU over the checker's, the part of "
            "the checker's cost that is that floor; unlike events/s it does not move with the machine's speed. Both "
            "CPU figures include their process's start (imports: about 0.5 s each here), which weighs on the short "
            "streams of --quick and not on the long ones.",
            "",
            *([result["note"], ""] if result.get("note") else []),
            "## How many serving instances one core can follow",
            "",
            "The rate is derived, not measured on a production server (the kit has no GPU server; its live vLLM "
            "run on the tiny CPU model publishes about 67 events/s, tests/data/vllm_live_cpu.jsonl, which says "
            "nothing about production). vLLM serving Llama 3.1 8B on one H100 produces about 12,500 output "
            "tokens/s (a third-party benchmark round-up, morphllm.com/vllm-benchmarks); with 16-token blocks each "
            "filled block is one stored hash and, at steady state, one BlockRemoved later; vLLM publishes one "
            "BlockStored per request per step and one BlockRemoved per evicted block, so with P uncached prompt "
            "tokens per output token the stream carries at most 2 (1 + P) 12,500 / 16 events/s (no prefix hits: "
            "an upper bound).",
            "",
            *instances(result),
            "",
            "Measured on this loaded machine (see the calibration): a free core is about "
            f"{result['calibration_ms'] / 12:.1f}x faster at plain Python, which would scale the last column "
            "accordingly (an estimate).",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4,096 blocks, 200,000 events")
    parser.add_argument("--blocks", type=int, default=65_536)
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--json", type=Path, help="write the figures as JSON here")
    parser.add_argument("--md", type=Path, help="write a markdown table here")
    parser.add_argument("--dir", type=Path, help="where the streams are written (default: a temporary folder)")
    parser.add_argument("--from-json", type=Path, help="re-render the markdown of an earlier run's JSON")
    parser.add_argument("--note", help="a paragraph written under the table (kept in the JSON)")
    args = parser.parse_args(argv)
    if args.from_json is not None:
        text = markdown(json.loads(args.from_json.read_text()))
        if args.md:
            args.md.write_text(text)
        print(text)
        return 0
    blocks, events = (4_096, 200_000) if args.quick else (args.blocks, args.events)
    if args.dir is not None and not args.dir.is_dir():
        print(f"kvspec: {args.dir}: --dir must be an existing folder", file=sys.stderr)
        return int(ExitCode.COULD_NOT_RUN)
    runs = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        for n in (events // 4, events):
            shape = StreamShape(blocks=blocks, events=n, reset_every=max(n // 5, 1))
            run = measure(shape, Path(tmp))
            print(json.dumps(run), flush=True)
            runs.append(run)
    result = {
        "command": " ".join(["python benchmarks/vllm_events_throughput.py", *(sys.argv[1:] if argv is None else argv)]),
        "machine": f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end",
        "calibration_ms": round(calibration_ms(), 1),
        "runs": runs,
        **({"note": args.note} if args.note else {}),
    }
    if args.json:
        jsonio.write(args.json, result)
    if args.md:
        jsonio.write_text(args.md, markdown(result))
    print(markdown(result))
    failed = [r for r in runs if r["status"] != "passed"]
    if failed:
        return 1
    if not all(r["floor_ok"] for r in runs):
        print("kvspec: the floor did not read, decode and rehash the whole stream (see its figures)", file=sys.stderr)
        return int(ExitCode.COULD_NOT_RUN)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
