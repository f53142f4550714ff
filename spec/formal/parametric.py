"""Capacity conservation for every pool size: the counting abstraction of the block spec.

The bounded encoding (spec.formal.symbolic) proves the invariants for one N at a time.
For every N at once, the pool is abstracted to three counts over a symbolic
capacity N: ``empty`` (queued blocks without a key), ``cached`` (queued blocks
with a key) and ``used`` (referenced blocks). Each operation of the spec moves
blocks between the counts:

- an admission or an append moves blocks from the queue (empty or cached, the
  hits it revives and the blocks it pops) into use; nothing else changes;
- a release or a preemption moves blocks from use back to the queue (kept
  cached or emptied);
- an idle reset moves every cached block to the empty part;
- anything else (a refusal, bad input) changes nothing.

``prove_every_n`` proves with Z3, for a symbolic N >= 1 and symbolic counts,
that ``empty + cached + used == N`` with all three non-negative holds initially
and is preserved by every abstract step (an inductive invariant, so it holds
after any number of operations on a pool of any size). This part is easy by
design: the abstraction only moves blocks. ``check_refinement`` closes the gap for the
bounded encodings: for one N it proves that every concrete step from a
reachable (auxiliary) state is an abstract step. The link is proved per N, not
for every N; the ∀N claim is about the abstraction.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import z3

from .bmc import Path, _check, _solver
from .symbolic import Bounds, Encoding, SymState, Term
from .symbolic_invariants import auxiliary


@dataclass(frozen=True)
class Counts:
    empty: Term
    cached: Term
    used: Term


def _abstract_step(a: Counts, b: Counts) -> Term:
    """b is an abstract successor of a: blocks move from the queue into use, from use back to the queue,
    from the cached part to the empty part on an idle reset, or nothing changes."""
    de, dc, du = b.empty - a.empty, b.cached - a.cached, b.used - a.used
    allocate = z3.And(de <= 0, dc <= 0, du == -(de + dc))
    free = z3.And(de >= 0, dc >= 0, du == -(de + dc))
    reset = z3.And(a.used == 0, b.used == 0, b.cached == 0, b.empty == a.empty + a.cached)
    return z3.Or(allocate, free, reset)


def conserved(n: Term, c: Counts) -> Term:
    return z3.And(c.empty >= 0, c.cached >= 0, c.used >= 0, c.empty + c.cached + c.used == n)


@dataclass
class EveryNProof:
    """The counting abstraction conserves capacity for every N (initially and across any step)."""

    initial: bool
    inductive: bool
    seconds: float

    @property
    def proved(self) -> bool:
        return self.initial and self.inductive


def prove_every_n() -> EveryNProof:
    """Conservation of the counting abstraction, for a symbolic pool size N >= 1."""
    t0 = time.monotonic()
    n = z3.Int("N")
    init = Counts(n, z3.IntVal(0), z3.IntVal(0))
    s = z3.Solver()
    s.add(n >= 1, z3.Not(conserved(n, init)))
    initial = s.check() == z3.unsat
    a = Counts(*z3.Ints("empty cached used"))
    b = Counts(*z3.Ints("empty2 cached2 used2"))
    s = z3.Solver()
    nonneg = z3.And(b.empty >= 0, b.cached >= 0, b.used >= 0)
    s.add(n >= 1, conserved(n, a), _abstract_step(a, b), nonneg, z3.Not(conserved(n, b)))
    inductive = s.check() == z3.unsat
    return EveryNProof(initial, inductive, time.monotonic() - t0)


def counts_of(enc: Encoding, s: SymState) -> Counts:
    """The abstraction function: queued-unkeyed, queued-keyed and referenced slots (encoding counters)."""
    n_ = range(enc.bounds.blocks)
    zero = enc.num(0)
    return Counts(
        enc.count([z3.And(s.pos[t] >= zero, z3.Not(s.hashed[t])) for t in n_]),
        enc.count([z3.And(s.pos[t] >= zero, s.hashed[t]) for t in n_]),
        enc.count([s.ref[t] != zero for t in n_]),
    )


@dataclass
class Refinement:
    """Every concrete step of the bounded encoding from an auxiliary state is an abstract step."""

    bounds: Bounds
    holds: bool
    seconds: float
    answer: str


def check_refinement(
    bounds: Bounds, time_limit: float | None = None, *, variant: type[Encoding] | None = None
) -> Refinement:
    """Aux(s) and T(s, op, s') imply that counts(s') is an abstract successor of counts(s)."""
    t0 = time.monotonic()
    deadline = None if time_limit is None else t0 + time_limit
    enc = (variant or Encoding)(bounds)
    solver = _solver(enc, incremental=False)
    path = Path(enc, solver, enc.state("ref0"), tag="ref_")
    solver.add(auxiliary(enc, path.states[0]))
    tr = path.extend()
    solver.add(z3.Not(_abstract_step(counts_of(enc, tr.before), counts_of(enc, tr.after))))
    answer = _check(solver, deadline)
    return Refinement(bounds, answer == z3.unsat, time.monotonic() - t0, str(answer))
