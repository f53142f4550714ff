"""Workloads for the policy A/B: request streams that make eviction policies differ, saved as JSON.

A workload is a list of spec operations (admit, append of decoded tokens,
release), engine-neutral and deterministic from ``(name, seed, params)``: every
random choice comes from one ``random.Random(seed)``. The generators cover the
scenarios of the prefix-cache literature the kit's users bring up:

- ``ordinary_unique_cold``: unrelated requests; no two share a full block.
- ``template_family_revisit``: prompt families that share a template prefix of
  ``template_blocks`` full blocks, visited, pushed out by cold traffic, revisited once.
- ``template_family_revisit_cycles``: the same, revisited over several cycles.
- ``cache_pressure_ambiguous_hot_revisit``: a few hot prefixes used early, then a
  cold stream in which each cold prompt repeats once at once (so cold blocks carry
  hits too, like the hot ones), then the hot prefixes come back.
- ``long_conversation_<mode>``: multi-turn sessions whose next prompt is the whole
  history (prompts and decoded answers) plus a new message, with the modes
  ``continuous``, ``random_topic``, ``persona_rotation``, ``pressure`` and
  ``multi_turn_fork``.

Every workload keeps at most ``concurrency`` requests live at once (the oldest
is released first), so a pool of ``peak_live_blocks`` never has to refuse an
admission for lack of room: what differs between policies is what stays cached.
"""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvspec.spec import Op, SpecError
from kvspec.spec.ops import blocks_for

SCHEMA = 1
VOCAB = 32_000
"""Token ids are drawn from 1..VOCAB-1 (0 is never used, so a test can spot stray padding)."""


@dataclass(frozen=True)
class Workload:
    """A named, seeded op sequence. ``params`` are the generator's keyword arguments, defaults filled in."""

    name: str
    seed: int
    params: dict[str, Any]
    block_size: int
    ops: tuple[Op, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "kvspec_workload": SCHEMA,
            "name": self.name,
            "seed": self.seed,
            "params": self.params,
            "block_size": self.block_size,
            "ops": [op.to_json() for op in self.ops],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Workload:
        if data.get("kvspec_workload") != SCHEMA:
            raise SpecError(f"not a kvspec workload (schema {data.get('kvspec_workload')!r}, expected {SCHEMA})")
        return cls(
            name=str(data["name"]),
            seed=int(data["seed"]),
            params=dict(data.get("params", {})),
            block_size=int(data["block_size"]),
            ops=tuple(Op.from_json(op) for op in data["ops"]),
        )

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), separators=(",", ":")) + "\n")

    @classmethod
    def load(cls, path: Path) -> Workload:
        return cls.from_json(json.loads(path.read_text()))

    # -- shape ------------------------------------------------------------------------
    def prompts(self) -> list[tuple[str, tuple[int, ...]]]:
        """(request, prompt) of every admit, in order."""
        return [(op.req or "", op.tokens) for op in self.ops if op.op == "admit"]

    def peak_live_blocks(self) -> int:
        """Most blocks the live requests hold at once: the smallest pool that never has to refuse."""
        held: dict[str, int] = {}
        peak = 0
        for op in self.ops:
            req = op.req or ""
            if op.op == "admit":
                held[req] = len(op.tokens)
            elif op.op == "append":
                held[req] += len(op.tokens)
            elif op.op == "release":
                held.pop(req, None)
            peak = max(peak, sum(blocks_for(n, self.block_size) for n in held.values()))
        return peak

    def distinct_full_blocks(self) -> int:
        """Distinct full-block contents (prefixes of whole blocks) that any request ever holds."""
        bs = self.block_size
        tokens: dict[str, list[int]] = {}
        seen: set[tuple[int, ...]] = set()
        for op in self.ops:
            req = op.req or ""
            if op.op == "admit":
                tokens[req] = list(op.tokens)
            elif op.op == "append":
                tokens[req].extend(op.tokens)
            else:
                continue
            seq = tokens[req]
            seen.update(tuple(seq[: (i + 1) * bs]) for i in range(len(seq) // bs))
        return len(seen)

    def footprint(self) -> int:
        """Blocks a pool needs so that nothing is ever evicted: every distinct full block plus the live peak."""
        return self.distinct_full_blocks() + self.peak_live_blocks()


class Tokens:
    """Fresh token segments: a segment's first block never repeats an earlier segment's first block.

    That is what keeps "unique" parts unique: with chained block keys, two prompts
    share block i only if their first i+1 blocks are equal, so a unique first
    block of a segment makes every block from there on private.
    """

    def __init__(self, rng: random.Random, block_size: int) -> None:
        self.rng = rng
        self.block_size = block_size
        self._heads: set[tuple[int, ...]] = set()

    def fresh(self, n: int) -> tuple[int, ...]:
        while True:
            seg = tuple(self.rng.randrange(1, VOCAB) for _ in range(n))
            head = seg[: self.block_size]
            if head not in self._heads:
                self._heads.add(head)
                return seg

    def fresh_blocks(self, blocks: int) -> tuple[int, ...]:
        return self.fresh(blocks * self.block_size)


@dataclass
class Schedule:
    """Builds the op list; keeps at most ``concurrency`` requests live, releasing the oldest first."""

    concurrency: int
    ops: list[Op] = field(default_factory=list)
    live: deque[str] = field(default_factory=deque)
    count: int = 0

    def request(self, prompt: Sequence[int], output: Sequence[int] = (), name: str | None = None) -> str:
        """Admit a request with ``prompt``, decode ``output`` into it; returns its id."""
        req = name or f"r{self.count}"
        self.count += 1
        while len(self.live) >= self.concurrency:
            self.release(self.live[0])
        self.ops.append(Op("admit", req, tuple(prompt)))
        if output:
            self.ops.append(Op("append", req, tuple(output)))
        self.live.append(req)
        return req

    def release(self, req: str) -> None:
        if req in self.live:
            self.live.remove(req)
            self.ops.append(Op("release", req))

    def finish(self) -> tuple[Op, ...]:
        while self.live:
            self.release(self.live[0])
        return tuple(self.ops)


def _span(rng: random.Random, bounds: Sequence[int]) -> int:
    lo, hi = bounds
    return rng.randint(lo, hi)


# -- the scenarios --------------------------------------------------------------------


def ordinary_unique_cold(
    rng: random.Random,
    *,
    block_size: int = 16,
    requests: int = 160,
    prompt_tokens: tuple[int, int] = (24, 120),
    output_tokens: tuple[int, int] = (4, 24),
    concurrency: int = 4,
) -> tuple[Op, ...]:
    """Unrelated requests: no two share a full block, so no policy can hit anything."""
    toks, sched = Tokens(rng, block_size), Schedule(concurrency)
    for _ in range(requests):
        sched.request(toks.fresh(_span(rng, prompt_tokens)), toks.fresh(_span(rng, output_tokens)))
    return sched.finish()


def _cold(toks: Tokens, rng: random.Random, sched: Schedule, n: int, prompt_tokens: Sequence[int]) -> None:
    for _ in range(n):
        sched.request(toks.fresh(_span(rng, prompt_tokens)), toks.fresh(rng.randint(2, 8)))


def _family_burst(
    toks: Tokens, rng: random.Random, sched: Schedule, template: tuple[int, ...], n: int, suffix: Sequence[int]
) -> None:
    for _ in range(n):
        sched.request(template + toks.fresh(_span(rng, suffix)), toks.fresh(rng.randint(2, 8)))


def template_family_revisit_cycles(
    rng: random.Random,
    *,
    block_size: int = 16,
    families: int = 4,
    template_blocks: int = 6,
    burst: int = 3,
    suffix_tokens: tuple[int, int] = (8, 40),
    cold_between: int = 24,
    cold_tokens: tuple[int, int] = (32, 96),
    cycles: int = 4,
    concurrency: int = 4,
) -> tuple[Op, ...]:
    """Families sharing a template of ``template_blocks`` full blocks, each visited in a burst per cycle.

    Between cycles ``cold_between`` unrelated requests push the templates towards
    eviction; a policy that keeps the shared templates hits them again next cycle.
    """
    toks, sched = Tokens(rng, block_size), Schedule(concurrency)
    templates = [toks.fresh_blocks(template_blocks) for _ in range(families)]
    for _ in range(cycles):
        order = list(range(families))
        rng.shuffle(order)
        for f in order:
            _family_burst(toks, rng, sched, templates[f], burst, suffix_tokens)
        _cold(toks, rng, sched, cold_between, cold_tokens)
    return sched.finish()


def cache_pressure_ambiguous_hot_revisit(
    rng: random.Random,
    *,
    block_size: int = 16,
    hot: int = 3,
    hot_blocks: int = 5,
    hot_uses: int = 3,
    cold_pairs: int = 40,
    cold_tokens: tuple[int, int] = (40, 96),
    revisit_every: int = 10,
    suffix_tokens: tuple[int, int] = (4, 20),
    concurrency: int = 3,
) -> tuple[Op, ...]:
    """Hot prefixes used ``hot_uses`` times, then a stream of cold prompts each repeated once at once.

    The repeat gives every cold block one hit, so "was hit" does not tell hot from
    cold; only how often and how long ago does. Every ``revisit_every`` cold pairs
    one hot prefix comes back, and all of them come back at the end.
    """
    toks, sched = Tokens(rng, block_size), Schedule(concurrency)
    prefixes = [toks.fresh_blocks(hot_blocks) for _ in range(hot)]

    def use(h: int) -> None:
        sched.request(prefixes[h] + toks.fresh(_span(rng, suffix_tokens)), toks.fresh(rng.randint(2, 8)))

    for _ in range(hot_uses):
        for h in range(hot):
            use(h)
    for i in range(cold_pairs):
        prompt = toks.fresh(_span(rng, cold_tokens))
        sched.request(prompt, toks.fresh(rng.randint(2, 8)))
        sched.request(prompt, toks.fresh(rng.randint(2, 8)))
        if revisit_every and (i + 1) % revisit_every == 0:
            use(rng.randrange(hot))
    for h in range(hot):
        use(h)
    return sched.finish()


CONVERSATION_MODES = ("continuous", "random_topic", "persona_rotation", "pressure", "multi_turn_fork")


def long_conversation(
    rng: random.Random,
    *,
    mode: str = "continuous",
    block_size: int = 16,
    sessions: int = 8,
    turns: int = 8,
    personas: int = 3,
    persona_blocks: int = 4,
    message_tokens: tuple[int, int] = (8, 40),
    answer_tokens: tuple[int, int] = (8, 48),
    max_context_tokens: int = 384,
    topic_switch: float = 0.25,
    rotate_every: int = 4,
    forks: int = 3,
    fork_turns: int = 3,
    concurrency: int = 4,
) -> tuple[Op, ...]:
    """Multi-turn sessions: each turn's prompt is the session's history plus a new message.

    Each session starts from one of ``personas`` shared system prompts
    (``persona_blocks`` full blocks). A history longer than ``max_context_tokens``
    restarts from the persona prompt. Modes:

    - ``continuous``: sessions take turns round-robin; histories only grow.
    - ``random_topic``: with probability ``topic_switch`` a turn starts a new topic
      (history back to the persona prompt).
    - ``persona_rotation``: every ``rotate_every`` turns a session moves to the next
      persona and starts over under it.
    - ``pressure``: three times the sessions at the same concurrency, turns drawn at
      random, so many long private histories compete for the pool.
    - ``multi_turn_fork``: each session runs ``turns // 2`` trunk turns, then ``forks``
      branches (regenerated answers) continue ``fork_turns`` turns each from the trunk.
    """
    if mode not in CONVERSATION_MODES:
        raise SpecError(f"unknown conversation mode {mode!r}; known: {', '.join(CONVERSATION_MODES)}")
    if mode == "pressure":
        sessions = 3 * sessions
    toks, sched = Tokens(rng, block_size), Schedule(concurrency)
    persona_prompts = [toks.fresh_blocks(persona_blocks) for _ in range(personas)]
    persona = [s % personas for s in range(sessions)]
    history: list[tuple[int, ...]] = [persona_prompts[p] for p in persona]
    turn_of = [0] * sessions

    def turn(s: int, base: tuple[int, ...]) -> tuple[int, ...]:
        """One turn on top of ``base``; returns the history after it (prompt + answer)."""
        prompt = base + toks.fresh(_span(rng, message_tokens))
        answer = toks.fresh(_span(rng, answer_tokens))
        if len(prompt) + len(answer) > max_context_tokens:
            prompt = persona_prompts[persona[s]] + toks.fresh(_span(rng, message_tokens))
        sched.request(prompt, answer, name=f"s{s}.t{turn_of[s]}")
        turn_of[s] += 1
        return prompt + answer

    if mode == "multi_turn_fork":
        for s in range(sessions):
            for _ in range(turns // 2):
                history[s] = turn(s, history[s])
        for s in rng.sample(range(sessions), sessions):
            trunk = history[s]
            for _ in range(forks):
                branch = trunk
                for _ in range(fork_turns):
                    branch = turn(s, branch)
        return sched.finish()

    steps = [s for _ in range(turns) for s in range(sessions)]
    if mode == "pressure":
        rng.shuffle(steps)
    for s in steps:
        if mode == "random_topic" and turn_of[s] and rng.random() < topic_switch:
            history[s] = persona_prompts[persona[s]]
        if mode == "persona_rotation" and turn_of[s] and turn_of[s] % rotate_every == 0:
            persona[s] = (persona[s] + 1) % personas
            history[s] = persona_prompts[persona[s]]
        history[s] = turn(s, history[s])
    return sched.finish()


Generator = Callable[..., tuple[Op, ...]]

GENERATORS: dict[str, tuple[Generator, dict[str, Any]]] = {
    "ordinary_unique_cold": (ordinary_unique_cold, {}),
    # One visit, one wave of cold traffic, one revisit: the two-cycle case.
    "template_family_revisit": (template_family_revisit_cycles, {"cycles": 2}),
    "template_family_revisit_cycles": (template_family_revisit_cycles, {}),
    "cache_pressure_ambiguous_hot_revisit": (cache_pressure_ambiguous_hot_revisit, {}),
    **{f"long_conversation_{mode}": (long_conversation, {"mode": mode}) for mode in CONVERSATION_MODES},
}
"""Workload name -> (generator, the parameters that make it that scenario)."""


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def generate(name: str, seed: int = 0, **params: Any) -> Workload:
    """The workload ``name`` drawn from ``random.Random(seed)``; same (name, seed, params), same ops.

    ``params`` override the generator's defaults; the workload records all of them.
    """
    if name not in GENERATORS:
        raise SpecError(f"unknown workload {name!r}; known: {', '.join(GENERATORS)}")
    fn, fixed = GENERATORS[name]
    chosen = {**fixed, **params}
    if int(chosen.get("block_size", 1)) <= 0:
        raise SpecError("block_size must be positive")  # no block would ever fill: generation would not end
    ops = fn(random.Random(seed), **chosen)
    recorded = {k: _plain(v) for k, v in {**(fn.__kwdefaults__ or {}), **chosen}.items()}
    return Workload(name, seed, recorded, int(recorded["block_size"]), ops)


def generate_all(seed: int = 0, names: Iterable[str] | None = None, **params: Any) -> list[Workload]:
    """Every scenario (or ``names``), each with ``seed`` and the shared ``params`` (e.g. block_size)."""
    return [generate(name, seed, **params) for name in (names or GENERATORS)]
