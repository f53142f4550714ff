"""Adapter for the shared-prefix lifecycle simulator (record granularity).

A request's prompt names its record: the prompt tokens, comma-joined, are the
simulator's prefix string. The adapter keeps only what the simulator cannot
know, which live request holds which record, and reads every ledger figure
(sizes, ref counts, hits, free blocks) from the simulator itself.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from kvspec.adapter import Capabilities, Config, Event, ObjectView, Observation, Op, Outcome, RequestView, Semantics
from kvspec.reference.lifecycle import CapacityError, LifecycleSim

Tokens = tuple[int, ...]
SimFactory = Callable[[Config], LifecycleSim]


def prefix_of(tokens: Tokens) -> str:
    """The simulator's prefix string for a prompt; distinct prompts give distinct strings."""
    return ",".join(map(str, tokens))


def _default_factory(config: Config) -> LifecycleSim:
    return LifecycleSim(total_blocks=config.capacity, block_size_tokens=config.block_size)


@dataclass
class _Live:
    prefix: str
    tokens: Tokens
    prompt_len: int


class LifecycleSimAdapter:
    """Drives reference.lifecycle.LifecycleSim through the spec's request-level ops.

    ``sim_factory`` builds the simulator for a config; tests pass subclasses
    with seeded bugs through it.
    """

    name = "lifecycle-sim"
    capabilities = Capabilities(
        semantics=Semantics(
            granularity="record",
            eviction="lifecycle",
            hit_cap=False,
            reset_requires_idle=True,
            exact=True,
        ),
        ops=frozenset({"admit", "append", "release"}),
        notes=("prefix string = comma-joined prompt tokens; key = prompt token tuple",),
    )

    def __init__(self, sim_factory: SimFactory | None = None, config: Config | None = None) -> None:
        self._factory: SimFactory = sim_factory or _default_factory
        self.reset(config or Config())

    def reset(self, config: Config) -> None:
        """Start over with a fresh simulator of ``config``'s shape."""
        self.config = config
        self.sim = self._factory(config)
        self._live: dict[str, _Live] = {}
        self._keys: dict[str, Tokens] = {}
        self._pending: list[Event] = []

    def close(self) -> None:
        """Nothing to release: the simulator lives in this process."""

    # -- operations -------------------------------------------------------------
    def apply(self, op: Op) -> Outcome:
        """Run a valid ``op`` (the kit answers bad input: Capabilities.checks_input); simulator errors map to
        invalid (ValueError) or refused (CapacityError)."""
        try:
            if op.op == "admit":
                return self._admit(op)
            if op.op == "append":
                return self._append(op)
            if op.op == "release":
                return self._release(op)
            return Outcome.invalid(f"{op.op} is not supported by {self.name}")
        except CapacityError as exc:
            return Outcome.refused(str(exc))
        except ValueError as exc:
            return Outcome.invalid(str(exc))
        finally:
            self._collect()

    def _admit(self, op: Op) -> Outcome:
        assert op.req is not None
        prefix = prefix_of(op.tokens)
        shared = prefix in self.sim.records
        self.sim.acquire(prefix, len(op.tokens))
        self._keys[prefix] = op.tokens
        self._live[op.req] = _Live(prefix, op.tokens, len(op.tokens))
        return Outcome.ok(len(op.tokens) if shared else 0)

    def _append(self, op: Op) -> Outcome:
        live = self._live[str(op.req)]
        self.sim.append(live.prefix, len(op.tokens))
        live.tokens = live.tokens + op.tokens
        return Outcome.ok()

    def _release(self, op: Op) -> Outcome:
        live = self._live[str(op.req)]
        self.sim.release(live.prefix, keep_reusable=op.keep)
        del self._live[str(op.req)]
        return Outcome.ok()

    def _collect(self) -> None:
        """Turn the simulator's evictions into events, then forget keys of records that are gone."""
        for kind, prefix in self.sim.evictions:
            self._pending.append(Event(kind, oid=prefix, key=self._keys.get(prefix)))
        self.sim.evictions.clear()
        for prefix in [p for p in self._keys if p not in self.sim.records]:
            del self._keys[prefix]

    # -- observation --------------------------------------------------------------
    def observe(self) -> Observation:
        """The simulator's records as the spec's ledger; keys are the prompt token tuples."""
        sim = self.sim
        objects: dict[Hashable, ObjectView] = {
            prefix: ObjectView(
                oid=prefix,
                size=rec.block_count,
                tokens=rec.used_tokens,
                ref_count=rec.ref_count,
                key=self._keys[prefix],
                hits=rec.hits,
                last_used=rec.last_used,
            )
            for prefix, rec in sim.records.items()
        }
        requests = {
            rid: RequestView(rid, live.tokens, live.prompt_len, (live.prefix,)) for rid, live in self._live.items()
        }
        index: dict[Hashable, tuple[Hashable, ...]] = {self._keys[prefix]: (prefix,) for prefix in sim.records}
        return Observation(sim.total_blocks, sim.free_blocks, objects, requests, index)

    def events(self) -> list[Event]:
        """Evictions and reclaims since the last call, in order."""
        out, self._pending = self._pending, []
        return out
