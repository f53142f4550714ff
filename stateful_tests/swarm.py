"""The swarm explorer (``kvspec check --engine swarm``): seeded random walks, no Hypothesis generation per step.

Swarm testing (Groce, Zhang, Eide, Chen and Regehr, "Swarm testing", ISSTA 2012): each
walk draws a subset of the moves (op kinds) and of the prompt shapes and uses only
those, so that one walk leans hard on a few features (admits and preemptions with no
release to relieve the pool, say) instead of every walk averaging over all of them.
The moves and shapes are the Hypothesis machine's rules (machine.py), the bad input the
same classes built by the same function (``machine.bad_op``). A walk is a plain
``random.Random`` stream seeded by the run's seed and the walk's number, so the same
seed gives the same walks, op for op, and each walk's pool is drawn from the profile's
ranges as the machine draws it.

Every step goes through the same :class:`~.harness.Harness` (the spec's prediction, the
adapter in its child process, every invariant). A failure is handled as the Hypothesis
engine handles its shrunk one (the findings pipeline, findings.py): replayed on a fresh
adapter, minimised by replay (``findings.minimize_ops``: ops dropped one at a time
while the same invariant still breaks), saved as a case; with an example database it is
also kept there (``kept_cases``), and the Hypothesis engine replays it before anything
else. The result is the engine's :class:`~.findings.Result`: the same report, the
same exit codes.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from kvspec.adapter import Adapter, AdapterFactory, Capabilities
from kvspec.case import Case
from kvspec.spec import Config, Observation, Op
from kvspec.spec.ops import OpKind, bad_input_kinds

from .case_db import keep_case
from .example_db import ExampleDbError, ExampleDbLocation, open_example_db
from .findings import Result, Search, run_search
from .harness import Harness, Tally, Violation
from .machine import bad_op, max_prompt_tokens, ready_contracts, unknown_request
from .options import Options, Profile
from .strategies import COLD_BASE

MOVES: tuple[str, ...] = (
    "admit",
    "decode",
    "append_chunk",
    "finish_oldest",
    "release",
    "preempt",
    "resume",
    "reset_cache",
    "bad_input",
    "misuse_contract",
)
"""The op kinds a walk may use: the machine's rules, the five admit rules as one move with a prompt shape."""

SHAPES: tuple[str, ...] = ("family", "fork", "repeat", "cold", "long")
"""The prompt shapes of an admit (strategies.py): template + tail, a fork of an earlier conversation, the
same prompt again, a prompt sharing nothing, a prompt of half the pool or more."""

_NEEDS: dict[str, str] = {
    "decode": "append",
    "append_chunk": "append",
    "finish_oldest": "release",
    "release": "release",
    "preempt": "preempt",
    "resume": "resume",
    "reset_cache": "reset_cache",
}


@dataclass(frozen=True)
class Swarm:
    """What one walk may use: its moves (``admit`` always) and its prompt shapes (at least one)."""

    moves: tuple[str, ...]
    shapes: tuple[str, ...]

    def to_json(self) -> dict[str, list[str]]:
        return {"moves": list(self.moves), "shapes": list(self.shapes)}


def draw_swarm(rng: random.Random, caps: Capabilities) -> Swarm:
    """Each move the adapter can take kept with probability 1/2 (admit always), each shape likewise (one at least)."""
    possible = [m for m in MOVES if _NEEDS.get(m, "admit") in caps.ops and (m != "misuse_contract" or caps.contracts)]
    moves = tuple(m for m in possible if m == "admit" or rng.random() < 0.5)
    shapes = tuple(s for s in SHAPES if rng.random() < 0.5) or (rng.choice(SHAPES),)
    return Swarm(moves, shapes)


def draw_config(rng: random.Random, caps: Capabilities, profile: Profile) -> Config:
    """A pool from the profile's ranges, as ``strategies.configs`` draws it (the adapter's fixed pool if it has one)."""
    if caps.fixed_config is not None:
        return caps.fixed_config
    ranges = profile.ranges
    if caps.semantics.granularity == "entry":
        return Config(
            capacity=rng.randint(*ranges.entry_capacity),
            block_size=1,
            bytes_per_token=rng.choice(ranges.bytes_per_token),
        )
    low, high = ranges.capacity
    return Config(
        capacity=rng.randint(low * caps.pool_scale, high * caps.pool_scale), block_size=rng.choice(ranges.block_sizes)
    )


class Walker:
    """One walk: a fresh pool, the swarm it may use, and the ops applied so far (``harness.ops``).

    Keeps what the machine keeps (the next request id, the prompts seen, the templates) and
    enables a move only where the machine's precondition would (a request in the state the op needs).
    """

    def __init__(
        self, adapter: Adapter, caps: Capabilities, tally: Tally, profile: Profile, rng: random.Random, refine: bool
    ) -> None:
        self.caps, self.rng = caps, rng
        self.swarm = draw_swarm(rng, caps)
        config = draw_config(rng, caps, profile)
        self.harness = Harness(adapter, config, tally, refine=refine)
        bs = config.block_size
        self.templates = [self._tokens(1, 3 * bs + 1) for _ in range(rng.randint(1, 3))]
        self.max_tokens = max_prompt_tokens(config, caps.semantics.granularity)
        self.long_tokens = max(1, self.max_tokens // caps.pool_scale)
        self.bad_kinds = bad_input_kinds(caps.ops, caps.semantics.granularity)
        self.contracts = tuple(sorted(caps.contracts))
        self.next_id = 0
        self.history: list[tuple[int, ...]] = []
        self.appended: str | None = None  # the request the last op appended to, if it was an append

    def walk(self, steps: int) -> None:
        """``steps`` ops, each a move drawn from those enabled; raises Violation (or AdapterHung) when one breaks.

        Each step hands the harness the choice of the next op (``Harness.step``'s ``then``), so that an adapter
        in a child process can run it while the step is judged; the choice reads the state the step left.
        """
        op = self._next(self.harness.obs)
        for number in range(steps):
            self.harness.step(op, self._next if number + 1 < steps else None)
            op = self.harness.upcoming  # type: ignore[assignment]  # set by ``then`` on every step but the last
        self.harness.finish()

    def _next(self, obs: Observation) -> Op:
        """The next op, from ``obs``, the state the last step left: what that step taught the walk first (an
        append's request tokens join the prompts seen), then a move drawn from those enabled, then its op."""
        if self.appended is not None:
            request = obs.requests.get(self.appended)
            if request is not None:
                self.history.append(request.tokens)
            self.appended = None
        return self._op(self.rng.choice(self._enabled_moves(obs)), obs)

    def _enabled_moves(self, obs: Observation) -> list[str]:
        """The walk's moves whose precondition holds in ``obs``, in the swarm's order (one pass over the requests)."""
        states = {r.state for r in obs.requests.values()}
        running, preempted = "running" in states, "preempted" in states
        enabled = []
        for move in self.swarm.moves:
            if move in ("decode", "append_chunk", "preempt"):
                ok = running
            elif move == "resume":
                ok = preempted
            elif move in ("finish_oldest", "release"):
                ok = bool(states)
            elif move == "reset_cache":
                ok = bool(obs.objects)
            elif move == "misuse_contract":
                ok = bool(ready_contracts(self.contracts, obs))
            else:
                ok = True
            if ok:
                enabled.append(move)
        return enabled

    @staticmethod
    def _requests(obs: Observation, state: str) -> list[str]:
        return sorted(r.req for r in obs.requests.values() if r.state == state)

    def _one(self, items: Sequence[str]) -> str:
        return items[self.rng.randrange(len(items))]

    def _tokens(self, low: int, high: int) -> tuple[int, ...]:
        """A token run over the machine's small shared alphabet (0..3), so that prefixes collide."""
        return tuple(self.rng.randint(0, 3) for _ in range(self.rng.randint(low, max(low, high))))

    def _prompt(self) -> tuple[int, ...]:
        """A prompt of one of the walk's shapes (a family one where the shape needs history there is none of)."""
        rng, bs = self.rng, self.harness.config.block_size
        shape = rng.choice(self.swarm.shapes)
        if shape in ("fork", "repeat") and not self.history:
            shape = "family"
        if shape == "fork":
            past = self.history[rng.randrange(len(self.history))]
            return past[: rng.randint(1, len(past))] + self._tokens(0, bs)
        if shape == "repeat":
            return self.history[rng.randrange(len(self.history))]
        if shape == "cold":
            base = COLD_BASE + self.next_id * 64
            return tuple(range(base, base + rng.randint(1, 2 * bs + 1)))
        template = self.templates[rng.randrange(len(self.templates))]
        if shape == "long":
            n = rng.randint(max(1, self.long_tokens // 2), max(1, self.long_tokens))
            return (template + self._tokens(n, n))[:n]
        return template + self._tokens(0, bs + 1)

    def _admit(self, prompt: tuple[int, ...], contract: str = "") -> Op:
        prompt = prompt[: self.max_tokens]
        req = f"r{self.next_id}"
        self.next_id += 1
        self.history.append(prompt)
        return Op("admit", req, prompt, contract=contract)

    def _append(self, req: str, new: tuple[int, ...], contract: str = "") -> Op:
        self.appended = req  # its tokens after the step join the prompts seen (``_next``)
        return Op("append", req, new, contract=contract)

    def _op(self, move: str, obs: Observation) -> Op:
        """The op of ``move`` in state ``obs`` (its precondition holds there)."""
        bs = self.harness.config.block_size
        if move == "admit":
            return self._admit(self._prompt())
        if move == "decode":
            return self._append(self._one(self._requests(obs, "running")), (self.rng.randint(0, 3),))
        if move == "append_chunk":
            return self._append(self._one(self._requests(obs, "running")), self._tokens(1, 2 * bs))
        if move == "finish_oldest":
            return Op("release", min(obs.requests, key=lambda r: int(r[1:]) if r[1:].isdigit() else -1))
        if move == "release":
            keep = self.rng.random() < 0.5 or "release_drop" in self.caps.declines
            return Op("release", self._one(sorted(obs.requests)), keep=keep)
        if move == "preempt":
            return Op("preempt", self._one(self._requests(obs, "running")))
        if move == "resume":
            return Op("resume", self._one(self._requests(obs, "preempted")))
        if move == "reset_cache":
            return Op("reset_cache")
        if move == "bad_input":
            kind = self._one(self.bad_kinds)
            op = bad_op(kind, obs, self.caps.ops, self.next_id, self.max_tokens, self._one)
            return op or unknown_request(self.caps.ops, self.next_id)
        return self._contract(self._one(ready_contracts(self.contracts, obs)), obs)

    def _contract(self, contract: str, obs: Observation) -> Op:
        """A declared misuse contract's op, as the machine's misuse_contract rule builds it."""
        kind, _, name = contract.partition(":")
        if kind == "admit":
            return self._admit(self._prompt(), contract=name)
        if kind == "append":
            bs = self.harness.config.block_size
            return self._append(self._one(self._requests(obs, "running")), self._tokens(1, 2 * bs), contract=name)
        if kind == "reset_cache":
            return Op("reset_cache", contract=name)
        state = {"preempt": "running", "resume": "preempted"}.get(kind)
        reqs = self._requests(obs, state) if state else sorted(obs.requests)
        return Op(cast(OpKind, kind), self._one(reqs), contract=name)


def walk_seed(seed: int, number: int) -> str:
    """The seed of walk ``number`` of a run seeded with ``seed`` (``random.Random`` hashes a str seed: stable)."""
    return f"kvspec-swarm:{seed}:{number}"


def run_swarm(
    factory: AdapterFactory,
    name: str,
    options: Options,
    *,
    adapter: Adapter | None = None,
    extra_cases: Sequence[Case] = (),
    progress: Callable[[Tally], None] | None = None,
    states: set[Hashable] | None = None,
) -> Result:
    """Check one adapter with ``options.max_examples`` (default: the profile's) swarm walks of the profile's
    ``step_count`` ops.

    The arguments mean what they mean to ``hypothesis_engine.run_check``. ``options.seed`` None: 0 under a
    derandomized profile (ci), a drawn one otherwise; the report names it and ``--seed`` replays the run.
    ``options.example_db``: each case a failure leaves is kept there (``case_db``) for the Hypothesis engine to
    replay first. ``states``: a set that collects the distinct abstract states reached (``harness.abstract_state``).
    """
    seed = options.seed
    if seed is None:
        seed = 0 if options.profile.derandomize else random.SystemRandom().getrandbits(32)
    walks = Walks(options.max_examples or options.profile.max_examples, seed, states, options, name)

    def explore(search: Search) -> None:
        search.result.given_cases = len(extra_cases)
        if not search.replay(extra_cases):
            walks.run(search, progress)

    return run_search(
        factory, name, options, explore, engine="swarm", seed=seed, adapter=adapter, states=states, finish=walks.finish
    )


@dataclass
class Walks:
    """A run's walks: how many, from which seed; how many were done and the swarm of the first that failed."""

    total: int
    seed: int
    states: set[Hashable] | None
    options: Options
    name: str
    done: int = 0
    failing: Swarm | None = None

    def run(self, search: Search, progress: Callable[[Tally], None] | None) -> None:
        """Walk until the last walk, the time budget, or a failure that ends the search."""
        caps, tally, deadline = search.adapter.capabilities, search.tally, search.tally.deadline
        for number in range(self.total):
            if deadline is not None and time.monotonic() >= deadline:
                search.result.budget_spent = True
                return
            walker: Walker | None = None
            try:
                rng = random.Random(walk_seed(self.seed, number))
                walker = Walker(search.adapter, caps, tally, search.profile, rng, search.options.refine)
                broken = len(tally.past)
                walker.walk(search.profile.step_count)
                if len(tally.past) > broken:  # keep-going: this walk broke an invariant and stepped past it
                    self.failing = self.failing or walker.swarm
            except Violation as violation:
                self.failing = self.failing or (walker.swarm if walker is not None else None)
                if search.failed(violation):
                    return
            finally:
                self.done += 1
                if walker is not None:
                    search.quality.merge(walker.harness.memory.quality)
                if progress is not None:
                    progress(tally)

    def finish(self, result: Result) -> None:
        """The swarm's section of the report, and every saved case kept in the example database."""
        result.sections = {
            "swarm": {
                "walks": self.done,
                "steps_per_walk": self.options.profile.step_count,
                "failing_swarm": None if self.failing is None else self.failing.to_json(),
                "abstract_states": None if self.states is None else len(self.states),
            }
        }
        _keep(result, self.options.example_db, self.name)


def _keep(result: Result, example_db: ExampleDbLocation | None, name: str) -> None:
    """Keep every case the run saved in the adapter's example database, for the Hypothesis engine to replay first."""
    if example_db is None or not result.cases:
        return
    try:
        database = open_example_db(example_db, name)
    except ExampleDbError as exc:
        result.findings.append({"kind": "example_db", "message": f"no case kept: {exc}"})
        return
    assert database is not None
    for path in result.cases:
        try:
            keep_case(database, Case.load(Path(path)))
        except (OSError, ValueError) as exc:
            result.findings.append({"kind": "example_db", "message": f"case {path} not kept: {exc}"})


__all__ = ["MOVES", "SHAPES", "Swarm", "Walker", "Walks", "draw_config", "draw_swarm", "run_swarm", "walk_seed"]
