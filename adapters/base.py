"""The adapter contract: how the kit drives one implementation.

An adapter translates spec operations into the implementation's own calls and
projects its internal state into the spec's Observation. It never re-implements
the allocator it wraps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from kvspec.spec import Config, Event, Observation, Op, Outcome, Semantics
from kvspec.spec.ops import OP_KINDS, OpKind


@dataclass(frozen=True)
class Capabilities:
    """What an adapter can do and what it claims.

    ops: the operations it implements (others are never generated for it).
    semantics: the spec parameters it declares; with ``semantics.exact`` the
      refinement checks hold it to the spec's predictions.
    fixed_config: the pool is fixed by the implementation (a live server): the
      suite uses it instead of drawing pool sizes.
    observes_index: the observation carries the cache index.
    live: a running server checked from the outside (completions in, events out): it
      implements the live protocol (``start``, ``complete``, ``check``, ...) instead of
      ``apply``/``observe``, and ``kvspec check`` hands it to the live runner.
    """

    semantics: Semantics
    ops: frozenset[OpKind] = frozenset(OP_KINDS)
    fixed_config: Config | None = None
    observes_index: bool = True
    version: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    live: bool = False


@runtime_checkable
class Adapter(Protocol):
    """One implementation under test."""

    name: str
    capabilities: Capabilities

    def reset(self, config: Config) -> None:
        """Start over with an empty pool of ``config``'s shape."""

    def apply(self, op: Op) -> Outcome:
        """Run one operation. Bad input must come back as Outcome.invalid, not raise."""
        ...

    def observe(self) -> Observation:
        """Project the implementation's own state into the spec's ledger."""
        ...

    def events(self) -> list[Event]:
        """Evictions and reclaims since the last call, in order (drained)."""
        ...

    def close(self) -> None:
        """Release what the adapter holds (a process, a server)."""
