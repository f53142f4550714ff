"""A per-block lifecycle side table: the JSONL events an engine writes about each KV block.

The log (docs/traces.md) has an optional header ``{"kvspec_side_table": 1,
"num_blocks", "block_size", "policy", "hit_cap", "duplicate_hashes"}`` and one
event a line, each named by ``event``: prefix_lookup, block_allocated,
block_sealed, block_touched, ref_count_changed, cache_admission_limited,
eviction_candidates_ranked, block_evicted. Checking replays the events into a
block ledger (state, ref_count, block_hash, hit_count per block, and the hash
index) and judges every event with the spec's invariant names where the meaning
is the same. A block's lifecycle is a state machine:

    free/evicted --block_allocated--> allocated --block_sealed--> sealed
    sealed --ref_count_changed to 0--> cached --block_touched--> sealed
    allocated --ref_count_changed to 0--> free
    cached --block_evicted--> evicted

Every recorded ref_count, hit_count, block_hash and state must agree with the
ledger after the event. Header fields are optional: a check that needs one is
``unknown`` without it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kvspec.spec import Event

from . import values
from .lines import Line, TraceFormatError
from .quality import OrphanCounter, TraceQuality
from .result import Judge, TraceInvariant
from .seen import LEAVING, Pool, Seen, block_pool, look, short

SIDE_TABLE_SCHEMA = 1
DESCRIPTION = "per-block lifecycle events"

BLOCK_EVENTS = ("block_allocated", "block_sealed", "block_touched", "ref_count_changed", "block_evicted")
EVENTS = (
    "prefix_lookup",
    "block_allocated",
    "block_sealed",
    "block_touched",
    "ref_count_changed",
    "cache_admission_limited",
    "eviction_candidates_ranked",
    "block_evicted",
)
STATES = ("free", "allocated", "sealed", "cached", "evicted")
# Why a block left the cache: only an eviction ("evict") is the policy's choice; a reclaim or a reset is not.
REASONS = ("evict", "reclaim", "reset")
# Policies whose choice a ranking determines: "order" keeps the ranked order (a free queue), "score" evicts the
# lowest retain_score first; family_protect keeps the order but passes over protected candidates while it can.
POLICIES = {"lru": "order", "shared_aware": "score", "family_protect": "protect"}

# Events that leave the latest eviction_candidates_ranked in force: an engine evicts and reuses in one run.
RANKING_KEEPS = frozenset({"eviction_candidates_ranked", "block_evicted", "block_allocated"})

Problems = list[str] | None

INVARIANTS: tuple[TraceInvariant, ...] = (
    TraceInvariant("trace_order", "trace", "seq numbers run 1 by 1 and ts never goes back: no line lost or moved."),
    TraceInvariant("lifecycle_transitions", "safety", "Each event is a legal move of the block's state machine."),
    TraceInvariant("no_active_eviction", "safety", "Only unreferenced blocks are evicted."),
    TraceInvariant("non_negative_ref_counts", "safety", "Ref counts never go below 0 and agree with the replay."),
    TraceInvariant("share_without_duplication", "safety", "A block hash is cached on at most one block."),
    TraceInvariant(
        "allocated_once_within_pool", "safety", "A block is never allocated twice; the pool never overflows."
    ),
    TraceInvariant("cache_index_consistency", "safety", "Hits and recorded hashes match the blocks cached."),
    TraceInvariant("predicted_prefix_hits", "refinement", "A lookup hits the longest cached chain of its hashes."),
    TraceInvariant("hit_count_consistency", "refinement", "A block's hit_count counts its touches since cached."),
    TraceInvariant("candidates_unreferenced", "policy", "Only cached, unreferenced blocks are ranked for eviction."),
    TraceInvariant("policy_conformance", "policy", "The evicted block is the policy's pick among the candidates."),
)


@dataclass
class _Block:
    state: str = "free"
    ref_count: int = 0
    block_hash: Hashable | None = None
    hit_count: int = 0


@dataclass
class Header:
    """What the log says about the pool; None where it does not say."""

    num_blocks: int | None = None
    block_size: int | None = None
    policy: str | None = None
    hit_cap: bool = False
    duplicate_hashes: bool = False

    @classmethod
    def from_line(cls, line: Line) -> Header:
        return cls(
            line.opt(values.blocks, "num_blocks"),
            line.opt_int("block_size", minimum=1),
            line.opt(values.choice, "policy", allowed=tuple(POLICIES)),
            bool(line.opt(values.boolean, "hit_cap")),
            bool(line.opt(values.boolean, "duplicate_hashes")),
        )


def _hash(line: Line, name: str, value: Any) -> Hashable:
    return line.typed(values.block_hash, name, value)


@dataclass
class SideTableLedger:
    """The blocks as the events so far leave them, and the hash index (hash -> blocks, in sealing order)."""

    header: Header
    blocks: dict[int, _Block] = field(default_factory=dict)
    index: dict[Hashable, list[int]] = field(default_factory=dict)
    ranking: list[dict[str, Any]] | None = None
    quality: TraceQuality = field(default_factory=TraceQuality)
    orphans: OrphanCounter = field(default_factory=OrphanCounter)
    parents: dict[int, Hashable | None] = field(default_factory=dict)  # cached block -> its parent's hash
    chains: dict[Hashable, Hashable | None] = field(default_factory=dict)  # hash -> the hash before it in a lookup
    evicted_held: int = 0  # the references the block evicted last held as it went (for adopt)

    def _cache_quality(self, line: Line, block_id: int, block_hash: Hashable) -> None:
        """A block entered the cache: regret if its hash was evicted before; its place in the orphan count."""
        raw = line.data.get("parent_hash")
        parent = None if raw is None else _hash(line, "parent_hash", raw)
        depth = line.opt_int("prefix_depth", minimum=0)
        if parent is None and block_hash in self.chains:  # a lookup listed the hash after its parent's
            parent, depth = self.chains[block_hash], 1 if self.chains[block_hash] is None else depth
        if parent is None and depth != 1:
            self.quality.orphans_unknown(
                f"line {line.number}: a block sealed without parent_hash at prefix_depth {depth}"
            )
        self.quality.cache(block_hash)
        self.orphans.add(block_hash, parent)
        self.parents[block_id] = parent
        self.quality.sample(line.number, self.orphans)

    def _uncache_quality(self, line: Line, block_id: int, block_hash: Hashable) -> None:
        if block_id in self.parents:
            self.orphans.remove(block_hash, self.parents.pop(block_id))
            self.quality.sample(line.number, self.orphans)

    def seen(self, line: Line) -> Seen:
        """The line and the blocks after it (a picture's column): each block's state and hash as a note."""
        name = str(line.data.get("event"))
        label = f"L{line.number} {name.removeprefix('block_').replace('eviction_candidates_ranked', 'ranked')}"
        block_id = line.data.get("block_id")
        touched = isinstance(block_id, int) and not isinstance(block_id, bool) and block_id in self.blocks
        if touched:
            label += f"\nblock {block_id}"
        evicted = name == "block_evicted" and touched
        reason = line.data.get("reason") if evicted else None
        events = (Event("reclaim" if reason in ("reclaim", "reset") else "evict", block_id),) if evicted else ()
        changed: dict[Hashable, int] = {}
        if touched and isinstance(block_id, int):
            block = self.blocks[block_id]
            changed[block_id] = LEAVING if events else look(block.ref_count, block.block_hash)

        def pool() -> Pool:  # reads the ledger as it is now: called at once or never
            header = self.header
            observation = block_pool(
                ((b, k.ref_count, k.block_hash) for b, k in self.blocks.items()),
                header.num_blocks,
                header.block_size or 0,
            )
            notes: dict[Hashable, str] = {
                b: f"{k.state} {short(k.block_hash, 6)}" if k.block_hash is not None else k.state
                for b, k in self.blocks.items()
                if b in observation.objects
            }
            return Pool(observation, notes, header.num_blocks is not None)

        return Seen(line.number, label, pool, changed, events)

    def block(self, block_id: int) -> _Block:
        return self.blocks.setdefault(block_id, _Block())

    # -- the events ----------------------------------------------------------------------
    def apply(self, line: Line) -> dict[str, Problems]:
        """Judge one event against the ledger, then apply it. Returns invariant -> problems (None: n/a)."""
        name = line.need("event")
        handler: Callable[[Line], dict[str, Problems]] | None = getattr(self, f"_on_{name}", None)
        if name not in EVENTS or handler is None:
            raise TraceFormatError(line.number, f"unknown event {name!r}; known: {', '.join(EVENTS)}")
        if name not in RANKING_KEEPS:
            self.ranking = None  # a ranking speaks for the run of evictions (and allocations) right after it
        return handler(line)

    def _block_event(self, line: Line) -> tuple[int, _Block, dict[str, Problems]]:
        block_id = line.need_int("block_id", minimum=0)
        results: dict[str, Problems] = {}
        n = self.header.num_blocks
        if n is not None:
            # Engines number blocks differently (vLLM's block 0 is a reserved null block): count ids, not ranges.
            # Each id past the pool's breaks it once, where it first shows (the ids before it are the pool's).
            new = block_id not in self.blocks
            seen = len(self.blocks) + new
            results["allocated_once_within_pool"] = (
                [] if seen <= n or not new else [f"block {block_id} is the {seen}th distinct block id in a pool of {n}"]
            )
        return block_id, self.block(block_id), results

    def _recorded(
        self, line: Line, block_id: int, block: _Block, results: dict[str, Problems], skip: tuple[str, ...] = ()
    ) -> None:
        """Compare what the event says about the block (all but ``skip``) with the ledger's own view."""
        ref = None if "ref_count" in skip else line.opt_int("ref_count")
        if ref is not None:
            neg = [f"block {block_id} has ref_count {ref}"] if ref < 0 else []
            off = (
                []
                if ref == block.ref_count or ref < 0
                else [f"block {block_id}: recorded ref_count {ref}, the replay gives {block.ref_count}"]
            )
            results["non_negative_ref_counts"] = (results.get("non_negative_ref_counts") or []) + neg + off
        hits = None if "hit_count" in skip else line.opt_int("hit_count")
        if hits is not None:
            results["hit_count_consistency"] = (
                []
                if hits == block.hit_count
                else [f"block {block_id}: recorded hit_count {hits}, {block.hit_count} touches since it was cached"]
            )
        if "block_hash" in line.data and "block_hash" not in skip:
            raw = line.data["block_hash"]
            recorded = None if raw is None else _hash(line, "block_hash", raw)
            problems = results.setdefault("cache_index_consistency", []) or []
            if recorded != block.block_hash:
                problems.append(f"block {block_id}: recorded hash {recorded!r}, cached as {block.block_hash!r}")
            results["cache_index_consistency"] = problems
        state = None if "state" in skip else line.opt(values.choice, "state", allowed=STATES)
        if state is not None:
            problems = results.get("lifecycle_transitions") or []
            if state != block.state:
                problems.append(f"block {block_id}: recorded state {state!r}, the replay gives {block.state!r}")
            results["lifecycle_transitions"] = problems

    def _move(self, block_id: int, block: _Block, event: str, allowed: tuple[str, ...]) -> list[str]:
        if block.state in allowed:
            return []
        return [f"{event} of block {block_id} in state {block.state!r} (allowed from {', '.join(allowed)})"]

    def _on_block_allocated(self, line: Line) -> dict[str, Problems]:
        block_id, block, results = self._block_event(line)
        if block.ref_count > 0:
            results["allocated_once_within_pool"] = [
                *(results.get("allocated_once_within_pool") or []),
                f"block {block_id} allocated again while it holds {block.ref_count} reference(s)",
            ]
            results["lifecycle_transitions"] = []
        else:
            results["lifecycle_transitions"] = self._move(block_id, block, "block_allocated", ("free", "evicted"))
        if block.block_hash is not None:
            self._unindex(block_id, block.block_hash)
            self._uncache_quality(line, block_id, block.block_hash)
        self.blocks[block_id] = block = _Block("allocated", 1)
        self._recorded(line, block_id, block, results)
        return results

    def _on_block_sealed(self, line: Line) -> dict[str, Problems]:
        block_id, block, results = self._block_event(line)
        block_hash = _hash(line, "block_hash", line.need("block_hash"))
        results["lifecycle_transitions"] = self._move(block_id, block, "block_sealed", ("allocated",))
        holders = [b for b in self.index.get(block_hash, []) if b != block_id]
        if self.header.duplicate_hashes:
            results["share_without_duplication"] = []
        else:
            results["share_without_duplication"] = (
                [f"block {block_id} sealed with hash {block_hash!r}, already cached on block(s) {holders}"]
                if holders
                else []
            )
        if block.block_hash is not None:
            self._unindex(block_id, block.block_hash)
            self._uncache_quality(line, block_id, block.block_hash)
        block.state, block.block_hash, block.hit_count = "sealed", block_hash, 0
        self.index.setdefault(block_hash, []).append(block_id)
        self._cache_quality(line, block_id, block_hash)
        self._recorded(line, block_id, block, results, skip=("block_hash",))
        return results

    def _on_block_touched(self, line: Line) -> dict[str, Problems]:
        block_id, block, results = self._block_event(line)
        results["lifecycle_transitions"] = self._move(block_id, block, "block_touched", ("sealed", "cached"))
        block.ref_count += 1
        block.hit_count += 1
        if block.block_hash is not None:
            block.state = "sealed"
        self._recorded(line, block_id, block, results)
        return results

    def _on_ref_count_changed(self, line: Line) -> dict[str, Problems]:
        block_id, block, results = self._block_event(line)
        new = line.need_int("ref_count")
        delta = line.opt_int("delta")
        problems = [f"block {block_id} has ref_count {new}"] if new < 0 else []
        if delta is not None and block.ref_count + delta != new:
            problems.append(f"block {block_id}: ref_count {block.ref_count} {delta:+d} recorded as {new}")
        results["non_negative_ref_counts"] = problems
        if block.ref_count == 0 and new > 0:
            results["lifecycle_transitions"] = [
                f"block {block_id} in state {block.state!r} gained a reference without block_allocated or block_touched"
            ]
        else:
            results["lifecycle_transitions"] = self._move(block_id, block, "ref_count_changed", ("allocated", "sealed"))
        block.ref_count = max(new, 0)
        if block.ref_count == 0 and block.state == "sealed":
            block.state = "cached"
        elif block.ref_count == 0 and block.state == "allocated":
            block.state = "free"
        self._recorded(line, block_id, block, results, skip=("ref_count",))
        return results

    def _on_block_evicted(self, line: Line) -> dict[str, Problems]:
        block_id, block, results = self._block_event(line)
        if block.ref_count > 0:
            results["no_active_eviction"] = [f"block {block_id} evicted while it holds {block.ref_count} reference(s)"]
            results["lifecycle_transitions"] = []
        else:
            results["no_active_eviction"] = []
            results["lifecycle_transitions"] = self._move(block_id, block, "block_evicted", ("cached",))
        if (line.opt(values.choice, "reason", allowed=REASONS) or "evict") == "evict":
            results["policy_conformance"] = self._policy(block_id, line)
            if block.block_hash is not None:
                self.quality.evict(block.block_hash, block.state, was_hit=block.hit_count > 0)
        # ref_count, hit_count and block_hash describe the block as it goes; state is where it goes.
        self._recorded(line, block_id, block, results, skip=("state",))
        if block.block_hash is not None:
            self._unindex(block_id, block.block_hash)
            self._uncache_quality(line, block_id, block.block_hash)
        self.evicted_held = block.ref_count
        self.blocks[block_id] = block = _Block("evicted")
        self._recorded(line, block_id, block, results, skip=("ref_count", "hit_count", "block_hash"))
        return results

    def _on_eviction_candidates_ranked(self, line: Line) -> dict[str, Problems]:
        candidates = []
        problems: list[str] = []
        for c in line.need_list("candidates"):
            if not isinstance(c, dict):
                raise TraceFormatError(line.number, f"a candidate must be an object, not {c!r}")
            block_id = line.as_int("candidates[].block_id", c.get("block_id"), minimum=0)
            for name, read in (("retain_score", values.number), ("protected", values.boolean)):
                if c.get(name) is not None:
                    line.typed(read, f"candidates[].{name}", c[name])
            if c.get("block_hash") is not None:
                _hash(line, "candidates[].block_hash", c["block_hash"])
            block = self.blocks.get(block_id, _Block())
            if block.state != "cached":
                problems.append(
                    f"candidate block {block_id} is {block.state} (ref_count {block.ref_count}), not cached"
                )
            candidates.append(c)
        self.ranking = candidates
        return {"candidates_unreferenced": problems}

    def _policy(self, block_id: int, line: Line) -> Problems:
        """The evicted block is the declared policy's pick among the current ranking's candidates still cached.

        An eviction with no ranking in force (none given, or the ranking was ended
        by another kind of event) is not judged.
        """
        kind = POLICIES.get(self.header.policy or "")
        if kind is None or self.ranking is None:
            return None
        still = [c for c in self.ranking if self.blocks.get(int(c["block_id"]), _Block()).state == "cached"]
        if not any(c["block_id"] == block_id for c in still):
            return [f"evicted block {block_id} is not among the ranked candidates {[c['block_id'] for c in still]}"]
        if kind == "score":
            if any(c.get("retain_score") is None for c in still):
                raise TraceFormatError(line.number, f"policy {self.header.policy} needs a retain_score per candidate")
            pick = min(still, key=lambda c: float(c["retain_score"]))
        elif kind == "protect":
            pick = next((c for c in still if not c.get("protected")), still[0])
        else:
            pick = still[0]
        if pick["block_id"] == block_id:
            return []
        chosen = next(c for c in still if c["block_id"] == block_id)
        return [
            f"evicted block {block_id} (retain_score {chosen.get('retain_score')}) but {self.header.policy} picks "
            f"block {pick['block_id']} (retain_score {pick.get('retain_score')})"
        ]

    def _on_prefix_lookup(self, line: Line) -> dict[str, Problems]:
        line.opt(values.string, "request_id")
        hashes = [_hash(line, "block_hashes[]", h) for h in line.need_list("block_hashes")]
        hit_blocks = [line.as_int("hit_blocks[]", b, minimum=0) for b in line.need_list("hit_blocks")]
        index_problems = []
        if len(hit_blocks) > len(hashes):
            index_problems.append(f"{len(hit_blocks)} hit blocks for {len(hashes)} block hashes")
        for i, (block_id, block_hash) in enumerate(zip(hit_blocks, hashes, strict=False)):
            if block_id not in self.index.get(block_hash, []):
                index_problems.append(f"hit {i}: block {block_id} is not cached under {block_hash!r}")
        chain = 0
        while chain < len(hashes) and self.index.get(hashes[chain]):
            chain += 1
        results: dict[str, Problems] = {"cache_index_consistency": index_problems}
        prompt, bs = line.opt_int("prompt_tokens", minimum=0), self.header.block_size
        said_hit = line.opt_int("hit_tokens", minimum=0)
        if prompt is not None and said_hit is not None and said_hit > prompt:
            index_problems.append(f"a lookup hit {said_hit} tokens of a {prompt}-token prompt")
        self.quality.lookup(
            hit=bool(hit_blocks), prompt_tokens=prompt, hit_tokens=said_hit if said_hit is not None else None
        )
        self.quality.lookup_blocks_hit(len(hashes), len(hit_blocks))
        for i, h in enumerate(hashes):
            self.chains.setdefault(h, hashes[i - 1] if i else None)
        if self.header.hit_cap and (prompt is None or bs is None):
            return results  # the cap depends on the prompt length and block size: not predictable here
        if self.header.hit_cap and prompt is not None and bs is not None:
            chain = min(chain, max(prompt - 1, 0) // bs)
        hits: list[str] = []
        if len(hit_blocks) != chain:
            hits.append(f"lookup hit {len(hit_blocks)} block(s), {chain} of its leading hashes are cached")
        tokens = line.opt_int("hit_tokens")
        if tokens is not None and bs is not None and tokens != len(hit_blocks) * bs:
            hits.append(f"hit_tokens {tokens} for {len(hit_blocks)} block(s) of {bs} tokens")
        results["predicted_prefix_hits"] = hits
        return results

    def _on_cache_admission_limited(self, line: Line) -> dict[str, Problems]:
        line.opt(values.string, "request_id")
        line.opt(values.string, "reason")
        return {}

    def adopt(self, line: Line) -> None:
        """After a line that broke something: what the line records about its block is the ledger's state.

        A recorded ``ref_count`` (0 or more), ``hit_count``, ``block_hash`` (re-indexed) and ``state``
        replace the ledger's. An eviction records the block as it goes: a block evicted while it holds
        references keeps them, uncached (``allocated``), so that its release agrees.
        """
        name, block_id = line.data.get("event"), line.data.get("block_id")
        if name not in BLOCK_EVENTS or not isinstance(block_id, int) or block_id not in self.blocks:
            return
        block = self.blocks[block_id]
        ref = line.opt_int("ref_count")
        if name == "block_evicted":
            held = ref if ref is not None and ref >= 0 else self.evicted_held
            if held:
                self.blocks[block_id] = _Block("allocated", held)
            return
        if ref is not None and ref >= 0:
            block.ref_count = ref
        hits = line.opt_int("hit_count")
        if hits is not None:
            block.hit_count = hits
        raw = line.data.get("block_hash")
        recorded = None if raw is None else _hash(line, "block_hash", raw)
        if "block_hash" in line.data and recorded != block.block_hash:
            if block.block_hash is not None:
                self._unindex(block_id, block.block_hash)
                self._uncache_quality(line, block_id, block.block_hash)
            block.block_hash = recorded
            if recorded is not None:
                self.index.setdefault(recorded, []).append(block_id)
        state = line.opt(values.choice, "state", allowed=STATES)
        if state is not None:
            block.state = state

    def _unindex(self, block_id: int, block_hash: Hashable) -> None:
        holders = self.index.get(block_hash, [])
        if block_id in holders:
            holders.remove(block_id)
        if not holders:
            self.index.pop(block_hash, None)


def recognizes(first: Mapping[str, Any]) -> bool:
    """A side table starts with its header or with an event."""
    return "kvspec_side_table" in first or "event" in first


def check(lines: list[Line], judge: Judge) -> None:
    """Replay a side-table log to its end (with ``judge.first``, to its first violating line).

    After a line that broke something the ledger takes what the line records about its block
    (:meth:`SideTableLedger.adopt`) and goes on; ``seq`` and ``ts`` go on from the line's own.
    """
    header = Header()
    events = lines
    if "kvspec_side_table" in lines[0].data:
        judge.at(lines[0])
        version = lines[0].data["kvspec_side_table"]
        if type(version) is not int or version != SIDE_TABLE_SCHEMA:
            raise TraceFormatError(lines[0].number, f"unsupported side table version {version!r}")
        header, events = Header.from_line(lines[0]), lines[1:]
        judge.result.adapter = lines[0].opt(values.string, "source") or ""
    if header.num_blocks is None and judge.options.capacity is not None:
        header.num_blocks = judge.options.capacity
    if header.policy is None and judge.options.policy is not None:
        header.policy = judge.options.policy
    if header.num_blocks is None:
        judge.unknown("allocated_once_within_pool", "the header gives no num_blocks")
    if header.policy not in POLICIES:
        judge.unknown("policy_conformance", f"no known policy in the header ({', '.join(POLICIES)})")
    if header.hit_cap and header.block_size is None:
        judge.unknown("predicted_prefix_hits", "hit_cap needs block_size in the header")
    if header.num_blocks is None and judge.options.capacity is not None:
        header.num_blocks = judge.options.capacity
    if header.policy is None and judge.options.policy is not None:
        header.policy = judge.options.policy
    ledger = SideTableLedger(header)
    judge.result.quality = ledger.quality
    last_seq: int | None = None
    last_ts: float | None = None
    result = judge.result
    for step, line in enumerate(events):
        judge.at(line)
        seq, ts = line.opt_int("seq"), line.opt_float("ts")
        order: list[str] = []
        if seq is not None:
            if last_seq is not None and seq != last_seq + 1:
                gap = "line(s) missing or moved" if seq > last_seq + 1 else "repeated or out of order"
                order.append(f"seq {seq} follows seq {last_seq}: {gap}")
            last_seq = seq
        if ts is not None:
            if last_ts is not None and ts < last_ts:
                order.append(f"ts {ts} is before the previous event's ts {last_ts}")
            last_ts = ts
        ordered = order if seq is not None or ts is not None else None
        if judge.judge(line, step, {"trace_order": ordered}) and judge.first:
            return
        results = ledger.apply(line)
        result.steps += 1
        result.coverage[str(line.data["event"])] += 1
        if judge.watch is not None:
            judge.watch(ledger.seen(line))
        if judge.judge(line, step, results):
            if judge.first:
                return
            ledger.adopt(line)
    if not result.checked.get("trace_order"):
        judge.unknown("trace_order", "the events carry neither seq nor ts")
