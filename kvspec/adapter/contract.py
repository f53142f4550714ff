"""The adapter contract: how the kit drives one implementation.

An adapter translates spec operations into the implementation's own calls and
projects its internal state into the spec's Observation. It never re-implements
the allocator it wraps.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from kvspec.spec import Config, Event, Observation, Op, Outcome, Semantics
from kvspec.spec.delta import ObservationDelta
from kvspec.spec.ops import OP_KINDS, OpKind

DECLINABLE: dict[str, str] = {
    "release_drop": "release(keep=False): the implementation cannot drop a request's cached blocks on release",
}
"""Variants of an implemented op that an adapter may decline (``Capabilities.declines``)."""


@dataclass(frozen=True)
class Capabilities:
    """What an adapter can do and what it claims.

    ops: the operations it implements (others are never generated for it).
    semantics: the spec parameters it declares; with ``semantics.exact`` the
      refinement checks hold it to the spec's predictions.
    fixed_config: the pool is fixed by the implementation (a live server): the
      suite uses it instead of drawing pool sizes.
    pool_scale: pool blocks one prompt block takes: several KV cache groups each
      hold a table per request over one pool (spec.kv_groups), so the suite draws
      pools this many times larger and sizes its long prompts by the pool over the
      scale, so that prompts run as long, past windows and chunks, as with one group.
    observes_index: the observation carries the cache index.
    live: a running server checked from the outside (completions in, events out): it
      implements the live protocol (``start``, ``complete``, ``check``, ...) instead of
      ``apply``/``observe``, and ``kvspec check`` hands it to the live runner.
    declines: variants of implemented ops it never gets (names of DECLINABLE); every
      check, refinement included, still holds it on the ops it gets.
    checks_input: the implementation's own validation is under test, so bad input
      reaches ``apply``. False: the kit answers bad input from ``spec.validate`` and
      the adapter never sees it.
    contracts: misuse contracts of a block-level API the adapter can exercise, each
      ``"OP:NAME"`` (OP one of ``ops``): the machine also draws OP with ``contract=NAME``
      (e.g. ``"release:repeated"``: the free called again on the freed blocks), which the
      adapter drives through the implementation's misuse path. The spec judges it as the
      plain OP, so a failure path that is not atomic, or a repeated free that counts twice,
      is reported by the invariant it breaks.
    deltas: the adapter also implements ``observe_delta()`` (:class:`DeltaAdapter`): what a step changed,
      so that the kit, asked to check the whole state only every K steps (``--full-check-every K``),
      checks the changed part on the steps between (spec/delta.py).

    An adapter may build its capabilities per instance (in ``__init__``), from what
    it finds installed: the suite reads them from the instance it builds.
    """

    semantics: Semantics
    ops: frozenset[OpKind] = frozenset(OP_KINDS)
    fixed_config: Config | None = None
    pool_scale: int = 1
    observes_index: bool = True
    version: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    live: bool = False
    declines: frozenset[str] = frozenset()
    checks_input: bool = True
    contracts: frozenset[str] = frozenset()
    deltas: bool = False

    def __post_init__(self) -> None:
        unknown = self.declines - set(DECLINABLE)
        if unknown:
            raise ValueError(f"cannot decline {sorted(unknown)}; declinable: {sorted(DECLINABLE)}")
        for contract in sorted(self.contracts):
            op, _, name = contract.partition(":")
            if op not in self.ops or not name:
                raise ValueError(f"contract {contract!r} is not OP:NAME with OP one of {sorted(self.ops)}")

    def allows(self, op: Op) -> bool:
        """Whether the suite may give the adapter ``op``: an op it implements, in no variant it declines."""
        if op.op == "release" and not op.keep and "release_drop" in self.declines:
            return False
        if op.contract and f"{op.op}:{op.contract}" not in self.contracts:
            return False
        return op.op in self.ops or op.op not in OP_KINDS  # an undefined op is bad input every adapter gets


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


@runtime_checkable
class DeltaAdapter(Adapter, Protocol):
    """An adapter that can say what a step changed (``Capabilities.deltas``).

    Invariant: ``observe_delta()`` applied to the observation as of the previous ``observe()`` or
    ``observe_delta()`` call equals what ``observe()`` would return now
    (``observe_delta().apply(previous) == observe()``, spec.delta.ObservationDelta). Every K steps
    and at the end of a run the kit asks for both and compares them, so a delta that leaves a change out
    is reported (adapter_contract) and the change itself judged on the whole state.
    """

    def observe_delta(self) -> ObservationDelta | None:
        """What changed since the last ``observe()`` or ``observe_delta()``; None: cannot say (the kit
        calls ``observe()`` instead)."""
        ...


AdapterFactory = Callable[[], Adapter]
"""What builds one adapter instance: a class or any callable (the kit builds a fresh one per replay)."""
