"""Draw the README's timeline: the kit's known vLLM bug (tests/data/vllm-known-bugs.json) on vLLM's own BlockPool.

The bug lives in vLLM before 0.24 (BlockPool.free_blocks queues a block listed twice twice); in the
installed release it is reproduced by seeding the historical code (tests/vllm_bugs.py, free-queues-twice).
Run in the vLLM environment (docs/vllm.md), with the kit and matplotlib importable:

    python benchmarks/known_bug_timeline.py docs/vllm-known-bug.png
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from vllm_bugs import KNOWN_BUGS, SEEDED_AS, VLLM_BUGS, VllmBug, seeded

from kvspec.adapters import load
from kvspec.show import picture, verdict


def main(out: Path) -> None:
    entry = KNOWN_BUGS[0]
    bug: VllmBug = next(b for b in VLLM_BUGS if b.name == SEEDED_AS[entry.fingerprint])
    t0 = time.perf_counter()
    with seeded(bug):
        runs, _, pic = picture(
            entry.case,
            load(entry.adapter),
            title=f"vLLM known bug ({entry.versions}): {bug.name}, seeded into the installed release",
        )
    pic.save(out)
    print(verdict(runs))
    print(f"drawn: {out} in {time.perf_counter() - t0:.1f} s (replays and drawing)")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/vllm-known-bug.png"))
