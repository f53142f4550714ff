"""Recording traces: drive an adapter with ops and write down what it did, as a kvspec trace.

``record`` writes no verdicts: a recorded trace is evidence, checked later (and
elsewhere) by ``kvspec trace check``. Ops come from a case or workload file or
from a seeded generator of valid request-level ops over a small token alphabet,
so that prompts share prefixes and the pool comes under pressure.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvspec import jsonio
from kvspec.adapter import Adapter
from kvspec.adapter.answers import malformed, malformed_observation
from kvspec.spec import Config, Event, Observation, Op, Outcome
from kvspec.spec.block_key import Prefix, block_keys
from kvspec.spec.ledger import BlockLedger
from kvspec.spec.ops import OpKind, size_of

from . import values
from .kvspec_format import DELTA_SCHEMA, header_json, step_json
from .trace_delta import diff


@dataclass(frozen=True)
class RecordedStep:
    """One step as the adapter showed it: the ledger before and after, the op, its outcome, the events."""

    step: int
    before: Observation
    op: Op
    outcome: Outcome
    events: list[Event]
    after: Observation


def load_ops(path: Path) -> tuple[dict[str, int], list[Op]]:
    """Ops, and the pool fields the file gives, from a case file (``kvspec_case``: its ``config``) or a
    workload (``{"ops": [...]}``, its ``block_size``).

    Strict: OSError when the file cannot be read; ValueError (one line) when it is not JSON, has no
    ``ops`` list, or holds a value of the wrong type (an op of the case schema's shape, a pool of
    positive integers; values.py).
    """
    data = jsonio.load(path)
    if not isinstance(data, dict) or not isinstance(data.get("ops"), list):
        raise ValueError("has no 'ops' list (expected a kvspec case or a workload file)")
    fields: dict[str, int] = {}
    if "config" in data:
        fields.update(values.config("config", data["config"]).to_json())
    if "block_size" in data:
        fields["block_size"] = values.integer("block_size", data["block_size"], minimum=1)
    return fields, [values.op(f"ops[{i}]", op) for i, op in enumerate(data["ops"])]


class RandomOps:
    """Valid ops drawn from the adapter's current ledger: template prompts with private tails, appends,
    releases (sometimes without keeping the cache), preemptions, resumes and the odd cache reset."""

    ALPHABET = 4  # token ids 0..3: prompts of one family share blocks

    def __init__(self, seed: int, config: Config, allowed: frozenset[OpKind], granularity: str) -> None:
        self.rng, self.config, self.allowed, self.granularity = random.Random(seed), config, allowed, granularity
        self.templates = [self._tokens(1, 3 * config.block_size + 1) for _ in range(3)]
        self.next_req = 0

    def _tokens(self, low: int, high: int) -> tuple[int, ...]:
        return tuple(self.rng.randrange(self.ALPHABET) for _ in range(self.rng.randint(low, max(low, high))))

    def _fits(self, tokens: int) -> bool:
        return size_of(tokens, self.config, self.granularity) <= self.config.capacity  # type: ignore[arg-type]

    def next(self, obs: Observation) -> Op:
        running = sorted(r.req for r in obs.requests.values() if r.state == "running")
        waiting = sorted(r.req for r in obs.requests.values() if r.state == "preempted")
        choices: list[tuple[OpKind, int]] = [("admit", 5)]
        if running:
            choices += [("append", 3), ("release", 3), ("preempt", 1)]
        if waiting:
            choices += [("resume", 2), ("release", 1)]
        choices += [("reset_cache", 1)]
        kinds = [(k, w) for k, w in choices if k in self.allowed] or [("admit", 1)]
        kind = self.rng.choices([k for k, _ in kinds], weights=[w for _, w in kinds])[0]
        if kind == "admit":
            prompt = self.rng.choice(self.templates) + self._tokens(0, self.config.block_size + 1)
            while not self._fits(len(prompt)):
                prompt = prompt[:-1]
            self.next_req += 1
            return Op("admit", f"r{self.next_req}", prompt)
        if kind == "append":
            req = self.rng.choice(running)
            held = len(obs.requests[req].tokens)
            extra = self._tokens(1, self.config.block_size + 1)
            if not self._fits(held + len(extra)):
                return Op("release", req)
            return Op("append", req, extra)
        if kind == "release":
            return Op("release", self.rng.choice(running or waiting), keep=self.rng.random() > 0.2)
        if kind == "preempt":
            return Op("preempt", self.rng.choice(running))
        if kind == "resume":
            return Op("resume", self.rng.choice(waiting))
        return Op("reset_cache")


def drive(
    adapter: Adapter, config: Config, ops: Sequence[Op] | Callable[[Observation], Op], steps: int | None = None
) -> Iterator[RecordedStep]:
    """Reset ``adapter`` to ``config`` and apply ``ops`` (a list, or a function of the ledger and ``steps``).

    Every answer is held to the adapter contract's types before it is recorded: a malformed one raises
    :class:`MalformedAnswer` (the steps before it were yielded)."""
    adapter.reset(config)
    adapter.events()  # drop anything left from before the reset
    obs = adapter.observe()
    if malformed_observation(obs):
        raise MalformedAnswer(f"before the first step: {'; '.join(malformed_observation(obs))}")
    count = len(ops) if isinstance(ops, Sequence) else steps or 0
    for i in range(count):
        op = ops[i] if isinstance(ops, Sequence) else ops(obs)
        outcome = adapter.apply(op)
        events = adapter.events()
        after = adapter.observe()
        problems = malformed(outcome, events, after)
        if problems:
            raise MalformedAnswer(f"at step {i} ({op}): {'; '.join(problems)}")
        yield RecordedStep(i, obs, op, outcome, events, after)
        obs = after


class MalformedAnswer(ValueError):
    """An adapter answered with something that is not what the adapter contract's types say (kvspec.adapter)."""


def write_kvspec_trace(
    path: Path,
    adapter: Adapter,
    config: Config,
    recorded: Sequence[RecordedStep],
    *,
    observations: bool = True,
    snapshot_every: int | None = None,
) -> None:
    """Write ``recorded`` as a kvspec trace; without ``observations`` only ops, outcomes and events.

    ``snapshot_every=K``: version 2, each step's observation as a delta from the one before
    (kvspec/traces/trace_delta.py), a full one on every K-th step (steps 0, K, 2K, ...); None: version 1,
    a full observation on every step.
    """
    caps = adapter.capabilities
    initial = recorded[0].before if recorded else adapter.observe()
    header = header_json(adapter.name, caps.version, config, caps.semantics, initial if observations else None)
    if snapshot_every is None or not observations:
        lines = [
            header,
            *(step_json(s.step, s.op, s.outcome, s.events, s.after if observations else None) for s in recorded),
        ]
        write_jsonl(path, lines)
        return
    header["kvspec_trace"] = DELTA_SCHEMA
    header["snapshot_every"] = snapshot_every
    lines = [header]
    previous = header["observation"]
    for s in recorded:
        line = step_json(s.step, s.op, s.outcome, s.events, s.after)
        now = line["observation"]
        if s.step % snapshot_every:
            line["delta"] = diff(previous, now)
            del line["observation"]
        lines.append(line)
        previous = now
    write_jsonl(path, lines)


def write_jsonl(path: Path, lines: Sequence[dict[str, Any]]) -> None:
    """One strict JSON object a line (ValueError on NaN or Infinity), written atomically (kvspec.jsonio)."""
    jsonio.write_text(path, "".join(json.dumps(line, separators=(",", ":"), allow_nan=False) + "\n" for line in lines))


def _hash_json(key: object) -> str | int:
    """A block hash as the side table writes it: hex for bytes, ints and strings as they are."""
    if isinstance(key, bytes):
        return key.hex()
    if isinstance(key, int | str) and not isinstance(key, bool):
        return key
    return repr(key)


class SideTableDeriver:
    """Derive a block side table from an adapter's observations and events, step by step.

    The adapter shows ledgers, not lifecycle events: each step's events are read
    off the difference between the ledger before and after it (allocations,
    seals, touches, reference drops) and its evict/reclaim events. The candidate
    ranking before an eviction is not something an adapter shows; where it
    declares exact LRU semantics it is taken from the spec's own free queue, so
    the log's policy_conformance holds the adapter's evictions to the spec's order.
    """

    def __init__(self, adapter: Adapter, config: Config) -> None:
        sem = adapter.capabilities.semantics
        if sem.granularity != "block":
            raise ValueError(f"a side table needs a block-granularity adapter; {adapter.name} is {sem.granularity}")
        self.config, self.semantics, self.name = config, sem, adapter.name
        self.model = BlockLedger(config, sem) if sem.exact and sem.eviction == "lru" else None
        self.key_of: dict[Prefix, Hashable] = {}  # the spec's key of a block -> the adapter's
        self.seq = 0

    def header(self) -> dict[str, Any]:
        sem = self.semantics
        return {
            "kvspec_side_table": 1,
            "source": self.name,
            "num_blocks": self.config.capacity,
            "block_size": self.config.block_size,
            "policy": "lru" if self.model is not None else None,
            "hit_cap": sem.hit_cap,
            "duplicate_hashes": sem.duplicate_keys == "indexed",
        }

    def _learn(self, obs: Observation) -> None:
        bs = self.config.block_size
        for r in obs.requests.values():
            for oid, content in zip(r.objects, block_keys(r.tokens, bs), strict=False):  # its full blocks
                obj = obs.objects.get(oid)
                if obj is not None and obj.key is not None:
                    self.key_of.setdefault(content, obj.key)

    def _event(self, out: list[dict[str, Any]], name: str, step: int, **fields: Any) -> None:
        self.seq += 1
        out.append({"event": name, "seq": self.seq, "step": step, **{k: v for k, v in fields.items() if v is not None}})

    def _ranking(self, before: Observation, hit: set[object]) -> list[dict[str, Any]] | None:
        """Cached, unreferenced blocks in the spec's free-queue order, as the adapter's block ids."""
        assert self.model is not None
        used: set[object] = set(hit)
        ranked = []
        for sid in self.model.free_queue:
            content = self.model.slots[sid].key
            if content is None:
                continue
            key = self.key_of.get(content)
            holders = (before.index or {}).get(key, ()) if key is not None else ()
            if holders and all(o in hit for o in holders):
                continue  # a prefix hit takes it out of the queue before anything is evicted
            oids = [o for o in holders if o not in used]
            oids = [o for o in oids if (obj := before.objects.get(o)) is not None and obj.ref_count == 0]
            if not oids:
                return None  # the spec's slot has no counterpart we can name: rank nothing rather than guess
            used.add(oids[0])
            ranked.append({"block_id": oids[0], "block_hash": _hash_json(key)})
        return ranked

    def step(self, s: RecordedStep) -> list[dict[str, Any]]:
        """The side-table events of one recorded step, in the order the engine would write them."""
        out: list[dict[str, Any]] = []
        before, after, op, bs = s.before, s.after, s.op, self.config.block_size
        rid = op.req or ""
        self._learn(before)
        self._learn(after)
        ranking = None
        hit_blocks: list[Hashable] = []
        if op.op in ("admit", "resume") and s.outcome.status == "ok" and rid in after.requests:
            req = after.requests[rid]
            hit_blocks = list(req.objects[: (s.outcome.hit_tokens or 0) // bs])
        if self.model is not None:
            if any(e.kind == "evict" for e in s.events):
                ranking = self._ranking(before, set(hit_blocks))
            self.model.step(op)
        if op.op in ("admit", "resume") and s.outcome.status == "refused":
            self._event(out, "cache_admission_limited", s.step, request_id=op.req, reason=s.outcome.message)
        if op.op in ("admit", "resume") and rid in after.requests and s.outcome.status == "ok":
            req = after.requests[rid]
            hashes = []
            for content in block_keys(req.tokens, bs):
                key = self.key_of.get(content)
                if key is None:
                    break
                hashes.append(_hash_json(key))
            self._event(
                out,
                "prefix_lookup",
                s.step,
                request_id=op.req,
                prompt_tokens=len(req.tokens),
                block_hashes=hashes,
                hit_blocks=hit_blocks,
                hit_tokens=s.outcome.hit_tokens,
            )
            for oid in hit_blocks:
                obj = after.objects[oid]
                self._event(
                    out,
                    "block_touched",
                    s.step,
                    block_id=oid,
                    block_hash=_hash_json(obj.key),
                    ref_count=obj.ref_count,
                    hit_count=obj.hits,
                    share_degree=obj.ref_count,
                    state="sealed",
                )
        evictions = [e for e in s.events if e.kind == "evict"]
        if evictions and ranking is not None:
            self._event(out, "eviction_candidates_ranked", s.step, candidates=ranking)
        for e in evictions:
            self._evicted(out, s.step, before, e, "evict")
        if op.op in ("admit", "resume", "append") and s.outcome.status == "ok" and rid in after.requests:
            self._grown(out, s, before, after)
        if op.op in ("release", "preempt") and s.outcome.status == "ok" and rid in before.requests:
            refs = {oid: before.objects[oid].ref_count for oid in before.requests[rid].objects}
            for oid in reversed(before.requests[rid].objects):
                refs[oid] -= 1
                cached = before.objects[oid].key is not None
                state = "sealed" if refs[oid] else ("cached" if cached else "free")
                self._event(out, "ref_count_changed", s.step, block_id=oid, delta=-1, ref_count=refs[oid], state=state)
        for e in s.events:
            if e.kind == "reclaim":
                self._evicted(out, s.step, before, e, "reset" if op.op == "reset_cache" else "reclaim")
        return out

    def _evicted(self, out: list[dict[str, Any]], step: int, before: Observation, e: Event, reason: str) -> None:
        was = before.objects.get(e.oid)
        key = e.key if e.key is not None else (was.key if was is not None else None)
        self._event(
            out,
            "block_evicted",
            step,
            block_id=e.oid,
            block_hash=_hash_json(key),
            ref_count=0,
            hit_count=was.hits if was is not None else None,
            state="evicted",
            reason=reason,
        )

    def _grown(self, out: list[dict[str, Any]], s: RecordedStep, before: Observation, after: Observation) -> None:
        """Blocks the request got new in this step (allocated), and blocks that became full (sealed)."""
        assert s.op.req is not None
        req = after.requests[s.op.req]
        old = before.requests.get(s.op.req)
        kept = (
            len(old.objects)
            if s.op.op == "append" and old is not None
            else (s.outcome.hit_tokens or 0) // self.config.block_size
        )
        for oid in req.objects[kept:]:
            self._event(out, "block_allocated", s.step, block_id=oid, ref_count=1, hit_count=0, state="allocated")
        for i, oid in enumerate(req.objects):
            obj = after.objects[oid]
            was = before.objects.get(oid) if i < kept else None
            if obj.key is not None and (was is None or was.key is None):
                self._event(
                    out,
                    "block_sealed",
                    s.step,
                    block_id=oid,
                    block_hash=_hash_json(obj.key),
                    prefix_depth=i + 1,
                    ref_count=obj.ref_count,
                    hit_count=0,
                    state="sealed",
                )


def write_side_table(path: Path, adapter: Adapter, config: Config, recorded: Sequence[RecordedStep]) -> None:
    """Write ``recorded`` as a side-table log (block-granularity adapters only)."""
    deriver = SideTableDeriver(adapter, config)
    lines = [deriver.header()]
    for s in recorded:
        lines += deriver.step(s)
    write_jsonl(path, lines)
