"""Cache quality measured from a trace: a measurement of how well the cache was used, never a verdict.

Four figures, the same for every format that can say them (kvfabric, side-table, kvspec):

- **hit rate**: prompt tokens served from the cache over the prompt tokens looked up
  (``token_hit_rate``), and the share of lookups that hit at all (``lookup_hit_rate``);
  a side table that records block hashes but no token counts gives ``block_hit_rate``;
- **eviction regret**: evictions whose content (block hash, cache key) was cached again
  later in the trace, i.e. recomputed; ``regret_rate`` is their share of the evictions;
- **evictions by state**: the share of evictions taken from each lifecycle state the format
  records (KVFabric: COOLING_HOT, COOLING_WARM, CANDIDATE), and how many evicted blocks had
  been hit at least once;
- **orphaned cached blocks over time**: cached blocks whose parent block is not cached, so a
  prefix lookup (which walks the chain from the first block) can never reach them. Counted
  incrementally after every change of the cache; the JSON keeps the maximum, the last value,
  the mean share of cached blocks and at most ``SERIES_POINTS`` samples ``[line, orphans,
  cached]``. A block's parent comes from ``parent_hash`` (a first block has none); where the
  trace does not link a deeper block to its parent, the orphan count is unknown, with the reason.

A rate over nothing is ``null`` (strict JSON has no NaN).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

SERIES_POINTS = 20
"""How many orphan samples the JSON keeps (evenly spaced over the run, the last one always)."""


def _rate(part: int, whole: int) -> float | None:
    return round(part / whole, 6) if whole else None


@dataclass
class OrphanCounter:
    """Cached blocks and how many of them are orphans, kept up to date one block at a time.

    A block is an orphan while its parent content is cached on no block. ``children[p]`` counts
    the cached blocks whose parent is ``p``; the orphan count changes only around the content
    that was cached or uncached, so every update is O(1).
    """

    cached: Counter[Hashable] = field(default_factory=Counter)
    children: Counter[Hashable] = field(default_factory=Counter)
    blocks: int = 0
    orphans: int = 0

    def add(self, content: Hashable, parent: Hashable | None) -> None:
        """A block holding ``content`` (child of ``parent``; None for a first block) entered the cache."""
        if parent is not None:
            self.children[parent] += 1
            if not self.cached[parent]:
                self.orphans += 1
        self.cached[content] += 1
        if self.cached[content] == 1:
            self.orphans -= self.children[content]  # its cached children have their parent back
        self.blocks += 1

    def remove(self, content: Hashable, parent: Hashable | None) -> None:
        """A block holding ``content`` left the cache (evicted, reset)."""
        self.cached[content] -= 1
        if not self.cached[content]:
            del self.cached[content]
            self.orphans += self.children[content]  # its cached children lost their parent
        if parent is not None:
            self.children[parent] -= 1
            if not self.children[parent]:
                del self.children[parent]
            if not self.cached[parent]:
                self.orphans -= 1
        self.blocks -= 1


@dataclass
class TraceQuality:
    """The quality figures of one trace, filled in by a format's replay."""

    lookups: int = 0
    lookups_hit: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0
    lookup_blocks: int = 0
    hit_blocks: int = 0
    evictions: int = 0
    evictions_of_hit_blocks: int = 0
    by_state: Counter[str] = field(default_factory=Counter)
    regret: int = 0
    evicted: Counter[Hashable] = field(default_factory=Counter)  # evicted content not cached again yet
    series: list[tuple[int, int, int]] = field(default_factory=list)
    orphan_reason: str = ""  # why orphans are unknown; empty while they are known
    samples: int = 0
    orphan_share_sum: float = 0.0
    orphans_max: int = 0

    # -- what the replay reports --------------------------------------------------------
    def lookup(self, *, hit: bool, prompt_tokens: int | None = None, hit_tokens: int | None = None) -> None:
        """One prefix lookup; token counts where the trace gives them.

        A hit longer than its prompt (a wrong trace, which the format's check reports) counts
        as the whole prompt, so the token hit rate stays a rate.
        """
        self.lookups += 1
        self.lookups_hit += hit
        if prompt_tokens is not None and hit_tokens is not None:
            self.prompt_tokens += prompt_tokens
            self.hit_tokens += min(hit_tokens, prompt_tokens)

    def lookup_blocks_hit(self, blocks: int, hit: int) -> None:
        """A lookup over ``blocks`` full-block hashes that reused ``hit`` blocks."""
        self.lookup_blocks += blocks
        self.hit_blocks += hit

    def evict(self, content: Hashable | None, state: str, *, was_hit: bool) -> None:
        """A block left the cache by eviction, from lifecycle ``state``."""
        self.evictions += 1
        self.evictions_of_hit_blocks += was_hit
        self.by_state[state] += 1
        if content is not None:
            self.evicted[content] += 1

    def cache(self, content: Hashable) -> None:
        """Content entered the cache: if it had been evicted, that eviction is regretted (recomputed)."""
        if self.evicted[content]:
            self.evicted[content] -= 1
            self.regret += 1
            if not self.evicted[content]:
                del self.evicted[content]

    def sample(self, line: int, orphans: OrphanCounter) -> None:
        """The orphan count after a change of the cache at ``line``."""
        self.samples += 1
        self.orphans_max = max(self.orphans_max, orphans.orphans)
        if orphans.blocks:
            self.orphan_share_sum += orphans.orphans / orphans.blocks
        self.series.append((line, orphans.orphans, orphans.blocks))

    def orphans_unknown(self, reason: str) -> None:
        """The trace cannot say which blocks are orphans (the first reason stands)."""
        self.orphan_reason = self.orphan_reason or reason

    # -- the figures --------------------------------------------------------------------
    def _orphans_json(self) -> dict[str, Any]:
        if self.orphan_reason:
            return {"known": False, "reason": self.orphan_reason}
        if not self.series:
            return {"known": False, "reason": "nothing was cached in this trace"}
        step = max(1, -(-len(self.series) // SERIES_POINTS))
        picked = self.series[::step]
        if picked[-1] != self.series[-1]:
            picked = [*picked[: SERIES_POINTS - 1], self.series[-1]]
        return {
            "known": True,
            "max": self.orphans_max,
            "final": self.series[-1][1],
            "mean_share": round(self.orphan_share_sum / self.samples, 6),
            "series": [list(point) for point in picked],
        }

    def to_json(self) -> dict[str, Any]:
        """The figures as the report's ``trace.quality`` (kvspec/schemas/report.schema.json, $defs trace_quality)."""
        return {
            "lookups": self.lookups,
            "lookup_hit_rate": _rate(self.lookups_hit, self.lookups),
            "token_hit_rate": _rate(self.hit_tokens, self.prompt_tokens),
            "block_hit_rate": _rate(self.hit_blocks, self.lookup_blocks),
            "evictions": self.evictions,
            "regret": self.regret,
            "regret_rate": _rate(self.regret, self.evictions),
            "evictions_by_state": {
                state: _rate(n, self.evictions) or 0.0 for state, n in sorted(self.by_state.items())
            },
            "evictions_of_hit_blocks": self.evictions_of_hit_blocks,
            "orphans": self._orphans_json(),
        }

    def lines(self) -> list[str]:
        """The figures as the table shows them."""
        data = self.to_json()

        def pct(value: float | None) -> str:
            return "-" if value is None else f"{100 * value:.1f}%"

        states = ", ".join(f"{s} {pct(v)}" for s, v in data["evictions_by_state"].items()) or "-"
        orphans = data["orphans"]
        orphan_text = (
            f"max {orphans['max']}, final {orphans['final']}, mean share {pct(orphans['mean_share'])}"
            if orphans["known"]
            else f"unknown ({orphans['reason']})"
        )
        return [
            "cache quality (a measurement, not a verdict):",
            f"  lookups {data['lookups']}: hit {pct(data['lookup_hit_rate'])} of lookups, "
            f"{pct(data['token_hit_rate'])} of prompt tokens, {pct(data['block_hit_rate'])} of blocks",
            f"  evictions {data['evictions']}: regret {data['regret']} ({pct(data['regret_rate'])} later recomputed),"
            f" {data['evictions_of_hit_blocks']} of hit blocks; by state: {states}",
            f"  orphaned cached blocks: {orphan_text}",
        ]
