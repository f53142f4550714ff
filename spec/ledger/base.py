"""The protocol every ledger keeps, and what all of them share: requests, the clock, what left the cache.

Keys in the spec are the token content itself (a block's whole prefix, a
record's or entry's prompt): exact, collision-free, and independent of any
implementation's hash function. A block's key is a chained ``BlockKey`` (its
parent's key and its own tokens) that equals its prefix without holding it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self, cast

import msgspec

from ..block_key import BlockKey, Prefix
from ..observation import ObjectView, Observation, RequestState, RequestView
from ..ops import OP_KINDS, Config, Granularity, Op, Outcome, Semantics, SpecError, size_of

Content = tuple[int, ...]


def validate(op: Op, obs: Observation, config: Config, semantics: Semantics) -> None:
    """Raise SpecError when ``op`` is bad input in state ``obs``; return when it is valid.

    Valid operations may still be refused for lack of capacity; bad input never is
    "refused": it is an error, and it changes nothing. The checks run in one fixed order: the op's
    kind, its request id, then the op's own checks (:data:`_CHECKS`).
    """
    if op.op not in OP_KINDS:
        raise SpecError(f"unknown op {op.op!r}", "unknown_op")
    if op.op == "reset_cache":
        return
    if op.req is None or not op.req:
        raise SpecError(f"{op.op} needs a request id", "no_request_id")
    request = obs.requests.get(op.req)
    if op.op == "admit":
        _check_admit(op, request, config, semantics)
        return
    if request is None:
        raise SpecError(f"unknown or already released request {op.req!r}", "unknown_request")
    _CHECKS[op.op](op, request, obs, config, semantics)


def _check_tokens(op: Op) -> None:
    if any(t < 0 for t in op.tokens):
        raise SpecError("token ids must be non-negative", "negative_token")


def _check_admit(op: Op, request: RequestView | None, config: Config, semantics: Semantics) -> None:
    if request is not None:
        raise SpecError(f"request {op.req!r} already exists", "admit_existing")
    if not op.tokens:
        raise SpecError("empty prompt", "empty_prompt")
    _check_tokens(op)
    if size_of(len(op.tokens), config, semantics.granularity) > config.capacity:
        raise SpecError("prompt is larger than the whole cache capacity", "prompt_larger_than_pool")


def _check_release(op: Op, request: RequestView, obs: Observation, config: Config, semantics: Semantics) -> None:
    """Any live request may be released."""


def _check_append(op: Op, request: RequestView, obs: Observation, config: Config, semantics: Semantics) -> None:
    if request.state != "running":
        raise SpecError(f"append to request {op.req!r} that is not running", "append_not_running")
    if not op.tokens:
        raise SpecError("append needs a positive number of tokens", "append_nothing")
    _check_tokens(op)
    held = len(request.tokens)
    record = obs.objects.get(request.objects[0]) if request.objects else None
    if semantics.granularity == "record" and record is not None:
        held = record.tokens
    if size_of(held + len(op.tokens), config, semantics.granularity) > config.capacity:
        raise SpecError("request would be larger than the whole cache capacity", "append_larger_than_pool")


def _check_preempt(op: Op, request: RequestView, obs: Observation, config: Config, semantics: Semantics) -> None:
    if request.state != "running":
        raise SpecError(f"preempt of request {op.req!r} that is not running", "preempt_not_running")
    if op.mode != "recompute":
        raise SpecError(f"unsupported preempt mode {op.mode!r}", "preempt_bad_mode")


def _check_resume(op: Op, request: RequestView, obs: Observation, config: Config, semantics: Semantics) -> None:
    if request.state != "preempted":
        raise SpecError(f"resume of request {op.req!r} that is not preempted", "resume_not_preempted")


_CHECKS = {"release": _check_release, "append": _check_append, "preempt": _check_preempt, "resume": _check_resume}
"""The checks of an op on an existing request, by kind (admit's own come first in :func:`validate`)."""


@dataclass
class CacheObject:
    """One cache object: a block's slot, a record or an entry."""

    key: Prefix | None = None
    tokens: int = 0
    size: int = 1
    ref_count: int = 0
    hits: int = 0
    last_used: int = 0
    priority: float = 0.0  # entry granularity: the retention score as of the last access
    share_degree: int = 0  # block granularity: peak ref_count since the block left the free queue


@dataclass
class Request:
    """A live request: its tokens and the objects it references, in order (block ids or record keys)."""

    tokens: Content
    prompt_len: int
    objects: list[object] = field(default_factory=list)
    state: RequestState = "running"
    cache_limit: int | None = None  # the admission gate: full blocks from this position on stay uncached
    block_keys: list[BlockKey] = field(default_factory=list)  # block granularity: the keys of its full blocks


class Step(msgspec.Struct, frozen=True):
    """The spec's verdict on one operation: outcome, left-cache contents, free capacity after (a msgspec Struct:
    built on every checked step, in C)."""

    outcome: Outcome
    evicted: tuple[Prefix, ...]
    reclaimed: tuple[Prefix, ...]
    free: int
    # Block granularity: the slot each evicted / reclaimed key left (with duplicate keys, not always index[key]).
    evicted_slots: tuple[int, ...] = ()
    reclaimed_slots: tuple[int, ...] = ()
    # Block granularity: the keys of the blocks that hold a key no lookup finds (duplicate_keys="newest").
    lost: tuple[Prefix, ...] = ()


Operation = Callable[[Op], Outcome]


class LedgerModel:
    """The reference semantics of the KV lifecycle, one object per cache object.

    ``LedgerModel(config, semantics)`` is the ledger of ``semantics.granularity``:
    a BlockLedger, RecordLedger or EntryLedger. Every one keeps this protocol:
    ``step`` validates first and leaves the objects and requests of a refused or
    invalid op as they were; ``observe`` shows the ledger as adapters show
    theirs; ``free`` is the capacity no object holds. ``step`` keeps every
    safety invariant of spec.invariants by construction; tests/ check that it
    does, and the stateful suite holds implementations to it.
    """

    granularity: ClassVar[Granularity]
    _by_granularity: ClassVar[dict[Granularity, type[LedgerModel]]] = {}

    def __init_subclass__(cls, granularity: Granularity | None = None, **kwargs: Any) -> None:
        """``class BlockLedger(LedgerModel, granularity="block")``: the ledger LedgerModel builds for it."""
        super().__init_subclass__(**kwargs)
        if granularity is not None:
            cls.granularity = granularity
            LedgerModel._by_granularity[granularity] = cls

    def __new__(cls, config: Config, semantics: Semantics) -> Self:
        ledger = LedgerModel._by_granularity[semantics.granularity] if cls is LedgerModel else cls
        return cast(Self, super().__new__(ledger))

    def __init__(self, config: Config, semantics: Semantics) -> None:
        if semantics.granularity != self.granularity:
            raise ValueError(f"{type(self).__name__} keeps {self.granularity} granularity, not {semantics.granularity}")
        self.config = config
        self.semantics = semantics
        self.clock = 0
        self.requests: dict[str, Request] = {}
        # What left the cache during the current step, in order.
        self._evicted: list[Prefix] = []
        self._reclaimed: list[Prefix] = []
        self._evicted_slots: list[int] = []
        self._reclaimed_slots: list[int] = []

    # -- what each granularity defines ----------------------------------------------
    @property
    def free(self) -> int:
        """Capacity that no object holds."""
        raise NotImplementedError

    def _objects(self) -> dict[object, ObjectView]:
        """Every object that holds capacity, by its oid."""
        raise NotImplementedError

    def lost(self) -> tuple[Prefix, ...]:
        """The keys of the objects that hold a key the index does not find (none, unless a granularity has them)."""
        return ()

    def _index(self) -> dict[Hashable, tuple[object, ...]]:
        """The cache index: each cached key and the objects found under it, first hit first."""
        raise NotImplementedError

    def _operations(self) -> Mapping[str, Operation]:
        """The ops this granularity defines; each gets a valid op and checks capacity before it changes anything."""
        raise NotImplementedError

    def _validation_view(self, op: Op) -> Observation:
        """What ``validate`` reads of the ledger for ``op``: its request, and the objects (the whole
        observation; a granularity may give less, as long as ``validate`` answers the same)."""
        return self.observe()

    def adopt(
        self, obs: Observation, content: Callable[[Hashable], Prefix | None], released: Mapping[Hashable, int]
    ) -> None:
        """Take an implementation's observed state as this ledger's (block granularity: BlockLedger.adopt)."""
        raise NotImplementedError(f"the {self.granularity} ledger cannot adopt an observed state")

    # -- the protocol ---------------------------------------------------------------
    def observe(self) -> Observation:
        """The spec's own ledger, in the shape adapters report."""
        requests = {
            rid: RequestView(rid, r.tokens, r.prompt_len, tuple(r.objects), r.state) for rid, r in self.requests.items()
        }
        return Observation(self.config.capacity, self.free, self._objects(), requests, self._index())

    def step(self, op: Op) -> Step:
        """Apply ``op``; a refused or invalid op leaves the ledger exactly as it was.

        Bad input, and an op this granularity does not define, are ``invalid``
        before anything is read or the clock moves.
        """
        self._evicted, self._reclaimed = [], []
        self._evicted_slots, self._reclaimed_slots = [], []
        try:
            validate(op, self._validation_view(op), self.config, self.semantics)
        except SpecError as exc:
            return Step(Outcome.invalid(str(exc)), (), (), self.free, lost=self.lost())
        operation = self._operations().get(op.op)
        if operation is None:
            undefined = Outcome.invalid(f"{op.op} is not defined at {self.granularity} granularity")
            return Step(undefined, (), (), self.free, lost=self.lost())
        self.clock += 1
        outcome = operation(op)
        return Step(
            outcome,
            tuple(self._evicted),
            tuple(self._reclaimed),
            self.free,
            tuple(self._evicted_slots),
            tuple(self._reclaimed_slots),
            self.lost(),
        )
