"""Exhaustive explicit-state search of the block spec: every reachable state of ``LedgerModel.step``.

Breadth-first from the empty pool, under the op alphabet of the bounded Z3 model
(``spec.formal.symbolic.Bounds``; ``Encoding.op_domain``): for each request ``r0..r{R-1}``,
an admit of every token string of 1..N*B tokens over ``0..A-1``, an append of every
string of 1..``max_append`` tokens, release (keep and not), preempt, resume; and
reset_cache. Each transition is checked with every invariant that applies (as ``check_transition``)
and every successor is reduced to a canonical state; a state seen before is not
expanded again. Layer k holds the states first reached by k operations, so the first
violation found is a shortest one.

What a state is: what ``SymState`` holds and the step reads: per slot its ref count,
key (the token prefix), whether the index finds it (``lost``), tokens held and
free-queue position; per request its state, tokens and block table. Not part of
it: the clock, ``last_used``, ``hits``, ``share_degree`` and ``prompt_len``, which no
step of ``Semantics(eviction="lru")`` and no safety invariant reads (the Z3
encoding leaves the same out; ``hits`` only grows).

Symmetry reduction: two states that differ only by a renaming of request ids, of
block ids, or of token strings are one state. A token-string renaming is an
automorphism of the trie of all strings: at every prefix, a permutation of the next
token's values (each prefix its own). The spec cannot tell such states apart: it reads
token strings only through equality of prefixes (a block's key is its whole prefix),
ids for equality only, and the LRU queue orders blocks by position, not id. A state's
canonical form is the least, over every order of the live requests, of its
description with blocks renumbered in the order they are met (free queue first, then
each request's table) and its strings as the canonical form of their trie.

Op-orbit reduction: of the ops from a state, one of each orbit under the renamings
that fix the state is expanded (``Alphabet.orbit_ops``): a string that leaves the
state's trie is taken with the least absent token and zeros after it, and only the
first absent request is admitted. If g fixes state s, the step from s by g(op) reaches
g(step(s, op)), whose canonical form is that of step(s, op), and breaks the same
invariants; docs/formal.md has the argument.

Bad input changes nothing, and ``validate`` reads no token of an op it rejects (the
request's state and the op's length only): an op that is bad input in a state is
tried with one token string per length, not all of them. The transitions of a
variant of the spec (``model=``) are enumerated the same way.

Invariants that read history (the policy checks read ``KeyMemory``'s free order) are
judged with a memory of the one transition; the safety invariants read one
transition and are judged exactly.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from kvspec import stop

from ..invariants import INVARIANTS, Invariant, KeyMemory, Transition
from ..ledger import BlockLedger, LedgerModel, Step
from ..ledger.base import Request
from ..ops import Config, Event, Op, Semantics
from .symbolic import SEMANTICS, Bounds

State = tuple[object, ...]
"""A state's description: hashable, comparable (canonical forms are compared as tuples)."""

ModelFactory = Callable[[Bounds], BlockLedger]


def spec_model(bounds: Bounds, semantics: Semantics = SEMANTICS) -> BlockLedger:
    """The spec's own block ledger on the bounded pool."""
    model = LedgerModel(bounds.config, semantics)
    assert isinstance(model, BlockLedger)
    return model


def clone(model: BlockLedger) -> BlockLedger:
    """An independent copy of ``model`` (its own slots, queue, index and requests); keeps its class."""
    new = object.__new__(type(model))
    new.__dict__.update(model.__dict__)
    new.slots = [replace(s) for s in model.slots]
    new.free_queue = OrderedDict(model.free_queue)
    new.index = dict(model.index)
    new.duplicates = {k: list(v) for k, v in model.duplicates.items()}
    new.requests = {
        rid: replace(r, objects=list(r.objects), block_keys=list(r.block_keys)) for rid, r in model.requests.items()
    }
    return new


def _strings(alphabet: int, lengths: range) -> list[tuple[int, ...]]:
    return [s for n in lengths for s in itertools.product(range(alphabet), repeat=n)]


@dataclass(frozen=True)
class Alphabet:
    """The operations of the bounded model, by request and kind."""

    bounds: Bounds
    prompts: tuple[tuple[int, ...], ...]
    appends: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, bounds: Bounds) -> Alphabet:
        b = bounds
        appends = range(1, min(b.append_tokens, b.max_tokens) + 1)
        return cls(b, tuple(_strings(b.alphabet, range(1, b.max_tokens + 1))), tuple(_strings(b.alphabet, appends)))

    def ops(self, model: BlockLedger) -> Iterator[Op]:
        """Every op of the alphabet from ``model``'s state; bad input with one token string per length."""
        b = self.bounds
        for i in range(b.requests):
            rid = b.req_id(i)
            req = model.requests.get(rid)
            state = None if req is None else req.state
            prompts = self.prompts if state is None else _one_per_length(self.prompts)
            yield from (Op("admit", rid, p) for p in prompts)
            appends = self.appends if state == "running" else _one_per_length(self.appends)
            yield from (Op("append", rid, a) for a in appends)
            yield from _lifecycle_ops(rid)
        yield Op("reset_cache")

    def orbit_ops(self, model: BlockLedger) -> Iterator[Op]:
        """One op of each orbit of :meth:`ops` under the renamings that fix ``model``'s state.

        Token strings: one per orbit of the trie automorphisms that fix every string the state
        holds (:func:`orbit_strings`). Requests: of the absent ones, only the first is admitted
        (swapping two absent requests fixes the state). An op and its image under a renaming
        that fixes the state lead to states with one canonical form and break the same
        invariants, so expanding one of them is enough.
        """
        b = self.bounds
        nodes = trie_nodes(model)
        admitted = False
        for i in range(b.requests):
            rid = b.req_id(i)
            req = model.requests.get(rid)
            if req is None:
                if not admitted:
                    admitted = True
                    prompts = orbit_strings(nodes, (), range(1, b.max_tokens + 1), b.alphabet)
                    yield from (Op("admit", rid, p) for p in prompts)
            else:
                yield from (Op("admit", rid, p) for p in _one_per_length(self.prompts))
            if req is not None and req.state == "running":
                lengths = range(1, len(self.appends[-1]) + 1)
                appends = orbit_strings(nodes, tuple(req.tokens), lengths, b.alphabet)
            else:
                appends = _one_per_length(self.appends)
            yield from (Op("append", rid, a) for a in appends)
            yield from _lifecycle_ops(rid)
        yield Op("reset_cache")

    def size(self) -> int:
        """Ops per state when nothing is bad input (the alphabet the BMC quantifies over)."""
        return self.bounds.requests * (len(self.prompts) + len(self.appends) + 4) + 1


def _lifecycle_ops(rid: str) -> tuple[Op, ...]:
    """The ops of request ``rid`` that carry no token string: both releases, preempt, resume."""
    return (Op("release", rid, keep=True), Op("release", rid, keep=False), Op("preempt", rid), Op("resume", rid))


def _one_per_length(strings: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
    return [s for s in strings if not any(s)]


def describe(model: BlockLedger, bounds: Bounds) -> State:
    """The state as the step reads it, ids and tokens as they are (no reduction)."""
    queue = {sid: i for i, sid in enumerate(model.free_queue)}
    slots = tuple(
        (
            s.ref_count,
            None if s.key is None else tuple(s.key),
            s.key is not None and model.index.get(s.key) != sid,  # type: ignore[arg-type]
            s.tokens,
            queue.get(sid, -1),
        )
        for sid, s in enumerate(model.slots)
    )
    requests = tuple(_request(model.requests.get(bounds.req_id(i))) for i in range(bounds.requests))
    return (slots, requests)


def _request(r: Request | None) -> object:
    return None if r is None else (r.state, r.tokens, tuple(r.objects))


def canonical(model: BlockLedger, bounds: Bounds) -> State:
    """The least description of ``model``'s state over every renaming of requests, blocks and token strings.

    Token strings are renamed by automorphisms of the trie of all strings (a permutation of the
    next token's values at every prefix, each prefix its own): the spec reads token strings only
    through equality of prefixes, so such a renaming is invisible to it. Blocks are numbered in
    the order they are met (free queue first, then each request's table); the token content is
    the trie of every key and request string, each node carrying the blocks whose key ends there
    and the requests whose tokens end there, in the trie's canonical form (children sorted by
    their own canonical forms: a complete invariant of a rooted tree up to isomorphism).
    """
    reqs = [model.requests.get(bounds.req_id(i)) for i in range(bounds.requests)]
    live = [r for r in reqs if r is not None]
    slots = model.slots
    queue = list(model.free_queue)
    index = model.index
    keys = [None if s.key is None else tuple(s.key) for s in slots]
    fields = [
        (s.ref_count, s.key is not None, s.key is not None and index.get(s.key) != sid, s.tokens)  # type: ignore[arg-type]
        for sid, s in enumerate(slots)
    ]
    best: State | None = None
    for order in itertools.permutations(live):
        label: dict[int, int] = {}
        for sid in queue:
            label.setdefault(sid, len(label))
        for r in order:
            for held in r.objects:
                assert isinstance(held, int)
                label.setdefault(held, len(label))
        # A slot neither free nor held (none in the spec; a leak in a variant): by its fields.
        for sid in sorted((sid for sid in range(len(slots)) if sid not in label), key=fields.__getitem__):
            label[sid] = len(label)
        by_label = sorted(label, key=label.__getitem__)
        marks: dict[tuple[int, ...], list[tuple[int, int]]] = {}
        for sid, key in enumerate(keys):
            if key is not None:
                marks.setdefault(key, []).append((0, label[sid]))
        for i, r in enumerate(order):
            marks.setdefault(tuple(r.tokens), []).append((1, i))
        described = (
            len(queue),
            tuple(fields[sid] for sid in by_label),
            tuple((r.state, len(r.tokens), tuple(label[o] for o in r.objects)) for r in order),  # type: ignore[index]
            len(reqs) - len(live),
            trie_form(marks),
        )
        if best is None or described < best:
            best = described
    assert best is not None
    return best


def trie_form(marks: dict[tuple[int, ...], list[tuple[int, int]]]) -> State:
    """The canonical form of the trie of ``marks``' strings, each node with its sorted marks.

    Two mark maps have the same form exactly when a trie automorphism (a permutation of
    the children of every node) maps one onto the other.
    """
    children: dict[tuple[int, ...], set[int]] = {(): set()}
    for string in marks:
        for n in range(len(string)):
            children.setdefault(string[:n], set()).add(string[n])
            children.setdefault(string[: n + 1], set())

    def form(node: tuple[int, ...]) -> State:
        below = sorted(form((*node, t)) for t in children[node])
        return (tuple(sorted(marks.get(node, ()))), tuple(below))

    return form(())


def trie_nodes(model: BlockLedger) -> set[tuple[int, ...]]:
    """Every prefix of every token string ``model``'s state holds (block keys and request tokens)."""
    strings = [tuple(s.key) for s in model.slots if s.key is not None]
    strings += [tuple(r.tokens) for r in model.requests.values()]
    return {string[:n] for string in strings for n in range(len(string) + 1)}


def orbit_strings(
    nodes: set[tuple[int, ...]], start: tuple[int, ...], lengths: range, alphabet: int
) -> list[tuple[int, ...]]:
    """One string of each orbit, under the trie automorphisms that fix ``nodes``, of the strings of
    ``lengths`` tokens appended to ``start`` (a node).

    Such an automorphism may permute the children of a node that are not in ``nodes``, and
    anything below them: a string that leaves ``nodes`` at node u by token t is mapped to the
    one that leaves by the least token absent under u and goes on with zeros.
    """
    out: list[tuple[int, ...]] = []

    def walk(node: tuple[int, ...]) -> None:
        took = len(node) - len(start)
        if took in lengths:
            out.append(node[len(start) :])
        if took >= lengths.stop - 1:
            return
        absent = [t for t in range(alphabet) if (*node, t) not in nodes]
        for t in range(alphabet):
            if (*node, t) in nodes:
                walk((*node, t))
        if absent:
            fresh = (*node, absent[0])
            for n in range(took + 1, lengths.stop):
                if n in lengths:
                    out.append(fresh[len(start) :] + (0,) * (n - took - 1))

    walk(start)
    return out


@dataclass(frozen=True)
class Found:
    """A shortest op sequence from the empty pool whose last step breaks ``invariants``."""

    ops: list[Op]
    invariants: list[str]
    problems: dict[str, list[str]]


@dataclass
class ExploreResult:
    """What the search covered: transitions (``states``), distinct states, depth, time, and a violation if any.

    ``complete``: no new state at the last depth: every reachable state of the bounded model was
    visited. ``checked``: the transitions each invariant was judged on (it applied to them).
    ``layers[k]``: the distinct states first reached by k operations (layer 0: the empty pool).
    """

    bounds: Bounds
    requested: int
    depth: int = 0
    complete: bool = False
    states: int = 0
    layers: list[int] = field(default_factory=lambda: [1])
    seconds: float = 0.0
    timed_out: bool = False
    interrupted: bool = False  # a stop was asked for (kvspec.stop): ``depth`` is the last depth completed
    semantics: Semantics = SEMANTICS
    reduced: bool = True
    checked: dict[str, int] = field(default_factory=dict)
    counterexample: Found | None = None
    tree: dict[State, tuple[State | None, Op | None]] = field(default_factory=dict, repr=False)

    @property
    def distinct(self) -> int:
        return sum(self.layers)

    @property
    def diameter(self) -> int:
        """The most ops any state found needs from the empty pool (the last depth with a new state)."""
        return max(k for k, n in enumerate(self.layers) if n)

    @property
    def states_per_s(self) -> float:
        return self.states / self.seconds if self.seconds > 0 else 0.0

    def path(self, state: State) -> list[Op]:
        """The ops that first reached ``state`` (a key of ``tree``)."""
        ops: list[Op] = []
        node: State | None = state
        while node is not None:
            parent, op = self.tree[node]
            if op is not None:
                ops.append(op)
            node = parent
        return ops[::-1]

    def leaves(self) -> list[State]:
        """The states no other state was first reached from: replaying the path to each visits every state."""
        parents = {parent for parent, _ in self.tree.values()}
        return [s for s in self.tree if s not in parents]


def explore(
    bounds: Bounds,
    depth: int,
    *,
    model: ModelFactory | None = None,
    semantics: Semantics = SEMANTICS,
    time_limit: float | None = None,
    reduce: bool = True,
    orbits: bool = True,
    progress: Callable[[int, int, float], None] | None = None,
) -> ExploreResult:
    """Breadth-first search of every state the spec (or ``model``'s variant) reaches within ``depth`` ops.

    Stops at the first depth whose transitions break an invariant (the counterexample is
    a shortest one), when a depth adds no new state (``complete``), at ``depth``, or at
    ``time_limit`` seconds (``timed_out``; the depth reached is the last completed one).
    ``reduce=False`` turns symmetry reduction off (ids and tokens as they are); ``orbits=False``
    keeps it but expands every op, not one per orbit (:meth:`Alphabet.orbit_ops`). ``semantics``: the spec's
    (block granularity, LRU; ``duplicate_keys`` may be any), unless ``model`` builds a variant of it.
    """
    root = model(bounds) if model is not None else spec_model(bounds, semantics)
    alphabet = Alphabet.of(bounds)
    key = canonical if reduce else describe
    ops = alphabet.orbit_ops if reduce and orbits else alphabet.ops
    t0 = time.monotonic()
    deadline = None if time_limit is None else t0 + time_limit
    result = ExploreResult(bounds, depth, semantics=root.semantics, reduced=reduce)
    start = key(root, bounds)
    result.tree[start] = (None, None)
    frontier: deque[tuple[State, BlockLedger]] = deque([(start, root)])
    config, semantics = root.config, root.semantics
    judged = [inv for inv in INVARIANTS if inv.applies(semantics)]
    result.checked = dict.fromkeys((inv.name for inv in judged), 0)
    try:
        _search(result, frontier, config, judged, ops, key, deadline, progress, t0)
    except KeyboardInterrupt:  # out of a step of the search, or at a state's start: the depths completed stand
        stop.clear()
        result.interrupted, result.layers = True, result.layers[: result.depth + 1]
    result.seconds = time.monotonic() - t0
    return result


def _search(
    result: ExploreResult,
    frontier: deque[tuple[State, BlockLedger]],
    config: Config,
    judged: Sequence[Invariant],
    ops: Callable[[BlockLedger], Iterable[Op]],
    key: Callable[[BlockLedger, Bounds], State],
    deadline: float | None,
    progress: Callable[[int, int, float], None] | None,
    t0: float,
) -> None:
    """The breadth-first layers into ``result``, as :func:`explore` says; a stop asked for raises KeyboardInterrupt."""
    bounds, semantics = result.bounds, result.semantics
    for k in range(1, result.requested + 1):
        following: deque[tuple[State, BlockLedger]] = deque()
        fresh = 0
        while frontier:
            if deadline is not None and time.monotonic() > deadline:
                result.timed_out, result.layers = True, result.layers[:k]
                return
            stop.check()  # a signal whose KeyboardInterrupt was swallowed (kvspec.stop)
            here, parent = frontier.popleft()
            before, unchanged = parent.observe(), describe(parent, bounds)
            work = clone(parent)
            for op in ops(parent):
                step = work.step(op)
                after = work.observe()
                result.states += 1
                memory = KeyMemory.of_state(before)
                t = Transition(before, op, step.outcome, _events(step), after, config, semantics, memory)
                broken = {}
                for inv in judged:
                    problems = inv.check(t)
                    if problems is not None:  # None: the invariant does not apply to this step
                        result.checked[inv.name] += 1
                        if problems:
                            broken[inv.name] = problems
                if broken and result.counterexample is None:
                    path = [*result.path(here), op]
                    result.counterexample = Found(path, list(broken), broken)
                if step.outcome.status != "ok" and describe(work, bounds) == unchanged:
                    continue  # nothing the step reads changed: the same model serves the next op
                there = key(work, bounds)
                if there not in result.tree:
                    result.tree[there] = (here, op)
                    following.append((there, work))
                    fresh += 1
                work = clone(parent)
        result.layers.append(fresh)
        result.depth = k
        if progress is not None:
            progress(k, fresh, time.monotonic() - t0)
        if result.counterexample is not None or not following:
            result.complete = result.counterexample is None
            return
        frontier = following


def _events(step: Step) -> tuple[Event, ...]:
    """The step's evict and reclaim events, as an adapter reports them: the slot and its key."""
    return (
        *(Event("evict", sid, key) for sid, key in zip(step.evicted_slots, step.evicted, strict=True)),
        *(Event("reclaim", sid, key) for sid, key in zip(step.reclaimed_slots, step.reclaimed, strict=True)),
    )


__all__ = ["Alphabet", "ExploreResult", "Found", "canonical", "clone", "describe", "explore", "spec_model"]
