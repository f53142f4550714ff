"""Hypothesis strategies for pools and prompts that produce real sharing and real pressure.

Prompts come in four shapes: a template family with a private tail, a fork of an
earlier conversation (multi-turn), a unique cold prompt, and a long prompt near
the pool's size. Token ids of shared shapes come from a tiny alphabet so that
prefixes collide; cold prompts use ids no other prompt uses.

Every strategy here is built once and cached: building strategies inside rules
costs more than running the allocator under test.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

from hypothesis import strategies as st

from kvspec.spec import Config, Semantics

ALPHABET = st.integers(min_value=0, max_value=3)
COLD_BASE = 1_000


@dataclass(frozen=True)
class PoolRanges:
    """Pool shapes a profile draws from."""

    capacity: tuple[int, int] = (2, 12)
    block_sizes: tuple[int, ...] = (2, 4)
    entry_capacity: tuple[int, int] = (8, 64)
    bytes_per_token: tuple[int, ...] = (1, 2)


DEFAULT_RANGES = PoolRanges()


def configs(
    semantics: Semantics, ranges: PoolRanges, fixed: Config | None = None, scale: int = 1
) -> st.SearchStrategy[Config]:
    """Pool configurations for one example; block pools ``scale`` times the ranges' (several KV cache groups)."""
    if fixed is not None:
        return st.just(fixed)
    if semantics.granularity == "entry":
        return st.builds(
            Config,
            capacity=st.integers(*ranges.entry_capacity),
            block_size=st.just(1),
            bytes_per_token=st.sampled_from(ranges.bytes_per_token),
        )
    low, high = ranges.capacity
    return st.builds(
        Config, capacity=st.integers(low * scale, high * scale), block_size=st.sampled_from(ranges.block_sizes)
    )


@cache
def tokens(min_len: int, max_len: int) -> st.SearchStrategy[tuple[int, ...]]:
    """Token runs over the small shared alphabet."""
    return st.lists(ALPHABET, min_size=min_len, max_size=max(min_len, max_len)).map(tuple)


@cache
def integers(low: int, high: int) -> st.SearchStrategy[int]:
    return st.integers(low, max(low, high))


def families(block_size: int) -> st.SearchStrategy[list[tuple[int, ...]]]:
    """Shared templates (system prompts, RAG documents) of one to three blocks and a bit."""
    return st.lists(tokens(1, 3 * block_size + 1), min_size=1, max_size=3)


def pick(data: st.DataObject, items: Sequence[object], label: str) -> int:
    """Index of one of ``items``; shrinks towards the first."""
    return data.draw(integers(0, len(items) - 1), label=label)


def family_prompt(data: st.DataObject, templates: Sequence[tuple[int, ...]], config: Config) -> tuple[int, ...]:
    """A shared template followed by a private tail."""
    template = templates[pick(data, templates, "template")]
    return template + data.draw(tokens(0, config.block_size + 1), label="tail")


def fork_prompt(data: st.DataObject, history: Sequence[tuple[int, ...]], config: Config) -> tuple[int, ...]:
    """A later turn of an earlier conversation: a prefix of it, then new tokens."""
    past = history[pick(data, history, "conversation")]
    cut = data.draw(integers(1, len(past)), label="cut")
    return past[:cut] + data.draw(tokens(0, config.block_size), label="turn")


def cold_prompt(data: st.DataObject, cold_id: int, config: Config) -> tuple[int, ...]:
    """A prompt that shares nothing with any other."""
    n = data.draw(integers(1, 2 * config.block_size + 1), label="length")
    base = COLD_BASE + cold_id * 64
    return tuple(range(base, base + n))


def long_prompt(data: st.DataObject, templates: Sequence[tuple[int, ...]], max_tokens: int) -> tuple[int, ...]:
    """A prompt of half the pool or more: capacity pressure, eviction, refusal."""
    n = data.draw(integers(max(1, max_tokens // 2), max(1, max_tokens)), label="length")
    template = templates[pick(data, templates, "template")]
    return (template + data.draw(tokens(n, n), label="tokens"))[:n]
