"""Named coverage goals of the bounded block model, and the search for the shortest op sequence to each.

A goal is a situation worth driving every adapter through: a formula over one
symbolic transition (spec.formal.symbolic) that says "this step is an instance of the
situation". ``reach`` asks Z3 for the shortest op sequence from the empty pool
whose last step satisfies the goal; stateful_tests.bounded saves the answers as
cases that ``kvspec check`` replays before its random phase.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import z3

from ..ops import Op
from .bmc import Path, _check, _solver
from .symbolic import (
    ADMIT,
    APPEND,
    OK,
    PREEMPTED,
    REFUSED,
    RELEASE,
    RESET,
    RESUME,
    RUNNING,
    Bounds,
    Encoding,
    SymTransition,
    Term,
)
from .symbolic_invariants import free_count, indexed_at, prefix_bits

GoalFormula = Callable[[Encoding, SymTransition], Term]


@dataclass(frozen=True)
class Goal:
    name: str
    description: str
    formula: GoalFormula


def _kind(enc: Encoding, tr: SymTransition, *kinds: int) -> Term:
    return z3.Or(*[tr.op.kind == enc.num(k) for k in kinds])


def _status(enc: Encoding, tr: SymTransition, status: int) -> Term:
    return tr.step.status == enc.num(status)


def _mine(enc: Encoding, tr: SymTransition, r: int) -> Term:
    return z3.And(tr.op.kind != enc.num(RESET), tr.op.req == enc.num(r))


def _n(enc: Encoding) -> range:
    return range(enc.bounds.blocks)


def _r(enc: Encoding) -> range:
    return range(enc.bounds.requests)


# -- the goals ------------------------------------------------------------------------------------------


def evict_while_prefix_sharer_runs(enc: Encoding, tr: SymTransition) -> Term:
    b, before, after = enc.bounds, tr.before, tr.after
    out = []
    for t in _n(enc):
        for r in _r(enc):
            for j in range(b.blocks - 1):
                ancestor = z3.Or(
                    *[
                        z3.And(after.tab[r][j] == enc.num(u), after.hashed[u], after.klen[u] == enc.num(j + 1))
                        for u in _n(enc)
                    ]
                )
                out.append(
                    z3.And(
                        tr.step.evicted[t],
                        z3.Not(_mine(enc, tr, r)),
                        after.st[r] == enc.num(RUNNING),
                        enc.num(j) < after.nb[r],
                        before.klen[t] > enc.num(j + 1),
                        before.kbits[t] & enc.mask((j + 1) * b.block_size) == prefix_bits(enc, after, r, j + 1),
                        ancestor,
                    )
                )
    return z3.Or(*out)


def refused_admission_partly_cached(enc: Encoding, tr: SymTransition) -> Term:
    first = tr.op.bits & enc.mask(enc.bounds.block_size)
    cached = z3.Or(*[indexed_at(enc, tr.before, t, 1, first) for t in _n(enc)])
    return z3.And(_kind(enc, tr, ADMIT), _status(enc, tr, REFUSED), tr.op.n > enc.num(enc.bounds.block_size), cached)


def reuse_cached_free_block(enc: Encoding, tr: SymTransition) -> Term:
    before, after = tr.before, tr.after
    reused = [
        z3.And(before.pos[t] >= enc.num(0), before.hashed[t], z3.Not(tr.step.evicted[t]), after.ref[t] > enc.num(0))
        for t in _n(enc)
    ]
    return z3.And(_kind(enc, tr, ADMIT, RESUME), _status(enc, tr, OK), z3.Or(*reused))


def append_across_boundary_full_pool(enc: Encoding, tr: SymTransition) -> Term:
    grew = z3.Or(*[z3.And(_mine(enc, tr, r), tr.after.nb[r] > tr.before.nb[r]) for r in _r(enc)])
    return z3.And(_kind(enc, tr, APPEND), _status(enc, tr, OK), free_count(enc, tr.before) == enc.num(0), grew)


def append_refused_full_pool(enc: Encoding, tr: SymTransition) -> Term:
    return z3.And(_kind(enc, tr, APPEND), _status(enc, tr, REFUSED))


def reset_while_requests_run(enc: Encoding, tr: SymTransition) -> Term:
    running = z3.Or(*[s == enc.num(RUNNING) for s in tr.before.st])
    return z3.And(_kind(enc, tr, RESET), running)


def reset_reclaims_cached_blocks(enc: Encoding, tr: SymTransition) -> Term:
    return z3.And(_kind(enc, tr, RESET), _status(enc, tr, OK), z3.Or(*tr.step.reclaimed))


def preempt_then_resume_with_hit(enc: Encoding, tr: SymTransition) -> Term:
    return z3.And(_kind(enc, tr, RESUME), _status(enc, tr, OK), tr.step.hit_blocks > enc.num(0))


def resume_refused(enc: Encoding, tr: SymTransition) -> Term:
    return z3.And(_kind(enc, tr, RESUME), _status(enc, tr, REFUSED))


def release_reclaims_cached_block(enc: Encoding, tr: SymTransition) -> Term:
    return z3.And(_kind(enc, tr, RELEASE), z3.Not(tr.op.keep), z3.Or(*tr.step.reclaimed))


def release_keeps_prefix_cached(enc: Encoding, tr: SymTransition) -> Term:
    kept = [z3.And(tr.before.ref[t] > enc.num(0), tr.after.ref[t] == enc.num(0), tr.after.hashed[t]) for t in _n(enc)]
    return z3.And(_kind(enc, tr, RELEASE), tr.op.keep, z3.Or(*kept))


def release_preempted_request(enc: Encoding, tr: SymTransition) -> Term:
    preempted = z3.Or(*[z3.And(_mine(enc, tr, r), tr.before.st[r] == enc.num(PREEMPTED)) for r in _r(enc)])
    return z3.And(_kind(enc, tr, RELEASE), preempted)


def hit_cap_leaves_one_block(enc: Encoding, tr: SymTransition) -> Term:
    """The whole prompt is cached full blocks, yet the last one is recomputed."""
    b = enc.bounds
    out = []
    for m in range(1, b.blocks + 1):
        bits = tr.op.bits
        cached = [
            z3.Or(*[indexed_at(enc, tr.before, t, i + 1, bits & enc.mask((i + 1) * b.block_size)) for t in _n(enc)])
            for i in range(m)
        ]
        out.append(z3.And(tr.op.n == enc.num(m * b.block_size), *cached))
    return z3.And(_kind(enc, tr, ADMIT), _status(enc, tr, OK), z3.Or(*out))


def duplicate_full_block_stays_unkeyed(enc: Encoding, tr: SymTransition) -> Term:
    b, after = enc.bounds, tr.after
    out = []
    for r in _r(enc):
        for j in _n(enc):
            bits = prefix_bits(enc, after, r, j + 1)
            for t in _n(enc):
                out.append(
                    z3.And(
                        _mine(enc, tr, r),
                        after.st[r] == enc.num(RUNNING),
                        enc.num(j) < after.nb[r],
                        enc.num((j + 1) * b.block_size) <= after.tlen[r],
                        after.tab[r][j] == enc.num(t),
                        z3.Not(after.hashed[t]),
                        z3.Or(*[indexed_at(enc, after, u, j + 1, bits) for u in _n(enc) if u != t]),
                    )
                )
    return z3.And(_kind(enc, tr, ADMIT, APPEND, RESUME), _status(enc, tr, OK), z3.Or(*out))


def evict_several_blocks_in_one_op(enc: Encoding, tr: SymTransition) -> Term:
    return enc.count(list(tr.step.evicted)) >= enc.num(2)


def evict_child_before_parent(enc: Encoding, tr: SymTransition) -> Term:
    """Reversed free order: a released request's tail leaves the cache while its parent block stays."""
    b, before, after = enc.bounds, tr.before, tr.after
    out = []
    for t in _n(enc):
        for u in _n(enc):
            if u == t:
                continue
            for k in range(2, b.blocks + 1):
                parent = before.kbits[t] & enc.mask((k - 1) * b.block_size)
                out.append(
                    z3.And(
                        tr.step.evicted[t],
                        before.klen[t] == enc.num(k),
                        after.hashed[u],
                        after.ref[u] == enc.num(0),
                        indexed_at(enc, after, u, k - 1, parent),
                    )
                )
    return z3.Or(*out)


def block_shared_by_two_running(enc: Encoding, tr: SymTransition) -> Term:
    shared = [tr.after.ref[t] >= enc.num(2) for t in _n(enc)]
    return z3.And(_kind(enc, tr, ADMIT, RESUME), _status(enc, tr, OK), z3.Or(*shared))


def release_unknown_request(enc: Encoding, tr: SymTransition) -> Term:
    unknown = z3.Or(*[z3.And(_mine(enc, tr, r), tr.before.st[r] == enc.num(0)) for r in _r(enc)])
    return z3.And(_kind(enc, tr, RELEASE), unknown)


def append_to_preempted_request(enc: Encoding, tr: SymTransition) -> Term:
    waiting = z3.Or(*[z3.And(_mine(enc, tr, r), tr.before.st[r] == enc.num(PREEMPTED)) for r in _r(enc)])
    return z3.And(_kind(enc, tr, APPEND), waiting)


GOALS: tuple[Goal, ...] = (
    Goal(
        "evict_while_prefix_sharer_runs",
        "evict a cached block while another running request holds a cached ancestor of its prefix",
        evict_while_prefix_sharer_runs,
    ),
    Goal(
        "refused_admission_partly_cached",
        "an admission is refused although the first block of its prompt is cached",
        refused_admission_partly_cached,
    ),
    Goal("reuse_cached_free_block", "a prefix hit revives a cached block from the free queue", reuse_cached_free_block),
    Goal(
        "append_across_boundary_full_pool",
        "an append crosses a block boundary when no empty block is left (it must evict)",
        append_across_boundary_full_pool,
    ),
    Goal("append_refused_full_pool", "an append is refused: no free or evictable block", append_refused_full_pool),
    Goal("reset_while_requests_run", "reset_cache while a request is running", reset_while_requests_run),
    Goal("reset_reclaims_cached_blocks", "an idle reset_cache reclaims cached blocks", reset_reclaims_cached_blocks),
    Goal(
        "preempt_then_resume_with_hit",
        "a preempted request is resumed and hits its own cached prefix",
        preempt_then_resume_with_hit,
    ),
    Goal("resume_refused", "a preempted request cannot be resumed: the pool is full", resume_refused),
    Goal("release_reclaims_cached_block", "release(keep=False) reclaims a cached block", release_reclaims_cached_block),
    Goal(
        "release_keeps_prefix_cached", "a release leaves a cached block in the free queue", release_keeps_prefix_cached
    ),
    Goal("release_preempted_request", "a preempted request is released without resuming", release_preempted_request),
    Goal(
        "hit_cap_leaves_one_block",
        "a prompt whose full blocks are all cached still computes its last block (hit cap)",
        hit_cap_leaves_one_block,
    ),
    Goal(
        "duplicate_full_block_stays_unkeyed",
        "a new full block whose prefix is already indexed stays unkeyed",
        duplicate_full_block_stays_unkeyed,
    ),
    Goal(
        "evict_several_blocks_in_one_op",
        "one operation evicts two or more cached blocks",
        evict_several_blocks_in_one_op,
    ),
    Goal(
        "evict_child_before_parent",
        "a request's tail block is evicted while its parent block stays cached (reversed free order)",
        evict_child_before_parent,
    ),
    Goal("block_shared_by_two_running", "two running requests share one block", block_shared_by_two_running),
    Goal("release_unknown_request", "release of a request that does not exist (bad input)", release_unknown_request),
    Goal("append_to_preempted_request", "append to a preempted request (bad input)", append_to_preempted_request),
)


@dataclass
class Reached:
    """The shortest op sequence whose last step reaches ``goal`` (None: not within the depth and time)."""

    goal: Goal
    ops: list[Op] | None
    seconds: float
    depth_checked: int


def reach(bounds: Bounds, goal: Goal, depth: int, *, time_limit: float | None = None) -> Reached:
    """Iterative deepening: the first depth at which the goal's formula is satisfiable on the last step."""
    enc = Encoding(bounds)
    t0 = time.monotonic()
    deadline = None if time_limit is None else t0 + time_limit
    solver = _solver(enc, incremental=True)
    path = Path(enc, solver)
    for k in range(depth):
        tr = path.extend()
        solver.push()
        solver.add(goal.formula(enc, tr))
        answer = _check(solver, deadline)
        if answer == z3.sat:
            ops = path.decode(solver.model())
            solver.pop()
            return Reached(goal, ops, time.monotonic() - t0, k + 1)
        solver.pop()
        if answer == z3.unknown:
            return Reached(goal, None, time.monotonic() - t0, k)
    return Reached(goal, None, time.monotonic() - t0, depth)
