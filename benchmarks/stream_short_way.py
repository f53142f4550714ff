"""What StreamLedger's short way for new hashes saves: one synthetic vLLM event stream checked with it and
without it (``StreamLedger.short_way``), the same verdicts required, CPU seconds of applying the batches only.

Usage: python benchmarks/stream_short_way.py [--events 400000] [--blocks 4096] [--repeat 3] [--md PATH]
Prints the best of ``--repeat`` runs of each and their ratio; ``--md``: also writes them there (the committed
figures: docs/benchmarks/stream-short-way.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from kvspec.adapters.vllm_live.hashing import BlockHasher
from kvspec.bench.vllm_stream import Engine, StreamShape
from kvspec.spec.stream import StreamLedger


def check(batches: list[Any], blocks: int, short_way: bool) -> tuple[float, list[str], int]:
    """CPU seconds to apply ``batches``, the invariants violated, the blocks stored."""
    ledger = StreamLedger(16, blocks, BlockHasher(16), requests=False)
    ledger.short_way = short_way
    t0 = time.process_time()
    for i, events in enumerate(batches):
        ledger.apply_batch(i, i, events)
    return time.process_time() - t0, ledger.result.violated, ledger.result.seen["stored"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--blocks", type=int, default=4_096)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--md", type=Path, default=None, help="write the table here too")
    args = parser.parse_args(argv)
    shape = StreamShape(blocks=args.blocks, events=args.events, reset_every=max(args.events // 4, 1))
    batches = list(Engine(shape).run())
    best: dict[bool, float] = {}
    verdicts = set()
    for _ in range(args.repeat):
        for short_way in (True, False):
            seconds, violated, stored = check(batches, args.blocks, short_way)
            best[short_way] = min(best.get(short_way, seconds), seconds)
            verdicts.add((tuple(violated), stored))
    if len(verdicts) != 1:
        print(f"stream_short_way: the two ways disagree: {sorted(verdicts)}", file=sys.stderr)
        return 1
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    command = " ".join(sys.argv[1:] if argv is None else argv)
    ways = ((True, "short way for new hashes"), (False, "every block the general way"))
    text = [
        "# StreamLedger's short way for new hashes",
        "",
        f"`python benchmarks/stream_short_way.py {command}`: {args.events:,} events, pool {args.blocks:,}, best of "
        f"{args.repeat}, CPU s of applying the batches only (load average {load}); both ways gave the same verdicts.",
        "",
        "| way | CPU s | events/s |",
        "|---|---:|---:|",
        *(f"| {label} | {best[way]:.3f} | {args.events / best[way]:,.0f} |" for way, label in ways),
        "",
        f"General over short: {best[False] / best[True]:.2f}x.",
    ]
    print("\n".join(text))
    if args.md is not None:
        args.md.write_text("\n".join(text) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
