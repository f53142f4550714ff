"""The adapter contract: how the kit drives one implementation.

An adapter translates spec operations into the implementation's own calls and
projects its internal state into the spec's Observation. It never re-implements
the allocator it wraps, and it shows state as it is: it never filters the
implementation's index or tables to what a lookup can hit (a stale index entry
and a partial page are shown like any other), so that the checks, not the
adapter, decide what is wrong (cache_index_consistency reports an entry that
names a block not cached under its key).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from kvspec.spec import Config, Event, Observation, Op, Outcome, Semantics
from kvspec.spec.delta import ObservationDelta
from kvspec.spec.ops import OP_KINDS, OpKind
from kvspec.spec.stream import StreamResult

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
    observes_index: the observation carries the cache index: the implementation's lookup structure as it is,
      every entry (one that a lookup's own guard would miss on too: the checks judge it, the adapter never
      filters it out).
    live: a running server checked from the outside (completions in, events out): it
      implements :class:`LiveAdapter` (``start``, ``complete``, ``check``, ...) instead of
      ``apply``/``observe``, and ``kvspec check`` hands it to the live runner.
    declines: variants of implemented ops it never gets (names of DECLINABLE); every
      check, refinement included, still holds it on the ops it gets.
    checks_input: the implementation's own validation is under test, so bad input
      reaches ``apply`` and must come back ``invalid``. False (the default): the kit
      answers bad input from the spec's own validation (``kvspec.spec.ledger.validate``)
      and the adapter never sees it, so an adapter never writes input checks of its own.
    contracts: misuse contracts of a block-level API the adapter can exercise, each
      ``"OP:NAME"`` (OP one of ``ops``): the machine also draws OP with ``contract=NAME``,
      which the adapter drives through the implementation's misuse path: ``repeated`` (the
      free called again on the freed request), ``unchecked`` (the allocation with no capacity
      check first; the allocation failing is the refusal, and what it left is judged),
      ``never_admitted`` (the plain op plus, in the same step, the engine's free of a request
      it never admitted: such an op on its own is bad input, which the kit answers before
      the adapter when ``checks_input`` is False). Declare one only where the engine's own
      API allows the call. The spec judges it as the plain OP, so a failure path that is not
      atomic, or a repeated free that counts twice, is reported by the invariant it breaks.
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
    checks_input: bool = False
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
        """Project the implementation's own state into the spec's ledger, as it is: every index entry and every
        table entry the implementation holds, none filtered to what a lookup can hit (the checks judge them)."""
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


class ServerStartError(RuntimeError):
    """A live server could not be started or did not become healthy; ``log_tail`` is the end of its log."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        self.log_tail = log_tail
        super().__init__(message + (f"\n--- server log (tail) ---\n{log_tail}" if log_tail else ""))


@dataclass(frozen=True)
class ServerInfo:
    """What a live server showed when it started: what the live runner can drive and how its cache is shaped."""

    can_reset: bool
    has_events: bool
    block_size: int
    num_gpu_blocks: int | None
    max_model_len: int
    vocab_size: int
    version: str


@runtime_checkable
class LiveAdapter(Protocol):
    """A running server checked from the outside (``Capabilities(live=True)``): prompts in, what it shows out.

    The live runner (stateful_tests/live.py) starts it, sends sequential completions (exact mode: each
    request alone, so the spec predicts its cached tokens) and concurrent bursts (load mode), reads its
    gauges, and finally asks it to judge what it recorded. Invariant: every completion, reset, gauge
    reading and published cache event is recorded, in the order the client saw it, and :meth:`check`
    judges exactly the records :meth:`records` returns (a violation's counterexample is that log).
    """

    name: str
    capabilities: Capabilities
    startup_s: float | None  # seconds the server took to come up (None: attached, not started)

    def configure(
        self,
        *,
        url: str | None = None,
        events: str | None = None,
        replay: str | None = None,
        record: Path | None = None,
    ) -> None:
        """Before :meth:`start`: the server at ``url`` (None: start one), its event endpoints, a log file."""

    def start(self) -> ServerInfo:
        """Start (or attach to) the server, follow what it publishes; raise when it does not come up."""
        ...

    @property
    def url(self) -> str:
        """The server's base URL."""
        ...

    def complete(self, prompt: Sequence[int], max_tokens: int, *, mode: str = "exact") -> dict[str, Any]:
        """One completion of ``prompt`` (token ids) generating exactly ``max_tokens``; its request record."""
        ...

    def complete_many(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> list[dict[str, Any]]:
        """``prompts`` sent at once (load mode); their request records."""
        ...

    def reset_cache(self) -> bool:
        """Empty the server's prefix cache (recorded); True when it did."""
        ...

    def snapshot(self, idle: bool) -> object:
        """Read and record the server's gauges (``idle``: nothing is in flight now)."""
        ...

    def preemptions_total(self) -> float | None:
        """The server's preemption counter, read now (the reading recorded as a snapshot while idle)."""
        ...

    def settle(self) -> None:
        """Wait until what the server publishes has quiesced (every step's events are in)."""

    def check(self) -> StreamResult:
        """Judge everything recorded so far with the spec's stream checks (kvspec.spec.stream)."""
        ...

    def records(self) -> list[dict[str, Any]]:
        """The recorded log, as JSON objects in order: what a violation saves as its case."""
        ...

    @property
    def gaps(self) -> list[tuple[int, int]]:
        """Published batches lost on the way (sequence ranges [from, to))."""
        ...

    def close(self) -> None:
        """Stop what :meth:`start` started; always called."""
