"""The floor under checking a vLLM event stream: what any exact checker of it must spend, and nothing else.

``kvspec trace check --format vllm-events`` must read every line, decode every batch (msgspec, into
the typed structs of kvspec/traces/vllm_batch.py) and recompute every stored block's hash with
vLLM's recipe (``hash_chain_agrees``: sha256 over pickle, adapters/vllm_live/hashing.py), which
needs the parent's full digest, so a map of live hash -> digest is kept as well. This module does
exactly that and nothing more: no ledger, no other invariant, no report. Run in a child process on
the same stream as the checker, it is the peer the event benchmark measures the checker against
(benchmarks/vllm_events_throughput.py): the checker's share of the floor's events/s is a figure of
the checker's own cost that the machine's speed does not move.

It keeps the invariant of the checker's hashing: each BlockStored's blocks are chained from the
parent's digest (vLLM's NONE_HASH for no parent or a parent it does not know), one
:meth:`BlockHasher.chain` call per event; BlockRemoved drops a hash, AllBlocksCleared all of them.

Usage: python benchmarks/stream_floor.py STREAM.jsonl  (prints a JSON line: lines, events, stored, mismatched)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from kvspec.adapters.vllm_live.hashing import DEFAULT_NONE_HASH_SEED, BlockHasher
from kvspec.report import ExitCode
from kvspec.traces.lines import TraceFormatError, parse_line, raw_lines
from kvspec.traces.vllm_batch import DECODE
from kvspec.traces.vllm_events import validate


def floor(path: Path) -> dict[str, Any]:
    """Read, decode and rehash ``path`` as the checker must; counts of what was done (``mismatched``: hashes
    the recipe does not give, 0 on a hash-consistent stream). Block size and seed come from its config record."""
    if DECODE is None:
        raise RuntimeError("msgspec is not installed (the events extra)")
    hasher = BlockHasher(16)
    block_size, root, chain = hasher.block_size, hasher.root(), hasher.chain
    digests: dict[Any, bytes] = {}
    lines = events = stored = mismatched = 0
    for number, chunk in raw_lines(path):
        lines += 1
        batch = DECODE(chunk)
        if batch is None:  # another record (the config), a note, or a line the checker's strict reader refuses
            line = parse_line(number, chunk)
            if validate(line) == "config":  # the checker's own check of its fields (TraceFormatError, with the line)
                config = line.data["config"]
                seed = config.get("none_hash_seed") or DEFAULT_NONE_HASH_SEED
                hasher = BlockHasher(config.get("block_size") or block_size, none_hash_seed=seed)
                block_size, root, chain = hasher.block_size, hasher.root(), hasher.chain
            continue
        for event in batch.events:
            events += 1
            kind = event.kind
            if kind == "BlockStored":
                keys, tokens = event.block_hashes, event.token_ids
                stored += len(keys)
                if len(tokens) != len(keys) * block_size:  # no block of it can be the recipe's
                    mismatched += len(keys)
                    continue
                blocks = [tokens[i : i + block_size] for i in range(0, len(keys) * block_size, block_size)]
                parent = event.parent_block_hash
                base = root if parent is None else digests.get(parent, root)
                for key, (published, digest) in zip(keys, chain(base, blocks), strict=True):
                    digests[key] = digest
                    mismatched += published != key
            elif kind == "BlockRemoved":
                for key in event.block_hashes:
                    digests.pop(key, None)
            else:
                digests.clear()
    return {"lines": lines, "events": events, "stored": stored, "mismatched": mismatched}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python benchmarks/stream_floor.py STREAM.jsonl", file=sys.stderr)
        return int(ExitCode.COULD_NOT_RUN)
    try:
        done = floor(Path(args[0]))
    except (OSError, RuntimeError, TraceFormatError) as exc:
        print(f"kvspec: {args[0]}: {exc}", file=sys.stderr)
        return int(ExitCode.COULD_NOT_RUN)
    print(json.dumps(done))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
