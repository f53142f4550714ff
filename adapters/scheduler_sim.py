"""Adapter for the retention-score scheduler simulator (entry granularity).

An admitted prompt is one access to the entry named by its comma-joined
tokens, sized ``len(tokens) * bytes_per_token`` bytes. Requests do not persist:
an access is over when admit returns, so no entry is ever referenced and the
observation has no live requests.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from kvspec.adapter import Capabilities, Config, Event, ObjectView, Observation, Op, Outcome, Semantics
from kvspec.reference.scheduler import SchedulerSim

Tokens = tuple[int, ...]
SimFactory = Callable[[Config], SchedulerSim]


def prefix_of(tokens: Tokens) -> str:
    """The simulator's prefix string for a prompt; distinct prompts give distinct strings."""
    return ",".join(map(str, tokens))


def _default_factory(config: Config) -> SchedulerSim:
    return SchedulerSim(capacity_bytes=config.capacity)


class SchedulerSimAdapter:
    """Drives reference.scheduler.SchedulerSim through admit, the one op it has.

    ``sim_factory`` builds the simulator for a config; tests pass subclasses
    with seeded bugs through it.
    """

    name = "scheduler-sim"
    capabilities = Capabilities(
        semantics=Semantics(granularity="entry", eviction="score", hit_cap=False, exact=True),
        ops=frozenset({"admit"}),
        notes=("requests do not persist: admit is one cache access",),
    )

    def __init__(self, sim_factory: SimFactory | None = None, config: Config | None = None) -> None:
        self._factory: SimFactory = sim_factory or _default_factory
        self.reset(config or Config())

    def reset(self, config: Config) -> None:
        """Start over with a fresh simulator of ``config``'s shape."""
        self.config = config
        self.sim = self._factory(config)
        self._keys: dict[str, Tokens] = {}
        self._pending: list[Event] = []

    def close(self) -> None:
        """Nothing to release: the simulator lives in this process."""

    def apply(self, op: Op) -> Outcome:
        """Run a valid ``op`` (the kit answers bad input: Capabilities.checks_input); a ValueError of the
        simulator is invalid."""
        if op.op != "admit":
            return Outcome.invalid(f"{op.op} is not supported by {self.name}")
        prefix = prefix_of(op.tokens)
        reused = prefix in self.sim.entries
        try:
            self.sim.touch(prefix, len(op.tokens) * self.config.bytes_per_token)
        except ValueError as exc:
            return Outcome.invalid(str(exc))
        finally:
            self._collect()
        self._keys[prefix] = op.tokens
        return Outcome.ok(len(op.tokens) if reused else 0)

    def _collect(self) -> None:
        """Turn the simulator's evictions into events, then forget keys of entries that are gone."""
        for prefix in self.sim.evictions:
            self._pending.append(Event("evict", oid=prefix, key=self._keys.get(prefix)))
        self.sim.evictions.clear()
        for prefix in [p for p in self._keys if p not in self.sim.entries]:
            del self._keys[prefix]

    def observe(self) -> Observation:
        """The simulator's entries as the spec's ledger; keys are the prompt token tuples."""
        sim, bpt = self.sim, self.config.bytes_per_token
        objects: dict[Hashable, ObjectView] = {
            prefix: ObjectView(
                oid=prefix,
                size=e.size_bytes,
                tokens=e.size_bytes // bpt,
                ref_count=0,
                key=self._keys[prefix],
                hits=e.hits,
                last_used=e.last_used,
            )
            for prefix, e in sim.entries.items()
        }
        index: dict[Hashable, tuple[Hashable, ...]] = {self._keys[prefix]: (prefix,) for prefix in sim.entries}
        return Observation(sim.capacity_bytes, sim.capacity_bytes - sim.current_bytes, objects, {}, index)

    def events(self) -> list[Event]:
        """Evictions since the last call, in order."""
        out, self._pending = self._pending, []
        return out
