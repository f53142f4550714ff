"""The Hypothesis state machine that drives any adapter through the spec operations.

Each rule is one request-level operation; the harness checks every invariant after
every step, so the machine itself holds no assertions. Which requests are running
or preempted is read from the adapter's own observation, never guessed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar, cast

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from kvspec.adapter import Adapter
from kvspec.spec import Config, Observation, Op
from kvspec.spec.ops import OpKind, bad_input_kinds

from .harness import Harness, Tally
from .strategies import (
    ALPHABET,
    DEFAULT_RANGES,
    PoolRanges,
    cold_prompt,
    configs,
    families,
    family_prompt,
    fork_prompt,
    long_prompt,
    pick,
    tokens,
)


def max_prompt_tokens(config: Config, granularity: str) -> int:
    """The longest prompt that fits in an empty pool."""
    if granularity == "entry":
        return config.capacity // config.bytes_per_token
    return config.capacity * config.block_size


class KVLifecycle(RuleBasedStateMachine):
    """The operations of the lifecycle as rules; one example is one fresh pool driven by them.

    :func:`build_machine` binds it to one adapter: a subclass whose ``start`` builds the
    example's :class:`Harness` on a pool drawn from the adapter's capabilities.
    """

    ops: ClassVar[frozenset[OpKind]]
    declines: ClassVar[frozenset[str]]
    bad_kinds: ClassVar[tuple[str, ...]]
    harness: Harness
    max_tokens: int  # the longest prompt an empty pool holds (longer is bad input)
    long_tokens: int  # the long prompts' bound: that over the adapter's pool_scale

    def __init__(self) -> None:
        super().__init__()
        self.next_id = 0
        self.history: list[tuple[int, ...]] = []
        self.templates: list[tuple[int, ...]] = []

    def _requests(self, state: str) -> list[str]:
        return sorted(r.req for r in self.harness.obs.requests.values() if r.state == state)

    def _step(self, op: Op) -> None:
        self.harness.step(op)

    def teardown(self) -> None:
        """The end of the example: the whole state judged when steps came as deltas (Harness.finish)."""
        harness = getattr(self, "harness", None)
        if harness is not None:
            harness.finish()
        super().teardown()

    def _admit(self, prompt: tuple[int, ...], contract: str = "") -> None:
        prompt = prompt[: self.max_tokens]
        req = f"r{self.next_id}"
        self.next_id += 1
        self.history.append(prompt)
        self._step(Op("admit", req, prompt, contract=contract))

    @rule(data=st.data())
    def admit_family(self, data: st.DataObject) -> None:
        self._admit(family_prompt(data, self.templates, self.harness.config))

    @precondition(lambda self: bool(self.history))
    @rule(data=st.data())
    def admit_fork(self, data: st.DataObject) -> None:
        self._admit(fork_prompt(data, self.history, self.harness.config))

    @precondition(lambda self: bool(self.history))
    @rule(data=st.data())
    def admit_repeat(self, data: st.DataObject) -> None:
        """The same prompt again (a retry, a popular question): whole-prompt sharing and the hit cap."""
        self._admit(self.history[pick(data, self.history, "conversation")])

    @rule(data=st.data())
    def admit_cold(self, data: st.DataObject) -> None:
        self._admit(cold_prompt(data, self.next_id, self.harness.config))

    @rule(data=st.data())
    def admit_long(self, data: st.DataObject) -> None:
        self._admit(long_prompt(data, self.templates, self.long_tokens))

    @precondition(
        lambda self: "append" in self.ops and any(r.state == "running" for r in self.harness.obs.requests.values())
    )
    @rule(data=st.data())
    def decode(self, data: st.DataObject) -> None:
        running = self._requests("running")
        self._append(running[pick(data, running, "req")], (data.draw(ALPHABET, label="token"),))

    @precondition(
        lambda self: "append" in self.ops and any(r.state == "running" for r in self.harness.obs.requests.values())
    )
    @rule(data=st.data())
    def append_chunk(self, data: st.DataObject) -> None:
        running = self._requests("running")
        new = data.draw(tokens(1, 2 * self.harness.config.block_size), label="tokens")
        self._append(running[pick(data, running, "req")], new)

    def _append(self, req: str, new: tuple[int, ...], contract: str = "") -> None:
        self._step(Op("append", req, new, contract=contract))
        request = self.harness.obs.requests.get(req)
        if request is not None:
            self.history.append(request.tokens)

    @precondition(lambda self: "release" in self.ops and bool(self.harness.obs.requests))
    @rule()
    def finish_oldest(self) -> None:
        """The longest-lived request completes and its prefix stays cached: churn, as in a server."""
        oldest = min(self.harness.obs.requests, key=lambda r: int(r[1:]) if r[1:].isdigit() else -1)
        self._step(Op("release", oldest))

    @precondition(lambda self: "release" in self.ops and bool(self.harness.obs.requests))
    @rule(data=st.data(), keep=st.booleans())
    def release(self, data: st.DataObject, keep: bool) -> None:
        live = sorted(self.harness.obs.requests)
        self._step(Op("release", live[pick(data, live, "req")], keep=keep or "release_drop" in self.declines))

    @precondition(
        lambda self: "preempt" in self.ops and any(r.state == "running" for r in self.harness.obs.requests.values())
    )
    @rule(data=st.data())
    def preempt(self, data: st.DataObject) -> None:
        running = self._requests("running")
        self._step(Op("preempt", running[pick(data, running, "req")]))

    @precondition(
        lambda self: "resume" in self.ops and any(r.state == "preempted" for r in self.harness.obs.requests.values())
    )
    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        waiting = self._requests("preempted")
        self._step(Op("resume", waiting[pick(data, waiting, "req")]))

    @precondition(lambda self: "reset_cache" in self.ops and bool(self.harness.obs.objects))
    @rule()
    def reset_cache(self) -> None:
        self._step(Op("reset_cache"))

    @rule(data=st.data())
    def bad_input(self, data: st.DataObject) -> None:
        """Input the spec defines as an error, of every class it defines: each must be rejected and change nothing.

        The class is drawn from a fixed list (the adapter's applicable classes), so that shrinking away
        earlier steps never turns one class into another; when the state cannot give that class (no
        preempted request to append to, say), an op on an unknown request stands in. The harness counts
        the class each op really is (``spec.validate``), and bad_input_rejected holds only once every
        class was tried.
        """
        kind = self.bad_kinds[pick(data, self.bad_kinds, "bad_input")]
        self._step(self._bad_op(kind, data) or self._unknown_request())

    def _bad_op(self, kind: str, data: st.DataObject) -> Op | None:
        """An op of bad-input class ``kind`` in the current state, or None when the state has none."""
        return bad_op(
            kind, self.harness.obs, self.ops, self.next_id, self.max_tokens, lambda reqs: reqs[pick(data, reqs, "req")]
        )

    def _unknown_request(self, req: str = "ghost") -> Op:
        """An op on a request that is not live, of the first kind the adapter implements."""
        return unknown_request(self.ops, self.next_id, req)


def bad_op(
    kind: str,
    obs: Observation,
    ops: frozenset[OpKind],
    next_id: int,
    max_tokens: int,
    one: Callable[[list[str]], str],
) -> Op | None:
    """An op of bad-input class ``kind`` in the pool ``obs`` shows, or None when that state has none.

    ``next_id``: the number of the next request id (``r{next_id}`` is not live); ``max_tokens``: the
    longest prompt an empty pool holds; ``one(reqs)`` picks one of a non-empty list of request ids
    (the machine draws it, the swarm walker takes it from its own random stream). Shared by both, so
    that the bad input they give is the same set of classes built the same way.
    """
    new, too_long = f"r{next_id}", (0,) * (max_tokens + 1)
    live = sorted(obs.requests)
    running = sorted(r.req for r in obs.requests.values() if r.state == "running")
    waiting = sorted(r.req for r in obs.requests.values() if r.state == "preempted")
    if kind == "no_request_id":
        return Op("admit", "", (1,))
    if kind == "empty_prompt":
        return Op("admit", new, ())
    if kind == "negative_token":
        return Op("admit", new, (1, -1))
    if kind == "prompt_larger_than_pool":
        return Op("admit", new, too_long)
    if kind == "unknown_op":
        return Op(cast(OpKind, "defragment"), one(live) if live else "ghost")
    if kind == "unknown_request":
        gone = [f"r{i}" for i in range(next_id) if f"r{i}" not in obs.requests]
        return unknown_request(ops, next_id, one(gone) if gone else "ghost")
    pick_from = {
        "admit_existing": live,
        "append_not_running": waiting,
        "preempt_not_running": waiting,
    }.get(kind, running)
    if not pick_from:
        return None
    req = one(pick_from)
    return {
        "admit_existing": Op("admit", req, (1,)),
        "append_not_running": Op("append", req, (1,)),
        "append_nothing": Op("append", req, ()),
        "append_larger_than_pool": Op("append", req, too_long),
        "preempt_not_running": Op("preempt", req),
        "preempt_bad_mode": Op("preempt", req, mode="swap"),
        "resume_not_preempted": Op("resume", req),
    }[kind]


def unknown_request(ops: frozenset[OpKind], next_id: int, req: str = "ghost") -> Op:
    """An op on a request that is not live, of the first kind among ``ops`` that names one."""
    kind = next((k for k in ("release", "append", "preempt", "resume") if k in ops), None)
    if kind is None:  # admit only: an empty prompt is bad input every adapter can be given
        return Op("admit", f"r{next_id}", ())
    return Op(cast(OpKind, kind), req, (1,) if kind == "append" else ())


class KVLifecycleWithContracts(KVLifecycle):
    """The machine of an adapter that declares misuse contracts (``Capabilities.contracts``): one rule more.

    A subclass, so that the machine of an adapter without contracts draws exactly as before.
    """

    contracts: ClassVar[tuple[str, ...]]

    def _contract_choices(self) -> list[str]:
        """The declared contracts whose op the pool can take now (a request in the state it needs)."""
        return ready_contracts(self.contracts, self.harness.obs)

    @precondition(lambda self: bool(self._contract_choices()))
    @rule(data=st.data())
    def misuse_contract(self, data: st.DataObject) -> None:
        """A declared contract: its op, driven through the implementation's misuse path; judged as the plain op."""
        choices = self._contract_choices()
        kind, _, name = choices[pick(data, choices, "contract")].partition(":")
        if kind == "admit":
            self._admit(family_prompt(data, self.templates, self.harness.config), contract=name)
        elif kind == "append":
            running = self._requests("running")
            new = data.draw(tokens(1, 2 * self.harness.config.block_size), label="tokens")
            self._append(running[pick(data, running, "req")], new, contract=name)
        elif kind == "reset_cache":
            self._step(Op("reset_cache", contract=name))
        else:
            state = {"preempt": "running", "resume": "preempted"}.get(kind)
            reqs = self._requests(state) if state else sorted(self.harness.obs.requests)
            self._step(Op(cast(OpKind, kind), reqs[pick(data, reqs, "req")], contract=name))


def ready_contracts(contracts: Sequence[str], obs: Observation) -> list[str]:
    """Of the declared ``contracts`` (``OP:NAME``), those whose op the pool ``obs`` shows can take now."""
    states = {r.state for r in obs.requests.values()}
    need = {"append": "running", "preempt": "running", "resume": "preempted"}
    ready = {"release": bool(states), "reset_cache": bool(obs.objects)}
    return [
        c
        for c in contracts
        if ready.get(c.partition(":")[0], need.get(c.partition(":")[0], "running") in states or c.startswith("admit:"))
    ]


def build_machine(
    adapter: Adapter,
    tally: Tally,
    ranges: PoolRanges = DEFAULT_RANGES,
    *,
    refine: bool = True,
) -> type[KVLifecycle]:
    """The machine bound to one adapter instance, reset at the start of each example."""
    caps = adapter.capabilities
    granularity = caps.semantics.granularity

    class Bound(KVLifecycleWithContracts if caps.contracts else KVLifecycle):  # type: ignore[misc]
        ops = caps.ops
        declines = caps.declines
        bad_kinds = bad_input_kinds(caps.ops, granularity)
        contracts = tuple(sorted(caps.contracts))

        @initialize(config=configs(caps.semantics, ranges, caps.fixed_config, caps.pool_scale), data=st.data())
        def start(self, config: Config, data: st.DataObject) -> None:
            self.harness = Harness(adapter, config, tally, refine=refine)
            self.templates = data.draw(families(config.block_size), label="templates")
            self.max_tokens = max_prompt_tokens(config, granularity)
            self.long_tokens = max(1, self.max_tokens // caps.pool_scale)

    Bound.__name__ = f"KVLifecycle[{adapter.name}]"
    return Bound
