"""What a hybrid KV cache shows beside the block ledger: one block table per KV cache group.

Models that mix attention kinds (full attention with sliding-window or chunked
local attention: Gemma 3, gpt-oss, Llama 4) keep one KV cache group per kind.
Every group has its own block table per request, all groups take their blocks
from one shared pool, and a group whose attention never again reads a block
(a token before the sliding window, a chunk before the current one) releases
it while the request still runs: the table keeps the position and holds the
*null placeholder* there.

An implementation declares ``Semantics.layout`` ``per_group`` and, for each pool,
its groups as parameters (``KvGroup``: they depend on the pool's block size, so
they travel in the view, as a radix tree's page size does); this module says
what they mean:

- ``skipped_tokens``: the tokens no later token attends to once ``computed``
  tokens are computed (none for full attention; those before the window for a
  sliding window of ``window`` tokens; those before the current chunk for local
  attention in chunks of ``chunk`` tokens);
- a group that ``releases_out_of_window`` holds the null placeholder at every
  position wholly made of skipped tokens, and a real block everywhere else;
- ``servable``: a group can serve a prefix hit of ``length`` tokens when the
  length is a whole number of its blocks and the blocks it still reads for the
  next token are cached;
- with speculative decoding by a draft head that reads the target model's
  hidden states (EAGLE, MTP), a group's lookup matches ``eagle_drop`` blocks
  past the hit and then drops them, so their tokens are computed again and the
  draft head gets their hidden states: a hit of ``length`` tokens needs those
  blocks cached too, and they must be whole blocks of the prompt
  (``matched_blocks``). The drop shortens a hit by at most one block per
  group, never by one block per pass of a search;
- a hit across groups is the longest length every group can serve, on the hit
  granularity (the least common multiple of the groups' block sizes), capped so
  that one prompt token is computed (``longest_common_hit``).

The null placeholder is no block: it holds no capacity, has no ref count, is
never free, never cached and never evicted. A table shows it as ``None``, so no
invariant counts it. What the ledger's one-table view cannot say (the per-group
tables, the tokens computed, what each group has cached) the adapter shows as a
``HybridView`` under ``Observation.extra[HYBRID]``; the hybrid invariants
(``spec.invariants.hybrid``) read it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from math import lcm
from typing import Literal

from .observation import Observation

HYBRID = "hybrid"
"""The key of ``Observation.extra`` under which a hybrid adapter shows its HybridView."""

AttentionKind = Literal["full", "sliding_window", "chunked_local"]

Table = tuple[Hashable | None, ...]
"""One group's block table of one request: a block id per position, None where the null placeholder stands."""


@dataclass(frozen=True)
class KvGroup:
    """One KV cache group: its attention kind, block size (tokens) and window or chunk (tokens)."""

    kind: AttentionKind
    block_size: int
    window: int = 0  # sliding_window: tokens each token attends to, itself included
    chunk: int = 0  # chunked_local: tokens per attention chunk
    releases_out_of_window: bool = True  # skipped blocks are released while the request runs
    eagle_drop: int = 0  # blocks a lookup matches past the hit and drops (EAGLE/MTP: 1; 0: no spec decode)

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError("a KV cache group's block_size must be positive")
        if self.eagle_drop < 0:
            raise ValueError("a KV cache group's eagle_drop cannot be negative")
        if self.kind == "sliding_window" and self.window <= 0:
            raise ValueError("a sliding-window group needs a positive window")
        if self.kind == "chunked_local" and self.chunk <= 0:
            raise ValueError("a chunked local attention group needs a positive chunk")

    def skipped_tokens(self, computed: int) -> int:
        """Tokens no later token attends to once ``computed`` tokens are computed."""
        if self.kind == "sliding_window":
            return max(0, computed - self.window + 1)
        if self.kind == "chunked_local":
            return computed // self.chunk * self.chunk
        return 0

    def skipped_blocks(self, computed: int) -> int:
        """Leading positions of the table that hold the null placeholder once ``computed`` tokens are computed."""
        return self.skipped_tokens(computed) // self.block_size if self.releases_out_of_window else 0

    def blocks_for(self, tokens: int) -> int:
        """Positions a table of ``tokens`` tokens has (a partial tail takes a whole position)."""
        return -(-tokens // self.block_size)

    def read_blocks(self, length: int) -> range:
        """Positions of a hit of ``length`` tokens that the next token still reads (their blocks must be cached)."""
        end = length // self.block_size
        if self.kind == "sliding_window":
            need = -(-(self.window - 1) // self.block_size)
            return range(max(0, end - need), end)
        if self.kind == "chunked_local":
            return range(length // self.chunk * self.chunk // self.block_size if length else 0, end)
        return range(end)

    def matched_blocks(self, length: int) -> range:
        """Positions a lookup must find cached to grant a hit of ``length`` tokens: those the next token reads,
        then the ``eagle_drop`` blocks past the hit that the lookup matches and drops (recomputed for the draft
        head). Without spec decode, the read blocks."""
        read = self.read_blocks(length)
        end = length // self.block_size
        return range(read.start if len(read) else end, end + self.eagle_drop)

    def servable(self, length: int, prompt: tuple[int, ...], cached: Mapping[tuple[int, ...], Hashable]) -> bool:
        """Whether this group can serve a hit of ``length`` prompt tokens from the blocks it has cached.

        A hit of none is always served. Otherwise ``length`` is whole blocks, the matched blocks lie in the
        prompt's whole blocks, and each is cached."""
        if length == 0:
            return True
        if length % self.block_size:
            return False
        bs = self.block_size
        matched = self.matched_blocks(length)
        return matched.stop * bs <= len(prompt) and all(prompt[: (i + 1) * bs] in cached for i in matched)

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "block_size": self.block_size,
            "window": self.window,
            "chunk": self.chunk,
            "releases_out_of_window": self.releases_out_of_window,
            "eagle_drop": self.eagle_drop,
        }


def hit_granularity(groups: tuple[KvGroup, ...]) -> int:
    """Hits land on multiples of every group's block size: their least common multiple."""
    return lcm(*(g.block_size for g in groups))


def longest_common_hit(
    groups: tuple[KvGroup, ...], prompt: tuple[int, ...], cached: tuple[Mapping[tuple[int, ...], Hashable], ...]
) -> int:
    """The longest hit every group can serve for ``prompt``, with one token left to compute."""
    step = hit_granularity(groups)
    length = max(len(prompt) - 1, 0) // step * step
    while length > 0 and not all(g.servable(length, prompt, c) for g, c in zip(groups, cached, strict=True)):
        length -= step
    return length


@dataclass(frozen=True)
class HybridView:
    """The groups' tables and caches at one instant.

    ``groups``: the KV cache groups, as declared; ``tables``: each running
    request's table per group (same order); ``computed``: tokens computed per
    running request; ``cached``: per group, the token prefix of every cached
    block of that group to the block a lookup finds; ``free_queue``: the blocks
    of the pool's free queue as its links list them; ``null``: the pool's
    null placeholder block id (never a table entry, never free).
    """

    groups: tuple[KvGroup, ...]
    tables: Mapping[str, tuple[Table, ...]]
    computed: Mapping[str, int]
    cached: tuple[Mapping[tuple[int, ...], Hashable], ...]
    free_queue: tuple[Hashable, ...]
    null: Hashable


def hybrid_view(obs: Observation) -> HybridView | None:
    """The HybridView an observation carries, or None (not a hybrid adapter)."""
    view = obs.extra.get(HYBRID)
    return view if isinstance(view, HybridView) else None


__all__ = [
    "HYBRID",
    "AttentionKind",
    "HybridView",
    "KvGroup",
    "Table",
    "hit_granularity",
    "hybrid_view",
    "longest_common_hit",
]
