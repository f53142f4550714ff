"""Random op walks over a two-token alphabet, for the tests that compare an adapter's deltas with its observation.

Two token values make prefixes repeat, so a walk meets hits, shared blocks, duplicate hashes and evictions.
"""

from __future__ import annotations

import random

from kvspec.spec import Observation, Op


def random_op(
    rng: random.Random,
    obs: Observation,
    n: int,
    *,
    longest_prompt: int = 9,
    longest_append: int = 3,
    duplicate_ids: float = 0.0,
    keep: float = 0.8,
) -> Op:
    """The ``n``-th op of a walk, drawn against ``obs``; ``duplicate_ids``: how often an admit reuses a live id."""
    live = sorted(obs.requests)
    running = [r for r in live if obs.requests[r].state == "running"]
    preempted = [r for r in live if obs.requests[r].state == "preempted"]
    roll = rng.random()
    if roll < 0.4 or not live:
        rid = rng.choice(live) if duplicate_ids and live and rng.random() < duplicate_ids else f"r{n}"
        return Op("admit", rid, tuple(rng.choice((0, 1)) for _ in range(rng.randint(1, longest_prompt))))
    if roll < 0.55 and running:
        tokens = tuple(rng.choice((0, 1)) for _ in range(rng.randint(1, longest_append)))
        return Op("append", rng.choice(running), tokens)
    if roll < 0.65 and running:
        return Op("preempt", rng.choice(running))
    if roll < 0.72 and preempted:
        return Op("resume", rng.choice(preempted))
    if roll < 0.74:
        return Op("reset_cache")
    return Op("release", rng.choice(live), keep=rng.random() < keep)
