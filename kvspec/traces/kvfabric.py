"""The KVFabric vLLM overlay's own lifecycle log (``kvfabric_lifecycle.jsonl``), read as its writer writes it.

The writer is ``KVFabricLifecycleTracker`` (``vllm/v1/core/kvfabric_lifecycle.py`` of the
public KVFabric repository), called from vLLM's BlockPool: every line is ``{"seq", "event",
"time_ns", ...}`` (``json.dumps(sort_keys=True)``); ``seq`` counts every event of one tracker
from 1, ``time_ns`` is ``time.monotonic_ns()``. There is no header. Block events carry the
tracker's side-table record of the block *after* the event (``block_id``, ``block_hash`` as
hex of vLLM's hash with its 4-byte KV-group suffix, ``ref_count``, ``hit_count``, ``state``,
``prefix_depth``, ... and, in later versions, ``parent_hash`` and family fields). The record
of a block lives from its first event until it is evicted (or the tracker resets); its
``hit_count`` counts the touches in that time. docs/traces.md has the field table and how
the versions differ.

Checking replays the block events into a ledger (ref count, hash, hit count, last recorded
state per block) and judges each line from what the log says. What the log does not say is
never guessed: an event a check cannot judge is counted (``TraceResult.unjudged``) and the
check reads ``unknown`` with the reason while it has no verdict; event names the reader does
not know are counted and listed, never an error. A log that does not start at its tracker's
beginning (line 1 is neither ``tracker_initialized`` nor ``seq`` 1: a window cut from a longer
log) adopts each block from its first record, and judges its history from then on.

The file's tracker runs are kept apart: the writer appends, so a second ``tracker_initialized``
(``seq`` 1) starts a new run on a new pool.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from kvspec.spec import Event

from . import values
from .lines import Line, TraceFormatError
from .quality import OrphanCounter, TraceQuality
from .result import Judge, TraceInvariant
from .seen import LEAVING, Pool, Seen, block_pool, look, short

DESCRIPTION = "the KVFabric vLLM overlay's lifecycle log (kvfabric_lifecycle.jsonl)"

BLOCK_EVENTS = ("block_allocated", "block_sealed", "block_touched", "ref_count_changed", "block_evicted")
REQUEST_EVENTS = (
    "request_hints_observed",
    "request_defer_skipped",
    "request_promotion_skipped",
    "request_promoted",
    "request_latency_promoted",
    "request_deferred",
    "request_finished",
    "request_scheduled",
)
EVENTS = (
    "tracker_initialized",
    "prefix_lookup",
    *BLOCK_EVENTS,
    "eviction_candidates_ranked",
    "cache_admission_limited",
    "lifecycle_reset",
    *REQUEST_EVENTS,
)
"""Every event name some version of the writer emits; others are counted as unknown."""

HELD_STATES = ("ACTIVE", "SHARED", "SEALED")
FREE_STATES = ("COOLING_HOT", "COOLING_WARM", "CANDIDATE", "FREE")
STATES = (*HELD_STATES, *FREE_STATES, "EVICTED")
POLICIES = ("lru", "shared_aware", "family_protect")

# Events after which the latest ranking still speaks: get_new_blocks evicts and allocates its victims in one go.
RANKING_KEEPS = frozenset({"eviction_candidates_ranked", "block_evicted", "block_allocated"})

Problems = list[str] | None

# Report order: within a line, the most specific cause before the symptoms it also produces
# (a block allocated twice also disagrees with its recorded ref count and state).
INVARIANTS: tuple[TraceInvariant, ...] = (
    TraceInvariant("trace_order", "trace", "seq runs 1 by 1 from each tracker start; time_ns never goes back."),
    TraceInvariant("allocated_once_within_pool", "safety", "No block is allocated twice; the pool is never exceeded."),
    TraceInvariant("lifecycle_transitions", "safety", "Each block event is a legal move; recorded states agree."),
    TraceInvariant("no_active_eviction", "safety", "A block is evicted only while it holds no reference."),
    TraceInvariant("non_negative_ref_counts", "safety", "Ref counts never go below 0 and agree with the replay."),
    TraceInvariant("cache_index_consistency", "safety", "A hit is on a cached block; recorded hashes agree."),
    TraceInvariant("hit_count_consistency", "refinement", "hit_count counts the block's touches since its record."),
    TraceInvariant("candidates_unreferenced", "policy", "Ranked eviction candidates hold no reference."),
    TraceInvariant("policy_conformance", "policy", "Rankings follow the policy; allocations take their victims."),
)


@dataclass
class _Block:
    """What the log has said about one block: the writer's record of it, replayed."""

    ref_count: int = 0
    block_hash: str | None = None
    parent: str | None = None
    hit_count: int = 0
    state: str = "FREE"
    indexed: bool = False  # counted in the run's orphan counter (not for blocks cached before a window)


@dataclass
class _Run:
    """One tracker's events: its pool, policy and blocks."""

    policy: str | None
    capacity: int | None
    window: bool  # the log starts after this tracker's beginning: blocks are adopted on first sight
    blocks: dict[int, _Block] = field(default_factory=dict)
    held: int = 0
    orphans: OrphanCounter = field(default_factory=OrphanCounter)
    victims: list[int] | None = None  # the ranking in force: the block ids it selected, not yet allocated
    last_seq: int | None = None
    last_time: int | None = None


def _opt_str(line: Line, name: str) -> str | None:
    return line.opt(values.string, name)


class KVFabricReplay:
    """The ledger of a KVFabric log and the judgement of each line against it."""

    def __init__(self, judge: Judge, quality: TraceQuality) -> None:
        self.judge, self.quality = judge, quality
        self.options = judge.options
        self.run: _Run | None = None

    # -- runs ----------------------------------------------------------------------------
    def _start(self, line: Line, *, window: bool) -> _Run:
        policy = self._policy_of(line, line.opt(values.string, "policy"))
        capacity = self.options.capacity
        self.run = _Run(policy, capacity, window)
        if window:
            self.quality.orphans_unknown(
                f"the log starts mid-run (line {line.number} is not the tracker's first event): "
                "blocks cached before it are not known"
            )
        return self.run

    def _policy_of(self, line: Line, said: str | None) -> str | None:
        given = self.options.policy
        if said is not None and given is not None and said != given:
            raise TraceFormatError(line.number, f"the log's policy {said!r} disagrees with --policy {given!r}")
        return said if said is not None else given

    # -- one line ------------------------------------------------------------------------
    def apply(self, line: Line) -> dict[str, Problems]:
        """Judge one line and apply it; returns invariant -> problems (None: did not apply)."""
        name = line.typed(values.string, "event", line.need("event"))
        seq = line.opt_int("seq")
        time_ns = line.opt_int("time_ns")
        run = self.run
        if name == "tracker_initialized" and (run is None or seq in (None, 1)):
            run = self._start(line, window=False)
        elif run is None:
            run = self._start(line, window=seq != 1)
        results: dict[str, Problems] = {"trace_order": self._order(run, seq, time_ns)}
        if name not in RANKING_KEEPS:
            run.victims = None
        if name not in EVENTS:
            self.judge.result.unknown_events[name] += 1
            return results
        self.judge.result.coverage[name] += 1
        handler = getattr(self, f"_on_{name}", None)
        if handler is not None:
            results.update(handler(line, run))
        return results

    def _order(self, run: _Run, seq: int | None, time_ns: int | None) -> Problems:
        if seq is None and time_ns is None:
            self.judge.cannot_judge("trace_order", "the events carry neither seq nor time_ns")
            return None
        problems = []
        if seq is not None:
            if run.last_seq is not None and seq != run.last_seq + 1:
                gap = "line(s) missing or moved" if seq > run.last_seq + 1 else "repeated or out of order"
                problems.append(f"seq {seq} follows seq {run.last_seq}: {gap}")
            run.last_seq = seq
        if time_ns is not None:
            if run.last_time is not None and time_ns < run.last_time:
                problems.append(f"time_ns {time_ns} is before the previous event's {run.last_time}")
            run.last_time = time_ns
        return problems

    def _on_tracker_initialized(self, line: Line, run: _Run) -> dict[str, Problems]:
        return {}

    # -- block events --------------------------------------------------------------------
    def _block(self, line: Line, run: _Run) -> tuple[int, _Block | None, dict[str, Problems]]:
        """The block the line is about; None when it is first seen in a window (its past unknown)."""
        block_id = line.need_int("block_id", minimum=0)
        results: dict[str, Problems] = {}
        if run.capacity is not None:
            outside = block_id == 0 or block_id > run.capacity
            results["allocated_once_within_pool"] = (
                [f"block {block_id} is outside a pool of {run.capacity} blocks (ids 1..{run.capacity})"]
                if outside
                else []
            )
        block = run.blocks.get(block_id)
        if block is None and not run.window:
            block = run.blocks[block_id] = _Block()  # a complete log starts from an empty pool
        return block_id, block, results

    def _adopt(self, line: Line, run: _Run, block_id: int, results: dict[str, Problems]) -> dict[str, Problems]:
        """A block first seen mid-run: take its record as the replay's state, judge only what the line says."""
        reason = "the block's events before the log's first line are not in the log"
        for name in ("lifecycle_transitions", "hit_count_consistency"):
            self.judge.cannot_judge(name, reason)
        ref = line.opt_int("ref_count")
        if ref is not None:
            results["non_negative_ref_counts"] = [f"block {block_id} has ref_count {ref}"] if ref < 0 else []
        block = run.blocks[block_id] = _Block(
            ref_count=max(ref or 0, 0),
            block_hash=_opt_str(line, "block_hash"),
            parent=_opt_str(line, "parent_hash"),
            hit_count=line.opt_int("hit_count") or 0,
            state=line.opt(values.string, "state") or "FREE",
        )
        run.held += block.ref_count > 0
        return results

    def _recorded(self, line: Line, block_id: int, block: _Block, results: dict[str, Problems]) -> None:
        """Compare the record on the line (the block after the event) with the replay."""
        ref = line.opt_int("ref_count")
        if ref is not None:
            problems = results.get("non_negative_ref_counts") or []
            if ref < 0:
                problems.append(f"block {block_id} has ref_count {ref}")
            elif ref != block.ref_count:
                problems.append(f"block {block_id}: recorded ref_count {ref}, the replay gives {block.ref_count}")
            results["non_negative_ref_counts"] = problems
        hits = line.opt_int("hit_count")
        if hits is not None:
            results["hit_count_consistency"] = (
                []
                if hits == block.hit_count
                else [f"block {block_id}: recorded hit_count {hits}, {block.hit_count} touch(es) in its record"]
            )
        if "block_hash" in line.data:
            recorded = _opt_str(line, "block_hash")
            problems = results.get("cache_index_consistency") or []
            if recorded != block.block_hash:
                problems.append(
                    f"block {block_id}: recorded block_hash {recorded}, the replay gives {block.block_hash}"
                )
            results["cache_index_consistency"] = problems

    def _state(self, line: Line, block_id: int, expected: tuple[str, ...], results: dict[str, Problems]) -> None:
        """The recorded ``state`` is one the writer gives a block in the replay's situation."""
        state = line.opt(values.string, "state")
        if state is None:
            return
        if state not in STATES:
            self.judge.cannot_judge("lifecycle_transitions", f"state {state!r} is not one this reader knows")
            return
        problems = results.get("lifecycle_transitions") or []
        if state not in expected:
            problems.append(f"block {block_id}: recorded state {state}, the replay allows {'/'.join(expected)}")
        results["lifecycle_transitions"] = problems

    def _held_state(self, block: _Block, resting: str) -> tuple[str, ...]:
        return ("SHARED",) if block.ref_count > 1 else (resting,)

    def _on_block_allocated(self, line: Line, run: _Run) -> dict[str, Problems]:
        block_id, block, results = self._block(line, run)
        self._victim(line, run, block_id, results, consume=True)
        if block is None:
            self.judge.cannot_judge("allocated_once_within_pool", "the block's references before the log are unknown")
            results = self._adopt(line, run, block_id, results)
            run.blocks[block_id].ref_count = 1
            return results
        problems = []
        twice = block.ref_count > 0
        if twice:
            results["allocated_once_within_pool"] = [
                *(results.get("allocated_once_within_pool") or []),
                f"block {block_id} allocated again while it holds {block.ref_count} reference(s)",
            ]
        elif block.block_hash is not None:
            problems.append(f"block {block_id} reused while cached under {block.block_hash} without block_evicted")
        if run.capacity is None:
            self.judge.cannot_judge(
                "allocated_once_within_pool", "the pool size is unknown: the log gives no total_blocks; pass --capacity"
            )
        results.setdefault("allocated_once_within_pool", [])
        results["lifecycle_transitions"] = problems
        if block.ref_count == 0:
            run.held += 1
        block.ref_count += 1
        if run.capacity is not None and run.held > run.capacity:
            results["allocated_once_within_pool"] = [
                *(results.get("allocated_once_within_pool") or []),
                f"{run.held} blocks hold references in a pool of {run.capacity}",
            ]
        self._recorded(line, block_id, block, results)
        if not twice:  # the writer's record of a block allocated twice says what its ref count is, not ours
            self._state(line, block_id, self._held_state(block, "ACTIVE"), results)
        block.state = "ACTIVE"
        return results

    def _on_block_sealed(self, line: Line, run: _Run) -> dict[str, Problems]:
        block_id, block, results = self._block(line, run)
        block_hash = line.typed(values.string, "block_hash", line.need("block_hash"))
        parent = _opt_str(line, "parent_hash")
        depth = line.opt_int("prefix_depth", minimum=0)
        if parent is None and depth != 1:
            where = "at an unknown prefix_depth" if depth is None else f"at prefix_depth {depth}"
            self.quality.orphans_unknown(
                f"line {line.number}: a block sealed {where} carries no parent_hash "
                "(a writer before the family fields, or KVFABRIC_ENABLE_FAMILY_TREE=0)"
            )
        if block is None:
            results = self._adopt(line, run, block_id, results)
            block = run.blocks[block_id]
        else:
            problems = []
            if block.ref_count == 0:
                problems.append(f"block {block_id} sealed while it holds no reference")
            if block.block_hash is not None:
                problems.append(f"block {block_id} sealed again while cached under {block.block_hash}")
                self._uncache(run, block)
            results["lifecycle_transitions"] = problems
            block.block_hash, block.parent = block_hash, parent
            self._recorded(line, block_id, block, results)
            self._state(line, block_id, self._held_state(block, "SEALED"), results)
        block.state = "SHARED" if block.ref_count > 1 else "SEALED"
        self.quality.cache(block_hash)
        run.orphans.add(block_hash, block.parent)
        block.indexed = True
        self.quality.sample(line.number, run.orphans)
        return results

    def _on_block_touched(self, line: Line, run: _Run) -> dict[str, Problems]:
        block_id, block, results = self._block(line, run)
        if block is None:
            results = self._adopt(line, run, block_id, results)
            if run.blocks[block_id].block_hash is None:
                results["cache_index_consistency"] = [f"a hit on block {block_id}, which its record shows uncached"]
            return results
        results["cache_index_consistency"] = (
            []
            if block.block_hash is not None
            else [f"a hit on block {block_id}, which is not cached (not sealed since it was allocated, or evicted)"]
        )
        results["lifecycle_transitions"] = []
        if block.ref_count == 0:
            run.held += 1
        block.ref_count += 1
        block.hit_count += 1
        self._recorded(line, block_id, block, results)
        self._state(line, block_id, self._held_state(block, "ACTIVE"), results)
        block.state = "SHARED" if block.ref_count > 1 else "ACTIVE"
        return results

    def _on_ref_count_changed(self, line: Line, run: _Run) -> dict[str, Problems]:
        block_id, block, results = self._block(line, run)
        new = line.need_int("ref_count")
        if block is None:
            return self._adopt(line, run, block_id, results)
        problems = [f"block {block_id} has ref_count {new}"] if new < 0 else []
        if block.ref_count == 0:
            problems.append(f"block {block_id} released while it holds no reference")
        elif new >= 0 and new != block.ref_count - 1:
            problems.append(
                f"block {block_id}: ref_count {block.ref_count} released to {new}, not {block.ref_count - 1}"
            )
        results["non_negative_ref_counts"] = problems
        results["lifecycle_transitions"] = []
        was_held = block.ref_count > 0
        block.ref_count = max(new, 0)
        run.held += (block.ref_count > 0) - was_held
        line_without_ref = Line(line.number, line.text, {k: v for k, v in line.data.items() if k != "ref_count"})
        self._recorded(line_without_ref, block_id, block, results)
        expected = FREE_STATES if block.ref_count == 0 else self._held_state(block, "ACTIVE")
        self._state(line, block_id, expected, results)
        block.state = line.opt(values.string, "state") or block.state
        return results

    def _on_block_evicted(self, line: Line, run: _Run) -> dict[str, Problems]:
        block_id, block, results = self._block(line, run)
        self._victim(line, run, block_id, results, consume=False)
        said = line.opt(values.string, "policy")
        if said is not None and run.policy is not None and said != run.policy:
            results["policy_conformance"] = [
                *(results.get("policy_conformance") or []),
                f"block_evicted says policy {said}, the run's policy is {run.policy}",
            ]
        recorded_ref = line.opt_int("ref_count")
        if block is None:
            results = self._adopt(line, run, block_id, results)
            block = run.blocks[block_id]
            state_before = "unknown"
            referenced = recorded_ref or 0
        else:
            state_before = block.state
            referenced = max(block.ref_count, recorded_ref or 0)
            results["lifecycle_transitions"] = (
                [] if block.block_hash is not None else [f"block {block_id} evicted while not cached"]
            )
            self._recorded(line, block_id, block, results)
            self._state(line, block_id, ("EVICTED",), results)
        results["no_active_eviction"] = (
            [f"block {block_id} evicted while it holds {referenced} reference(s)"] if referenced > 0 else []
        )
        if block.block_hash is not None:
            self.quality.evict(block.block_hash, state_before, was_hit=block.hit_count > 0)
            self._uncache(run, block)
            self.quality.sample(line.number, run.orphans)
        # The writer drops the block's record: the next event starts a new one.
        run.blocks[block_id] = _Block(ref_count=block.ref_count, state="EVICTED")
        return results

    def adopt(self, line: Line) -> None:
        """After a line that broke something: what the line records about its block is the replay's state.

        The writer's record is the block after the event: its ``ref_count`` (0 or more), ``hit_count``,
        ``block_hash`` (with ``parent_hash``) and ``state`` replace the replay's where the line gives them.
        An eviction keeps the replay's result (the record is dropped; a block evicted while held keeps its
        references, so its release later agrees); a ranking's victims were already taken in the log's order.
        """
        run, name, block_id = self.run, line.data.get("event"), line.data.get("block_id")
        if run is None or name not in BLOCK_EVENTS or name == "block_evicted" or not isinstance(block_id, int):
            return
        block = run.blocks.get(block_id)
        if block is None:
            return
        ref = line.opt_int("ref_count")
        if ref is not None and ref >= 0:
            run.held += (ref > 0) - (block.ref_count > 0)
            block.ref_count = ref
        hits = line.opt_int("hit_count")
        if hits is not None:
            block.hit_count = hits
        recorded = _opt_str(line, "block_hash")
        if "block_hash" in line.data and recorded != block.block_hash:
            self._uncache(run, block)  # the orphan count leaves the adopted hash out
            block.block_hash, block.parent = recorded, _opt_str(line, "parent_hash")
        state = line.opt(values.string, "state")
        if state in STATES:
            block.state = state

    def _uncache(self, run: _Run, block: _Block) -> None:
        if block.block_hash is not None and block.indexed:
            run.orphans.remove(block.block_hash, block.parent)
        block.block_hash, block.parent, block.indexed = None, None, False

    # -- the rest ------------------------------------------------------------------------
    def _on_lifecycle_reset(self, line: Line, run: _Run) -> dict[str, Problems]:
        held = sorted(b for b, block in run.blocks.items() if block.ref_count > 0)
        problems = [f"prefix cache reset while block(s) {held[:8]} hold references"] if held else []
        for block in run.blocks.values():
            self._uncache(run, block)
        # The writer clears every record: blocks start new records, hit counts from 0.
        run.blocks = {b: _Block(ref_count=block.ref_count) for b, block in run.blocks.items()}
        self.quality.sample(line.number, run.orphans)
        return {"lifecycle_transitions": problems}

    def _on_prefix_lookup(self, line: Line, run: _Run) -> dict[str, Problems]:
        prompt = line.opt_int("prompt_tokens", minimum=0)
        hit = line.opt_int("hit_tokens", minimum=0)
        flag = line.opt(values.boolean, "hit")
        self.quality.lookup(hit=bool(hit) if hit is not None else bool(flag), prompt_tokens=prompt, hit_tokens=hit)
        if prompt is not None and hit is not None and hit > prompt:
            return {"cache_index_consistency": [f"a lookup hit {hit} tokens of a {prompt}-token prompt"]}
        return {}

    def _on_cache_admission_limited(self, line: Line, run: _Run) -> dict[str, Problems]:
        total = line.opt(values.blocks, "total_blocks")
        if total is not None:
            if run.capacity is not None and run.capacity != total:
                raise TraceFormatError(
                    line.number, f"total_blocks {total} disagrees with the pool size {run.capacity} (--capacity)"
                )
            run.capacity = total
        return {}

    def _on_eviction_candidates_ranked(self, line: Line, run: _Run) -> dict[str, Problems]:
        results: dict[str, Problems] = {}
        policy = self._ranking_policy(line, run)
        raw = line.opt(values.array, "candidates")
        if raw is None:
            run.victims = None
            self.judge.cannot_judge(
                "policy_conformance", "a ranking lists no candidates (KVFABRIC_RANK_LOG_CANDIDATES off)"
            )
            results["policy_conformance"] = policy
            return results
        unreferenced, index = [], []
        candidates = []
        for i, c in enumerate(raw):
            where = f"candidates[{i}]"
            entry = line.typed(values.mapping, where, c)
            block_id = line.as_int(f"{where}.block_id", entry.get("block_id"), minimum=0)
            ref = entry.get("ref_count")
            ref = None if ref is None else line.as_int(f"{where}.ref_count", ref)
            has_hash = entry.get("has_hash")
            has_hash = None if has_hash is None else line.typed(values.boolean, f"{where}.has_hash", has_hash)
            protected = entry.get("protected")
            if protected is not None:
                protected = line.typed(values.boolean, f"{where}.protected", protected)
            score = entry.get("retain_score")
            score = None if score is None else line.typed(values.number, f"{where}.retain_score", score)
            block = run.blocks.get(block_id)
            if ref is not None and ref > 0:
                unreferenced.append(f"candidate block {block_id} is recorded with ref_count {ref}")
            elif block is not None and block.ref_count > 0:
                unreferenced.append(f"candidate block {block_id} holds {block.ref_count} reference(s) in the replay")
            if has_hash is not None and block is not None and has_hash != (block.block_hash is not None):
                index.append(
                    f"candidate block {block_id}: has_hash {has_hash}, the replay's hash is {block.block_hash}"
                )
            candidates.append((block_id, has_hash, protected, score))
        results["candidates_unreferenced"] = unreferenced
        if index:
            results["cache_index_consistency"] = index
        order = self._ranking_order(line, run, candidates)
        if policy is not None or order is not None:
            results["policy_conformance"] = (policy or []) + (order or [])
        run.victims = [c[0] for c in candidates]
        return results

    def _ranking_policy(self, line: Line, run: _Run) -> Problems:
        """The ranking belongs to the run's policy (None: the run's policy is not known)."""
        said = line.opt(values.string, "policy")
        if run.policy is None:
            return None
        if run.policy == "lru":
            return ["an lru run ranks no eviction candidates (vLLM's free queue decides)"]
        if said is not None and said != run.policy:
            return [f"the ranking says policy {said}, the run's policy is {run.policy}"]
        return []

    def _ranking_order(self, line: Line, run: _Run, candidates: list[tuple[int, Any, Any, Any]]) -> Problems:
        """The listed victims in the order the run's policy selects them (the writer lists them as selected)."""
        selector = line.opt(values.string, "selector")
        if run.policy not in ("shared_aware", "family_protect"):
            self.judge.cannot_judge("policy_conformance", f"no ranking order is known for policy {run.policy!r}")
            return None
        if any(c[1] is None or c[2] is None or c[3] is None for c in candidates):
            self.judge.cannot_judge("policy_conformance", "a candidate lacks has_hash, protected or retain_score")
            return None

        def key(c: tuple[int, Any, Any, Any]) -> tuple[float, ...]:
            _, has_hash, protected, score = c
            if selector == "family_protect_linear":  # the free queue's order, protected blocks last
                return (1.0 if has_hash and protected else 0.0,)
            if not has_hash:  # uncached free blocks go first, as they come
                return (0.0, 0.0)
            bucket = 2.0 if run.policy == "family_protect" and protected else 1.0
            return (bucket, float(score))

        for before, after in pairwise(candidates):
            if key(after) < key(before):
                return [
                    f"{run.policy} ({selector or 'ranked'}) selects block {after[0]} (retain_score {after[3]}, "
                    f"protected {after[2]}) after block {before[0]} (retain_score {before[3]}, protected {before[2]})"
                ]
        return []

    def _victim(self, line: Line, run: _Run, block_id: int, results: dict[str, Problems], *, consume: bool) -> None:
        """Under a ranking, each block evicted and allocated is its next selected victim."""
        if run.victims is None:
            return
        if not run.victims:
            run.victims = None
            return
        expected = run.victims[0]
        if block_id != expected and block_id in run.victims:  # taken out of order: the ranking goes on from it
            del run.victims[: run.victims.index(block_id)]
        if consume:
            run.victims.pop(0)
        results["policy_conformance"] = (
            [] if block_id == expected else [f"block {block_id} taken where the ranking selected block {expected} next"]
        )


# Event names as a column of a picture shows them (the long ones cut).
_SHORT = {"eviction_candidates_ranked": "ranked", "cache_admission_limited": "admission_limited"}


def seen(line: Line, run: _Run | None) -> Seen:
    """The line and the pool the replay holds after it: every block with a reference or a hash, its recorded state."""
    name = str(line.data.get("event"))
    label = f"L{line.number} {_SHORT.get(name, name.removeprefix('block_'))}"
    block_id = line.data.get("block_id")
    touched = isinstance(block_id, int) and not isinstance(block_id, bool)
    if touched:
        label += f"\nblock {block_id}"
    blocks, capacity = ({}, None) if run is None else (run.blocks, run.capacity)
    events = (Event("evict", block_id),) if name == "block_evicted" and touched else ()
    changed: dict[Hashable, int] | None = None  # a new tracker run or a reset: any block may have changed
    if name in BLOCK_EVENTS and touched and block_id in blocks:
        block = blocks[block_id]
        changed = {block_id: LEAVING if events else look(block.ref_count, block.block_hash)}
    elif name not in ("tracker_initialized", "lifecycle_reset"):
        changed = {}

    def pool() -> Pool:  # reads the replay as it is now: called at once or never
        observation = block_pool(((b, k.ref_count, k.block_hash) for b, k in blocks.items()), capacity)
        notes: dict[Hashable, str] = {
            b: f"{k.state} {short(k.block_hash, 6)}" if k.block_hash is not None else k.state
            for b, k in blocks.items()
            if b in observation.objects
        }
        return Pool(observation, notes, capacity is not None)

    return Seen(line.number, label, pool, changed, events)


def recognizes(first: Mapping[str, Any]) -> bool:
    """A KVFabric log line: an ``event`` stamped with ``time_ns`` (the side table uses ``ts``)."""
    return "event" in first and ("time_ns" in first or first.get("event") == "tracker_initialized")


def check(lines: list[Line], judge: Judge) -> None:
    """Replay a KVFabric lifecycle log to its end (with ``judge.first``, to its first violating line).

    After a line that broke something the replay takes the line's own record of its block as the
    block's state (:meth:`KVFabricReplay.adopt`) and goes on.
    """
    result = judge.result
    result.quality = quality = TraceQuality()
    replay = KVFabricReplay(judge, quality)
    for step, line in enumerate(lines):
        judge.at(line)
        results = replay.apply(line)
        result.steps += 1
        if judge.watch is not None:
            judge.watch(seen(line, replay.run))
        if judge.judge(line, step, results):
            if judge.first:
                return
            replay.adopt(line)
    if replay.run is not None and replay.run.policy is None:
        judge.unknown("policy_conformance", "the log names no policy (no tracker_initialized); pass --policy")
