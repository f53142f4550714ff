"""Proofs, for all real inputs, of the properties a retention score must have.

The scheduler's eviction order is only sensible if its retention score is
monotone in the right directions (spec.policies.retention_score's docstring):

- more_hits_never_lower: more hits never lower the score;
- more_recent_never_lower: a more recent access (a smaller age) never lowers it;
- larger_size_never_raises: a larger size never raises it.

Each property is a universally quantified formula over the reals; Z3 proves it
by showing that its negation has no model (nonlinear real arithmetic), or
returns a counterexample. The properties are checked for every real value of
the other arguments too (negative ages and capacities below one included: the
score clamps them), not on examples.

A score is given as a function of Z3 real terms (``ScoreFormula``). The spec's
score is transcribed term for term in ``spec_score``; tests/ check that the
transcription agrees with ``retention_score`` and with the scheduler
simulator's own ``score`` on many concrete inputs, so the proof is about the
code that runs. What is proved is a property of the real-valued formula;
IEEE rounding of each operation is monotone, so the float implementation keeps
the weak (never lower / never raise) form of each property.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

import z3

from .symbolic import Term

ScoreFormula = Callable[[Term, Term, Term, Term], Term]
"""score(hits, size, age, capacity) over Z3 reals."""


def _max(a: Term, b: Term) -> Term:
    return z3.If(a >= b, a, b)


def spec_score(hits: Term, size: Term, age: Term, capacity: Term) -> Term:
    """spec.policies.retention_score: hits + 0.5 / (1 + max(age, 0)) - 0.25 * size / max(capacity, 1)."""
    recency = z3.RealVal(1) / (1 + _max(age, z3.RealVal(0)))
    return hits + z3.RealVal("1/2") * recency - z3.RealVal("1/4") * (size / _max(capacity, z3.RealVal(1)))


@dataclass(frozen=True)
class ScoreProperty:
    name: str
    description: str


PROPERTIES: tuple[ScoreProperty, ...] = (
    ScoreProperty("more_hits_never_lower", "hits1 <= hits2 implies score(hits1, ...) <= score(hits2, ...)"),
    ScoreProperty("more_recent_never_lower", "age1 <= age2 implies score(.., age1, ..) >= score(.., age2, ..)"),
    ScoreProperty("larger_size_never_raises", "size1 <= size2 implies score(.., size1, ..) >= score(.., size2, ..)"),
)


@dataclass
class PropertyResult:
    """``proved``: the negation is unsatisfiable; else ``counterexample`` (argument -> value) or unknown."""

    prop: str
    proved: bool
    seconds: float
    counterexample: dict[str, float] = field(default_factory=dict)
    unknown: bool = False


def _negation(prop: str, score: ScoreFormula) -> tuple[Term, dict[str, Term]]:
    h1, h2, s1, s2, a1, a2, cap = z3.Reals("hits1 hits2 size1 size2 age1 age2 capacity")
    args = {"hits1": h1, "hits2": h2, "size1": s1, "size2": s2, "age1": a1, "age2": a2, "capacity": cap}
    if prop == "more_hits_never_lower":
        return z3.And(h1 <= h2, score(h1, s1, a1, cap) > score(h2, s1, a1, cap)), args
    if prop == "more_recent_never_lower":
        return z3.And(a1 <= a2, score(h1, s1, a1, cap) < score(h1, s1, a2, cap)), args
    if prop == "larger_size_never_raises":
        return z3.And(s1 <= s2, score(h1, s1, a1, cap) < score(h1, s2, a1, cap)), args
    raise ValueError(f"unknown score property {prop!r}")


def _real(value: Term) -> float:
    if z3.is_rational_value(value):
        return float(Fraction(value.numerator_as_long(), value.denominator_as_long()))
    if z3.is_algebraic_value(value):
        return float(value.approx(20).as_fraction())
    return 0.0


def check_property(prop: str, score: ScoreFormula, *, timeout_s: float = 30.0) -> PropertyResult:
    """Prove ``prop`` of ``score`` for all reals, or find a counterexample."""
    negation, args = _negation(prop, score)
    solver = z3.SolverFor("QF_NRA")
    solver.set("timeout", int(timeout_s * 1000))
    solver.add(negation)
    t0 = time.monotonic()
    answer = solver.check()
    seconds = time.monotonic() - t0
    if answer == z3.unsat:
        return PropertyResult(prop, True, seconds)
    if answer == z3.sat:
        model = solver.model()
        values = {name: _real(model.eval(term, model_completion=True)) for name, term in args.items()}
        return PropertyResult(prop, False, seconds, values)
    return PropertyResult(prop, False, seconds, unknown=True)


def check_score(score: ScoreFormula, *, timeout_s: float = 30.0) -> list[PropertyResult]:
    """Every property of PROPERTIES for one score."""
    return [check_property(p.name, score, timeout_s=timeout_s) for p in PROPERTIES]


# -- scores that break a property: the proofs must say so ---------------------------------------------


def size_bonus_score(hits: Term, size: Term, age: Term, capacity: Term) -> Term:
    """Rewards big entries (the sign of the size term flipped)."""
    recency = z3.RealVal(1) / (1 + _max(age, z3.RealVal(0)))
    return hits + z3.RealVal("1/2") * recency + z3.RealVal("1/4") * (size / _max(capacity, z3.RealVal(1)))


def stale_bonus_score(hits: Term, size: Term, age: Term, capacity: Term) -> Term:
    """Uses the age where the recency belongs: older entries score higher."""
    return (
        hits + z3.RealVal("1/2") * _max(age, z3.RealVal(0)) - z3.RealVal("1/4") * (size / _max(capacity, z3.RealVal(1)))
    )


def reuse_times_headroom_score(hits: Term, size: Term, age: Term, capacity: Term) -> Term:
    """Weighs reuse by (1 - size): past one unit of size, more hits lower the score."""
    recency = z3.RealVal(1) / (1 + _max(age, z3.RealVal(0)))
    return hits * (z3.RealVal(1) - size) + z3.RealVal("1/2") * recency


BROKEN_SCORES: dict[str, tuple[ScoreFormula, str]] = {
    "size-bonus": (size_bonus_score, "larger_size_never_raises"),
    "stale-bonus": (stale_bonus_score, "more_recent_never_lower"),
    "reuse-times-headroom": (reuse_times_headroom_score, "more_hits_never_lower"),
}
"""Scores with a seeded mistake, and the property each must be caught breaking."""
