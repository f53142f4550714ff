"""The event-stream ledger: what a black-box engine's published KV events and responses must satisfy.

A server seen from outside shows three things: a stream of batches of cache events (a block's
hash was stored, removed, or every block cleared), each request's ``cached_tokens``, and a few
gauges (usage, preemptions). None of them carries block ids or ref counts, so the ledger here is
the spec's cache index only: how many cached copies of each block hash exist, and which token
prefix each hash stands for (a block is identified by its whole token prefix, as in the spec's
:class:`~kvspec.spec.KeyMemory` at block granularity). The named checks:

- ``cached_within_pool``: cached copies never exceed the usable pool;
- ``removed_was_cached``: a removal names a hash that has a cached copy;
- ``stored_once``: a hash with a cached copy is stored again only as a block that an in-flight
  request recomputes (it did not hit it: past its cached tokens), never out of nowhere;
- ``hash_chain_agrees``: every published hash is the engine's hash of the tokens it claims (the
  parent's prefix plus the block's tokens), and one hash never stands for two prefixes;
- ``predicted_cached_tokens``: a request sent alone (exact mode) hits exactly the longest cached
  prefix of whole blocks at its admission, capped so one prompt token is computed;
- ``cached_tokens_within_bounds``: a concurrent request hits between the least and the most such
  prefix seen while it was in flight;
- ``in_flight_not_removed``: no block that a request still holds (its hits, if it was alone when
  it arrived, and the blocks it stored) loses its last cached copy while the request is running on
  the server and was not preempted. A request alone in its window is judged at the removal; one
  whose window overlaps others only once the stream proves it was still running after the removal
  (see :meth:`StreamLedger._check_holders`);
- ``idle_usage_zero``: the usage gauge reads 0 whenever nothing is in flight;
- ``event_sequence_contiguous``: batch sequence numbers run without gap or reordering.

The engine's hash function is not the spec's business: the caller passes ``published_hash``, the
engine's recipe as a :class:`HashChain` (a block's published hash from its parent's chain state and its
own tokens). Without it, ``hash_chain_agrees`` judges only that one hash never stands for two prefixes.

Memory follows the live index, not the stream: the ledger knows a hash's prefix as a node (its
parent's hash and its own tokens) while the hash, or a descendant of it, has a cached copy; a hash
whose last copy goes, with no cached descendant, is forgotten (its chain is then judged by
recomputation alone). Two things are kept for every hash ever stored, and only where they are needed:
the prefix each hash stood for when there is no recipe to recompute it (so ``hash_chain_agrees``
still says one hash never stands for two prefixes), and, while the stream was joined late
(``initial_known=False``) and no clear has been seen, the set of hashes seen stored.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, cast

Prefix = tuple[int, ...]
Node = tuple[Hashable | None, Prefix]  # a block as the index knows it: its parent's hash, its own tokens


class Entry:
    """What the index knows of one hash (an entry of ``StreamLedger.blocks``).

    ``copies``: its cached copies (>= 0); ``parent`` and ``tokens``: its node, its parent's hash and its own
    tokens (``tokens`` None while its prefix is not known, and then ``parent`` is None too); ``kids``: how many
    hashes with a known prefix name it as their parent; ``state``: the recipe's chain state of the hash (None
    when not known). Slots: a stored or removed block is one dict lookup and attribute reads.
    """

    __slots__ = ("copies", "kids", "parent", "state", "tokens")

    def __init__(self, copies: int, parent: Hashable | None, tokens: Prefix | None, kids: int, state: Any) -> None:
        self.copies, self.parent, self.tokens, self.kids, self.state = copies, parent, tokens, kids, state

    def __repr__(self) -> str:
        return f"Entry({self.copies}, {self.parent!r}, {self.tokens!r}, {self.kids}, {self.state!r})"


class _Ahead:
    """The recipe's (published hash, chain state) of an event's blocks, run on from one chain state.

    ``hashes[i - at]`` is block ``i``'s, valid while the state block ``i`` follows is ``base``."""

    __slots__ = ("at", "base", "chain", "hashes", "tokens")

    def __init__(self, chain: HashChain | None, base: Any, tokens: Sequence[Prefix]) -> None:
        self.chain, self.tokens, self.at, self.base = chain, tokens, 0, base
        self.hashes: Sequence[tuple[Hashable, Any]] = () if chain is None or base is None else chain.chain(base, tokens)

    def next(self, i: int, base: Any) -> tuple[Hashable, Any]:
        """Block ``i``'s published hash and the state after it, following ``base`` (rehashed from ``i`` on where
        the chain ahead ran on another state)."""
        if base is not self.base and base != self.base:
            self.hashes, self.at = self.chain.chain(base, self.tokens[i:]), i  # type: ignore[union-attr]
        expected, self.base = self.hashes[i - self.at]
        return expected, self.base


TALLIED: tuple[tuple[str, str], ...] = (
    ("seen", "stored"),
    ("checked", "hash_chain_agrees"),
    ("checked", "stored_once"),
    ("checked", "cached_within_pool"),
    ("seen", "removed"),
    ("checked", "removed_was_cached"),
)
"""The counts stores and removals add (StreamResult's counter, key), in the order of ``StreamLedger._tally``:
kept as plain integers while a batch is applied and added to the result once per batch."""


class HashChain(Protocol):
    """An engine's block hash recipe as a chain (vLLM: adapters/vllm_live/hashing.py:BlockHasher)."""

    def root(self) -> Any:
        """The chain state of the empty prefix (the first block's parent)."""

    def chain(self, parent: Any, blocks: Sequence[Prefix]) -> Sequence[tuple[Hashable, Any]]:
        """The published hash and state of each of ``blocks`` in turn: the first after ``parent``'s state, each
        next after the one before (one call per stored event)."""


PublishedHash = HashChain


class BatchEvent(Protocol):
    """A batch's event as a typed decoder gives it: vLLM's event fields, the event's type as ``kind``.

    ``kind`` is "BlockStored" (``block_hashes``, ``token_ids``, ``parent_block_hash``), "BlockRemoved"
    (``block_hashes``) or "AllBlocksCleared".
    """

    @property
    def kind(self) -> str: ...

    @property
    def block_hashes(self) -> Sequence[Hashable]: ...

    @property
    def token_ids(self) -> Sequence[int]: ...

    @property
    def parent_block_hash(self) -> Hashable | None: ...


STREAM_INVARIANTS: tuple[tuple[str, str], ...] = (
    ("cached_within_pool", "safety"),
    ("removed_was_cached", "safety"),
    ("stored_once", "safety"),
    ("hash_chain_agrees", "refinement"),
    ("predicted_cached_tokens", "refinement"),
    ("cached_tokens_within_bounds", "safety"),
    ("in_flight_not_removed", "safety"),
    ("idle_usage_zero", "safety"),
    ("event_sequence_contiguous", "safety"),
)
STREAM_INVARIANT_NAMES: tuple[str, ...] = tuple(name for name, _ in STREAM_INVARIANTS)
MAX_PROBLEMS = 20
MAX_PLACES = 10
"""How many places each violated invariant keeps (``StreamResult.places``): its first ones."""


@dataclass(frozen=True)
class RequestRecord:
    """One completed request as the client saw it. Times share the clock of the batches' ``ts``.

    exact: it was sent alone, after the events of every earlier request had arrived.
    preempted: False when it is known not to have been preempted, None when unknown.
    """

    id: str
    prompt: Prefix
    output: Prefix | None
    cached_tokens: int | None
    started: float
    finished: float
    exact: bool = False
    preempted: bool | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RequestRecord:
        output = data.get("output_token_ids")
        preempted = data.get("preempted")
        return cls(
            id=str(data["id"]),
            prompt=tuple(int(t) for t in data["prompt_token_ids"]),
            output=None if output is None else tuple(int(t) for t in output),
            cached_tokens=None if data.get("cached_tokens") is None else int(data["cached_tokens"]),
            started=float(data["started"]),
            finished=float(data["finished"]),
            exact=data.get("mode") == "exact",
            preempted=None if preempted is None else bool(preempted),
        )


@dataclass(frozen=True)
class MetricSnapshot:
    """The gauges read at ``ts``; ``idle``: no request was in flight then."""

    ts: float
    idle: bool
    usage: float | None = None
    preemptions: float | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MetricSnapshot:
        usage, preemptions = data.get("kv_cache_usage_perc"), data.get("num_preemptions_total")
        return cls(
            ts=float(data["ts"]),
            idle=bool(data.get("idle", False)),
            usage=None if usage is None else float(usage),
            preemptions=None if preemptions is None else float(preemptions),
        )


@dataclass
class InFlight:
    """A request between its start and finish: the blocks it holds and the hit bounds seen so far.

    ``suspect`` keeps, for a request that is not alone, each held block that lost its last cached copy
    while the request was in flight by the client's clock: the block's index in its chain and where it
    went. Each one is either proven (a failure) or dropped when the request finishes.
    """

    record: RequestRecord
    chain: dict[Prefix, int]  # the prefix of each of its blocks -> block index
    guarded: bool  # known not preempted: its blocks must keep a cached copy
    alone: bool = False  # no other request's window overlaps its own
    held: dict[Hashable, int] = field(default_factory=dict)  # hash -> its block index in ``chain``
    suspect: dict[Hashable, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    stored: Counter[Prefix] = field(default_factory=Counter)  # blocks it has been credited with storing
    least: int = 0
    most: int = 0
    scheduled: bool = False  # it stored a block no one else computes: its hit lookup is behind it
    known: bool = True  # the index was fully known when it arrived: its hit can be judged


@dataclass
class StreamResult:
    """What the stream checks judged (per invariant: checks made, first violation) and what was seen."""

    checked: Counter[str] = field(default_factory=Counter)
    first_violation: dict[str, dict[str, Any]] = field(default_factory=dict)
    violations: list[dict[str, Any]] = field(default_factory=list)
    seen: Counter[str] = field(default_factory=Counter)
    # Per invariant: the places that broke it (a batch, a request, a snapshot, a gap), each counted once however
    # many problems it had, and the first MAX_PLACES of them; ``kept``: how many places all of these lists hold.
    place_counts: Counter[str] = field(default_factory=Counter)
    places: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    kept: int = 0
    _last_place: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False, compare=False)

    def fail(self, name: str, where: Mapping[str, Any], problem: str) -> None:
        entry = {"invariant": name, **where, "problems": [problem]}
        if len(self.violations) < MAX_PROBLEMS:
            self.violations.append(entry)
        first = self.first_violation.setdefault(name, {**where, "problems": []})
        if len(first["problems"]) < 5 and first.get("batch") == where.get("batch"):
            first["problems"].append(problem)
        if self._last_place.get(name) != where:  # a place's problems come one after another
            place = self._last_place[name] = dict(where)
            self.place_counts[name] += 1
            kept = self.places.setdefault(name, [])
            if len(kept) < MAX_PLACES:
                kept.append(place)
                self.kept += 1

    @property
    def violated(self) -> list[str]:
        return [name for name in STREAM_INVARIANT_NAMES if name in self.first_violation]

    @property
    def held(self) -> bool:
        return not self.first_violation


class StreamLedger:
    """The cache index rebuilt from events; every event and request is checked as it is applied.

    ``usable_blocks``: the pool's capacity in blocks (None: unknown, ``cached_within_pool`` not judged).
    ``requests=False``: no request will start (a log without request records), so the ``child`` map, which
    only a request's prefix lookup reads, is not kept.
    The index is ``blocks``, one entry per hash (:class:`Entry`). Kept: a hash has an entry exactly
    while it has a cached copy or a known prefix (a node); ``total`` is the sum of the entries' copies; a hash
    has a node (and, with requests, a ``child`` entry) exactly while its prefix is known and it or a descendant
    with a node has a cached copy (its ``kids`` counts the hashes whose node names it as parent), or, once
    removed, while an in-flight request suspects its removal (its child's store is the proof); a chain state
    is kept only in an entry with a node.
    """

    short_way = True
    """Store a new hash after a parent the chain ahead ran on inline (:meth:`_store_known`); False: every block
    the general way (the same verdicts; benchmarks/stream_short_way.py measures what the short way saves)."""

    def __init__(
        self,
        block_size: int,
        usable_blocks: int | None = None,
        published_hash: HashChain | None = None,
        result: StreamResult | None = None,
        *,
        initial_known: bool = True,
        requests: bool = True,
    ) -> None:
        self.block_size = block_size
        # False: blocks may have been cached before the stream was joined; a removal of a hash never
        # seen stored is then not judged, until a clear makes the index known again.
        self.known = initial_known
        self.usable_blocks = usable_blocks
        self.published_hash = published_hash
        self.result = result or StreamResult()
        self.blocks: dict[Hashable, Entry] = {}
        self.total = 0
        # node -> hash, read only to look up a request's cached prefix: kept only when requests may come.
        self.child: dict[Node, Hashable] = {}
        self._by_node = requests
        # Without a recipe, the node each hash ever stood for (the only memory of a forgotten identity).
        self.identity: dict[Hashable, Node] | None = {} if published_hash is None else None
        self.ever: set[Hashable] | None = None if initial_known else set()
        self.in_flight: dict[str, InFlight] = {}
        self.last_seq: int | None = None
        self.where: dict[str, Any] = {}
        self._root = None if published_hash is None else published_hash.root()
        self._tally = [0] * len(TALLIED)  # the counts of the batch being applied (TALLIED), not yet in result
        self._tallied = [(getattr(self.result, counter), key) for counter, key in TALLIED]

    def _count_tally(self) -> None:
        """Add the batch's tallied counts to the result (a count of 0 adds no entry, as before)."""
        tally = self._tally
        for i, (counter, key) in enumerate(self._tallied):
            if tally[i]:
                counter[key] += tally[i]
                tally[i] = 0

    # -- the index ----------------------------------------------------------------

    def copies(self, key: Hashable) -> int:
        """The cached copies of ``key`` (0 for a hash the index has no copy of)."""
        entry = self.blocks.get(key)
        return 0 if entry is None else entry.copies

    def node(self, key: Hashable) -> Node | None:
        """The node ``key`` stands for (its parent's hash, its own tokens); None when its prefix is not known."""
        entry = self.blocks.get(key)
        return None if entry is None or entry.tokens is None else (entry.parent, entry.tokens)

    def _chain_keys(self, tokens: Sequence[int], limit: int) -> list[Hashable]:
        """The hashes of the leading whole blocks of ``tokens`` the index knows, up to ``limit`` blocks."""
        if not self._by_node:
            raise ValueError("this ledger was made with requests=False: it keeps no node -> hash map to look up")
        bs, keys = self.block_size, []
        parent: Hashable | None = None
        for n in range(limit):
            key = self.child.get((parent, tuple(tokens[n * bs : (n + 1) * bs])))
            if key is None:
                break
            keys.append(key)
            parent = key
        return keys

    def cached_prefix_blocks(self, tokens: Sequence[int]) -> int:
        """Leading whole blocks of ``tokens`` that have a cached copy, capped so one token is computed."""
        limit = (len(tokens) - 1) // self.block_size if tokens else 0
        n = 0
        for key in self._chain_keys(tokens, limit):
            if self.copies(key) <= 0:
                break
            n += 1
        return n

    def _prefix(self, key: Hashable | None) -> Prefix | None:
        """The whole token prefix ``key`` stands for (() for no parent); None when a link is not known."""
        parts: list[Prefix] = []
        blocks = self.blocks
        while key is not None:
            entry = blocks.get(key)
            if entry is None or entry.tokens is None:
                return None
            key = entry.parent
            parts.append(entry.tokens)
        return tuple(t for tokens in reversed(parts) for t in tokens)

    def _refresh_bounds(self) -> None:
        for flight in self.in_flight.values():
            if flight.scheduled:
                continue
            now = self.cached_prefix_blocks(flight.record.prompt)
            flight.least, flight.most = min(flight.least, now), max(flight.most, now)

    def _total(self) -> int:
        return self.total

    def _forget(self, key: Hashable, entry: Entry | None = None) -> None:
        """Drop ``key``'s entry once it has a node, no cached copy and no known descendant; then its parent's.

        ``entry``: ``key``'s entry where the caller holds it (else it is looked up)."""
        blocks, child_of = self.blocks, self.child
        if entry is None and key is not None:
            entry = blocks.get(key)
        while entry is not None and entry.tokens is not None and entry.copies <= 0 and entry.kids <= 0:
            del blocks[key]
            parent, tokens = entry.parent, entry.tokens
            if child_of and child_of.get((parent, tokens)) == key:
                del child_of[(parent, tokens)]
            if parent is None:
                return
            key, entry = parent, blocks.get(parent)  # a node's parent has a node (while it has kids)
            if entry is not None:
                entry.kids -= 1

    # -- batches and events ----------------------------------------------------------

    def apply_batch(self, index: int, seq: int | None, events: Iterable[Mapping[str, Any] | BatchEvent]) -> None:
        """Apply one published batch (record ``index``); its seq must follow the previous one.

        An event is a JSON object (``{"type": "BlockStored", ...}``) or an object of the same fields with
        its type as ``kind`` (:class:`BatchEvent`: what a typed decoder of the log gives).
        """
        r = self.result
        self.where = {"batch": index, "seq": seq}
        r.seen["batches"] += 1
        if seq is not None:
            if self.last_seq is not None:
                r.checked["event_sequence_contiguous"] += 1
                if seq != self.last_seq + 1:
                    r.fail(
                        "event_sequence_contiguous",
                        self.where,
                        f"batch seq {seq} follows seq {self.last_seq} (expected {self.last_seq + 1})",
                    )
            self.last_seq = seq if self.last_seq is None else max(seq, self.last_seq)
        seen = 0
        stored, removed, in_flight = self.stored, self.removed, self.in_flight
        for event in events:
            seen += 1
            kind = getattr(event, "kind", None)
            if kind is None:  # a JSON object
                data = cast(Mapping[str, Any], event)
                kind = data.get("type")
                if kind == "BlockStored":
                    stored(data.get("block_hashes", []), data.get("token_ids", []), data.get("parent_block_hash"))
                elif kind == "BlockRemoved":
                    removed(data.get("block_hashes", []))
                elif kind == "AllBlocksCleared":
                    self._cleared()
                else:
                    r.seen[f"unknown event {kind}"] += 1
            elif kind == "BlockRemoved":  # a BatchEvent (typing.cast, a Python call per event, left out)
                removed(event.block_hashes)  # type: ignore[union-attr]
            elif kind == "BlockStored":
                stored(event.block_hashes, event.token_ids, event.parent_block_hash)  # type: ignore[union-attr]
            elif kind == "AllBlocksCleared":
                self._cleared()
            else:
                r.seen[f"unknown event {kind}"] += 1
            if in_flight:
                self._refresh_bounds()
        r.seen["events"] += seen
        self._count_tally()

    def stored(self, keys: Sequence[Hashable], tokens: Sequence[int], parent: Hashable | None) -> None:
        """A BlockStored: one cached copy more of each of ``keys``, the chain of blocks after ``parent``.

        Each block is checked in turn (``hash_chain_agrees``, ``stored_once``, ``cached_within_pool``, in
        that order); the counts of checks made are tallied once per event and added to the result once per
        batch (:data:`TALLIED`). The prefix is known when the parent is the root or a hash the index knows
        (:meth:`_store_known`); else the blocks are counted, not judged (:meth:`_store_unknown`).
        """
        count = len(keys)
        tally = self._tally
        tally[0] += count
        up = None if parent is None else self.blocks.get(parent)  # the parent's entry
        known = parent is None or (up is not None and up.tokens is not None)
        if len(tokens) != count * self.block_size:
            self._tokens_mismatch(count, len(tokens))
            known = False
        if not count:
            self.result.seen["stored"] += 0  # every BlockStored makes the entry, an empty one too
            return
        if known:
            recomputed, unjudged = self._store_known(keys, tokens, parent, up), 0
        else:
            recomputed, unjudged = 0, self._store_unknown(keys)
        tally[1] += recomputed
        tally[2] += count - unjudged
        if self.usable_blocks is not None:
            tally[3] += count

    def _tokens_mismatch(self, count: int, n_tokens: int) -> None:
        r = self.result
        r.checked["hash_chain_agrees"] += 1
        detail = f"BlockStored of {count} blocks carries {n_tokens} tokens (block size {self.block_size})"
        r.fail("hash_chain_agrees", self.where, detail)

    def _store_unknown(self, keys: Sequence[Hashable]) -> int:
        """Blocks stored after a parent whose prefix is not known: copies counted, no node; how many were already
        cached (a cached hash stored with an unknown prefix: who recomputes it cannot be told)."""
        blocks, usable, total = self.blocks, self.usable_blocks, self.total
        unjudged = 0
        for key in keys:
            entry = blocks.get(key)
            if entry is None:
                blocks[key] = Entry(1, None, None, 0, None)
            else:
                unjudged += entry.copies > 0
                entry.copies += 1
            total += 1
            if usable is not None and total > usable:
                self._over_pool(total, key)
        self.total = total
        return unjudged

    def _store_known(
        self, keys: Sequence[Hashable], tokens: Sequence[int], parent: Hashable | None, up: Entry | None
    ) -> int:
        """Blocks stored after a known prefix, each checked and learnt in turn; how many hashes were recomputed.

        The recipe hashes the event's blocks in one call (:class:`_Ahead`), ahead of the checks. The common
        case, a new hash after a parent whose state that chain ran on, with no request in flight and no per-hash
        memory to keep, is the short way inline below (the same checks in the same order as
        :meth:`_store_block`; docs/benchmarks/stream-short-way.md measures what it saves). A block costs one lookup
        in the index: each block's entry is the next block's parent entry.
        """
        bs, count = self.block_size, len(keys)
        if type(tokens) is not tuple:
            tokens = tuple(tokens)
        # one block: its tokens are the event's (a whole-tuple slice is the tuple itself)
        own_tokens = [tokens] if count == 1 else [tokens[start : start + bs] for start in range(0, count * bs, bs)]
        chain = self.published_hash
        base = (None if chain is None else self._root) if up is None else up.state  # the state ``parent`` leaves
        ahead = _Ahead(chain, base, own_tokens)
        fast = self.short_way and not self.in_flight and self.identity is None and self.ever is None
        blocks, child_of, by_node, usable = self.blocks, self.child, self._by_node, self.usable_blocks
        total, recomputed = self.total, 0
        for i, key in enumerate(keys):
            entry = blocks.get(key)
            own = own_tokens[i]
            if entry is None and fast and base is ahead.base and base is not None:
                expected, base = ahead.hashes[i - ahead.at]
                ahead.base = base
                recomputed += 1
                if expected != key:
                    self._chain_broken(key, own, parent, expected)
                entry = blocks[key] = Entry(1, parent, own, 0, base)
                if by_node and (parent, own) not in child_of:
                    child_of[(parent, own)] = key
                if up is not None:
                    up.kids += 1
            else:
                entry, base, again = self._store_block(i, key, entry, own, parent, up, base, ahead)
                recomputed += again
            total += 1
            if usable is not None and total > usable:
                self._over_pool(total, key)
            parent, up = key, entry
        self.total = total
        return recomputed

    def _store_block(
        self,
        i: int,
        key: Hashable,
        entry: Entry | None,
        own: Prefix,
        parent: Hashable | None,
        up: Entry | None,
        base: Any,
        ahead: _Ahead,
    ) -> tuple[Entry, Any, bool]:
        """Block ``i`` of a known prefix, the general way: its identity and chain (:meth:`_check_chain`), who
        computed it (``stored_once``), then the index learns it; its entry, its chain state (the next block's
        base) and whether its hash was recomputed."""
        had = 0 if entry is None else entry.copies
        block: Prefix | None = None  # the whole prefix, only when an in-flight request may compute it
        if self.in_flight:
            head = self._prefix(parent)
            block = None if head is None else head + own
        present = entry is not None and entry.tokens is not None
        learnt, base, recomputed = self._check_chain(i, key, entry, own, parent, present, base, ahead)
        if self.in_flight or had > 0:
            self._check_stored_once(key, block, had > 0)
        if self.ever is not None:
            self.ever.add(key)
        if entry is None:  # the index learns the block (``known`` stays true for its child)
            entry = self.blocks[key] = Entry(had + 1, parent, own, 0, learnt)
        else:
            entry.copies = had + 1
            if entry.state is None:
                entry.state = learnt
            if not present:
                entry.parent, entry.tokens = parent, own
        if not present:
            if self._by_node and (parent, own) not in self.child:
                self.child[(parent, own)] = key
            if up is not None:
                up.kids += 1
        if block is not None:
            self._hold(key, block)
        return entry, base, recomputed

    def _check_chain(
        self,
        i: int,
        key: Hashable,
        entry: Entry | None,
        own: Prefix,
        parent: Hashable | None,
        present: bool,
        base: Any,
        ahead: _Ahead,
    ) -> tuple[Any, Any, bool]:
        """One hash, one prefix: the node it stood for before, and the recipe's hash of its tokens.

        Returns the chain state this store teaches an entry that has none, the state the next block follows,
        and whether the hash was recomputed (not when the parent's chain is not known, or there is no recipe)."""
        if present:
            broken = entry.parent != parent or entry.tokens != own  # type: ignore[union-attr]
        else:
            identity = self.identity
            broken = identity is not None and identity.setdefault(key, (parent, own)) != (parent, own)
        kept = None if entry is None else entry.state
        if broken:
            self._identity_broken(key, (parent, own))
            return None, kept, False
        if base is None:
            return None, kept, False
        expected, chained = ahead.next(i, base)
        learnt = chained if kept is None else kept
        if expected != key:
            self._chain_broken(key, own, parent, expected)
        return learnt, learnt, True

    def _over_pool(self, total: int, key: Hashable) -> None:
        self.result.fail(
            "cached_within_pool",
            self.where,
            f"{total} cached blocks after storing {key} exceed the pool's {self.usable_blocks}",
        )

    def _identity_broken(self, key: Hashable, node: Node) -> None:
        r = self.result
        r.checked["hash_chain_agrees"] += 1
        r.fail(
            "hash_chain_agrees",
            self.where,
            f"hash {key} stored for a {len(self._prefix(node[0]) or ()) + len(node[1])}-token prefix "
            "it did not stand for before",
        )

    def _chain_broken(self, key: Hashable, tokens: Prefix, parent: Hashable | None, expected: Hashable) -> None:
        self.result.fail(
            "hash_chain_agrees",
            self.where,
            f"hash {key} published for the block of tokens ending {list(tokens[-4:])} after parent {parent}; "
            f"its tokens and parent give {expected}",
        )

    def _check_stored_once(self, key: Hashable, block: Prefix | None, cached: bool) -> None:
        """Credit the store of a known prefix to a request that computes ``block``; a cached hash needs one.

        ``cached``: ``key`` had a cached copy before this store. (The check is counted by the caller.)
        """
        fresh: list[InFlight] = []
        if block is not None:
            computing = [f for f in self.in_flight.values() if block in f.chain and f.chain[block] >= self._hits(f)]
            # Each request computes a block once, unless it may have been preempted (and recomputed it).
            fresh = [f for f in computing if f.stored[block] == 0] or [f for f in computing if not f.guarded]
            if fresh:
                fresh[0].stored[block] += 1
        if cached and not fresh:
            self.result.fail(
                "stored_once",
                self.where,
                f"hash {key} stored again while cached ({self.copies(key)} copies) "
                "and no in-flight request is computing that block",
            )

    def _hits(self, flight: InFlight) -> int:
        return (flight.record.cached_tokens or 0) // self.block_size

    def _hold(self, key: Hashable, block: Prefix) -> None:
        """A stored block is held by the one in-flight request whose chain has it past its hits.

        That request has been scheduled, so its hit bounds stop moving: the lookup is behind it. It is
        also computing now, on the server: a suspected removal of one of its earlier blocks is proven.
        """
        owners = [f for f in self.in_flight.values() if block in f.chain]
        if len(owners) == 1:
            owner, index = owners[0], owners[0].chain[block]
            owner.scheduled = True
            if owner.suspect:
                self._prove(owner, index)
            if index >= self._hits(owner):
                owner.held[key] = index

    def removed(self, keys: Iterable[Hashable]) -> None:
        """A BlockRemoved: one cached copy less of each of ``keys`` (``removed_was_cached``, in order).

        Its counts are tallied, added to the result by :meth:`apply_batch` at the end of the batch."""
        r, blocks, ever, in_flight = self.result, self.blocks, self.ever, self.in_flight
        removed = judged = 0
        total = self.total
        for key in keys:
            removed += 1
            entry = blocks.get(key)
            left = 0 if entry is None else entry.copies
            if left <= 0 and ever is not None and key not in ever:
                r.seen["removed before the stream was joined"] += 1
                continue
            judged += 1
            if left <= 0:
                r.fail("removed_was_cached", self.where, f"BlockRemoved for hash {key}, which has no cached copy")
                continue
            total -= 1
            entry.copies = left - 1  # type: ignore[union-attr]
            if left > 1:
                if in_flight:
                    self._check_holders({key})
                continue
            suspected = bool(in_flight) and self._check_holders({key})
            if entry.tokens is None:  # type: ignore[union-attr]
                del blocks[key]  # no node: the entry goes with its last copy
            elif entry.kids <= 0 and not suspected:  # type: ignore[union-attr]
                self._forget(key, entry)
        self.total = total
        tally = self._tally
        tally[4] += removed
        tally[5] += judged

    def _cleared(self) -> None:
        r = self.result
        r.seen["cleared"] += 1
        self.known = True
        self.ever = None
        in_flight = bool(self.in_flight)
        gone = {key for key, entry in self.blocks.items() if entry.copies > 0} if in_flight else set()
        self.blocks.clear()
        self.total = 0
        self.child.clear()
        if in_flight:
            self._check_holders(gone)

    def _check_holders(self, gone: set[Hashable]) -> bool:
        """``in_flight_not_removed`` for the last copies of ``gone``; True when one is now suspected.

        The client's window of a request (sent to reply read) holds its life on the server, but may end
        well after it: the server frees a finished request's blocks before the reply reaches the client.
        A request alone in its window has no sibling on the server to evict them, so a loss is judged at
        once. For one that is not alone the loss is a suspicion (``suspect``), proven by :meth:`_prove`
        when the stream later shows the request still computing: a store that only it can have made of
        a block of its chain past the lost one. Given up: a loss after the request's last store (vLLM
        never stores the block holding the final sampled token, so its last whole block may never be).
        """
        r, copies, suspected = self.result, self.copies, False  # copies: a function of the hash
        for flight in self.in_flight.values():
            if not flight.guarded:
                continue
            r.checked["in_flight_not_removed"] += 1
            lost = sorted((k for k in flight.held.keys() & gone if copies(k) <= 0), key=str)
            if not lost:
                continue
            if flight.alone:
                r.fail(
                    "in_flight_not_removed",
                    self.where,
                    f"request {flight.record.id} (in flight, not preempted) lost the last cached copy of "
                    f"{[str(k) for k in lost[:3]]}",
                )
                continue
            for key in lost:
                flight.suspect[key] = (flight.held[key], dict(self.where))
            suspected = True
        return suspected

    def _prove(self, flight: InFlight, index: int) -> None:
        """``flight`` stored block ``index`` of its chain now: its suspected losses of earlier blocks fail."""
        proven = sorted(((at, str(key)) for key, (at, _) in flight.suspect.items() if at < index))
        if not proven:
            return
        went = min((where for at, where in flight.suspect.values() if at < index), key=lambda w: w.get("batch", -1))
        flight.suspect = {key: seen for key, seen in flight.suspect.items() if seen[0] >= index}
        self.result.fail(
            "in_flight_not_removed",
            self.where,
            f"request {flight.record.id} (not preempted) lost the last cached copy of {[k for _, k in proven[:3]]} "
            f"(blocks {[at for at, _ in proven[:3]]} of its chain) at batch {went.get('batch')} (seq "
            f"{went.get('seq')}) and was still running after: it stored block {index} of its chain here",
        )

    def _unsuspect(self, flight: InFlight) -> None:
        """``flight`` finished unproven: its suspicions are dropped, and the removed prefixes they kept."""
        self.result.seen["in_flight_not_removed unproven"] += len(flight.suspect)
        for key in flight.suspect:
            if self.node(key) is not None and not any(key in f.suspect for f in self.in_flight.values()):
                self._forget(key)

    # -- requests and gauges ---------------------------------------------------------

    def start(self, record: RequestRecord, alone: bool) -> None:
        """A request arrives. Alone, it is admitted against the index as it stands now."""
        r, bs = self.result, self.block_size
        r.seen["requests"] += 1
        tokens = record.prompt + (record.output or ())
        chain = {tuple(tokens[: (j + 1) * bs]): j for j in range(len(tokens) // bs)}
        now = self.cached_prefix_blocks(record.prompt)
        guarded = record.preempted is False
        flight = InFlight(record, chain, guarded, alone, least=now, most=now, known=self.known)
        if alone and record.cached_tokens is not None:
            # Sent alone, it is scheduled before anything else can touch the index: its hits are held from now.
            hits = self._chain_keys(record.prompt, min(self._hits(flight), now))
            flight.held.update((key, j) for j, key in enumerate(hits))
        where = {"request": record.id, "started": record.started}
        if record.exact and record.cached_tokens is not None and self.known:
            r.checked["predicted_cached_tokens"] += 1
            if record.cached_tokens != now * bs:
                r.fail(
                    "predicted_cached_tokens",
                    where,
                    f"request {record.id} of {len(record.prompt)} prompt tokens got cached_tokens="
                    f"{record.cached_tokens}; the cached prefix at admission gives {now * bs}",
                )
        self.in_flight[record.id] = flight

    def finish(self, record: RequestRecord) -> None:
        """A request's response arrived: judge its hit against the bounds seen while it was in flight."""
        r, bs = self.result, self.block_size
        flight = self.in_flight.pop(record.id, None)
        if flight is not None and flight.suspect:
            self._unsuspect(flight)
        if flight is None or record.exact or record.cached_tokens is None or not flight.known:
            return
        r.checked["cached_tokens_within_bounds"] += 1
        low, high = flight.least * bs, flight.most * bs
        if not low <= record.cached_tokens <= high:
            r.fail(
                "cached_tokens_within_bounds",
                {"request": record.id, "finished": record.finished},
                f"request {record.id} got cached_tokens={record.cached_tokens}; while it was in flight the "
                f"cached prefix ranged over [{low}, {high}] tokens",
            )

    def reset(self) -> None:
        """The client's reset of the prefix cache succeeded: the engine's index is empty from now on.

        The engine publishes its AllBlocksCleared only at its next step (with the next request's
        events), so the ledger clears at the moment the reset returned.
        """
        self.result.seen["resets"] += 1
        self._cleared()

    def lost(self, first: int, stop: int) -> None:
        """The subscriber could not get batches [first, stop), not even from the replay socket."""
        self.result.checked["event_sequence_contiguous"] += 1
        self.result.fail(
            "event_sequence_contiguous",
            {"gap": [first, stop]},
            f"batches {first}..{stop - 1} were never received and could not be replayed",
        )

    def snapshot(self, metrics: MetricSnapshot) -> None:
        """Gauges read while nothing was in flight must show an empty pool in use."""
        r = self.result
        if not metrics.idle or metrics.usage is None:
            return
        r.checked["idle_usage_zero"] += 1
        if metrics.usage != 0.0:
            r.fail(
                "idle_usage_zero",
                {"metrics": metrics.ts},
                f"kv_cache_usage_perc={metrics.usage} while no request was in flight",
            )


def _known_not_preempted(record: RequestRecord, snapshots: Sequence[MetricSnapshot]) -> bool | None:
    """Not preempted when the preemption counter read before and after its window did not move."""
    if record.preempted is not None or record.exact:
        return False if record.exact else record.preempted
    before = [s.preemptions for s in snapshots if s.ts <= record.started and s.preemptions is not None]
    after = [s.preemptions for s in snapshots if s.ts >= record.finished and s.preemptions is not None]
    if before and after and before[-1] == after[0]:
        return False
    return None


class StreamCheck:
    """A recorded stream checked batch by batch: requests, gauges and resets placed by time between them.

    A request's start (finish) is applied before the first batch whose ``ts`` is not earlier than
    its ``started`` (``finished``); the batch order itself is kept as received, so a reordering
    shows as a sequence error rather than being sorted away. ``gaps``: seq ranges the subscriber
    reported lost; ``initial_known=False``: the stream was joined on a cache that may hold blocks.
    The batches are not kept: memory is the ledger's (the live index) and the requests'.
    """

    def __init__(
        self,
        requests: Sequence[RequestRecord],
        snapshots: Sequence[MetricSnapshot] = (),
        *,
        block_size: int,
        usable_blocks: int | None = None,
        published_hash: HashChain | None = None,
        resets: Sequence[float] = (),
        gaps: Sequence[tuple[int, int]] = (),
        initial_known: bool = True,
    ) -> None:
        requests = [replace(q, preempted=_known_not_preempted(q, snapshots)) for q in requests]
        self._windows = sorted((q.started, q.finished) for q in requests)
        self.ledger = StreamLedger(
            block_size, usable_blocks, published_hash, initial_known=initial_known, requests=bool(requests)
        )
        for first, stop in gaps:
            self.ledger.lost(first, stop)
        # Timed actions: (time, order, kind, item). At equal times a finish comes before a start.
        actions: list[tuple[float, int, str, Any]] = []
        for q in requests:
            actions += [(q.finished, 0, "finish", q), (q.started, 1, "start", q)]
        actions += [(s.ts, 2, "snapshot", s) for s in snapshots]
        actions += [(ts, 3, "reset", None) for ts in resets]
        actions.sort(key=lambda a: (a[0], a[1]))
        self._pending = iter(actions)
        self._upcoming = next(self._pending, None)
        self._index = 0

    def _alone(self, q: RequestRecord) -> bool:
        return sum(1 for s, f in self._windows if s < q.finished and q.started < f) == 1

    def _run_until(self, ts: float) -> None:
        ledger = self.ledger
        while self._upcoming is not None and self._upcoming[0] < ts:
            _, _, kind, item = self._upcoming
            if kind == "start":
                ledger.start(item, self._alone(item))
            elif kind == "finish":
                ledger.finish(item)
            elif kind == "reset":
                ledger.reset()
            else:
                ledger.snapshot(item)
            self._upcoming = next(self._pending, None)

    def batch(self, batch: Mapping[str, Any]) -> None:
        """The next batch as received (its index in the stream is the count of batches before it)."""
        self.events(batch.get("seq"), float(batch.get("ts", 0.0)), batch.get("events", []))

    def events(self, seq: int | None, ts: float, events: Iterable[Mapping[str, Any] | BatchEvent]) -> None:
        """The next batch given by its fields (:meth:`batch` of an already decoded batch)."""
        if self._upcoming is not None:
            self._run_until(ts)
        self.ledger.apply_batch(self._index, seq, events)
        self._index += 1

    def close(self) -> StreamResult:
        """Apply what comes after the last batch; the result."""
        self._run_until(float("inf"))
        return self.ledger.result


def check_stream(
    batches: Iterable[Mapping[str, Any]],
    requests: Sequence[RequestRecord],
    snapshots: Sequence[MetricSnapshot] = (),
    *,
    block_size: int,
    usable_blocks: int | None = None,
    published_hash: HashChain | None = None,
    resets: Sequence[float] = (),
    gaps: Sequence[tuple[int, int]] = (),
    initial_known: bool = True,
) -> StreamResult:
    """Check a recorded stream: batches in the order received (see :class:`StreamCheck`)."""
    check = StreamCheck(
        requests,
        snapshots,
        block_size=block_size,
        usable_blocks=usable_blocks,
        published_hash=published_hash,
        resets=resets,
        gaps=gaps,
        initial_known=initial_known,
    )
    for batch in batches:
        check.batch(batch)
    return check.close()
