"""Unbounded proofs of the safety invariants with Z3's Spacer engine (PDR/IC3 over constrained Horn clauses).

The bounded pool's transition relation (``spec.symbolic.Encoding``) as three Horn clauses
over one unknown relation ``Inv`` on the state's variables:

    Inv(initial)
    Inv(s) and op in the alphabet                       =>  Inv(step(s, op))
    Inv(s) and op in the alphabet and not P(s, op, step) =>  false

Spacer either finds an interpretation of ``Inv`` that satisfies all three (the
invariant P holds after every op sequence of any length: an inductive invariant that
implies it, which ``prove_pdr`` prints and checks again by three plain validity
queries, independent of Spacer), or a derivation of ``false`` (a reachable violation:
the shortest op sequence is then found by BMC and returned as the counterexample), or
gives up within its time limit (unknown, never read as proved).

Unlike k-induction (spec.bmc.prove), nothing is assumed: no auxiliary invariant is
given to Spacer, it must find what makes P inductive on its own. The encoding's
counters are mathematical integers here (``Bounds(arith="int")``; Spacer's
arithmetic is linear integer arithmetic, its bit-vector support is weak); token
strings stay bit-vectors.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import z3

from .bmc import Counterexample, bmc
from .symbolic import Bounds, Encoding, SymTransition, Term
from .symbolic_invariants import SAFETY


@dataclass
class PdrProof:
    """One invariant's result: ``verdict`` proved, violated or unknown (with ``note``: why).

    ``inductive``: the invariant Spacer found, over the state's variables (proved only);
    ``checked``: the three validity queries confirmed it (initial, inductive, implies P).
    """

    invariant: str
    verdict: str
    seconds: float
    inductive: Term | None = None
    checked: bool = False
    counterexample: Counterexample | None = None
    note: str = ""

    @property
    def proved(self) -> bool:
        return self.verdict == "proved" and self.checked


def _valid(claim: Term, timeout_ms: int) -> bool:
    """``claim`` holds for every value of its variables (a plain solver, not Spacer)."""
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    solver.add(z3.Not(claim))
    return bool(solver.check() == z3.unsat)


def check_inductive(enc: Encoding, invariant: Callable[[Encoding, SymTransition], Term], inv: Term) -> bool:
    """``inv`` (over ``enc.state("s")``) holds initially, is kept by every step, and implies ``invariant``."""
    s, op = enc.state("s"), enc.op("o")
    step = enc.step(s, op)
    pairs = list(zip(s.terms(), step.after.terms(), strict=True))
    init = list(zip(s.terms(), enc.initial().terms(), strict=True))
    domain = enc.op_domain(op)
    tr = SymTransition(s, op, step)
    return (
        _valid(z3.substitute(inv, *init), 60_000)
        and _valid(z3.Implies(z3.And(inv, domain), z3.substitute(inv, *pairs)), 300_000)
        and _valid(z3.Implies(z3.And(inv, domain), invariant(enc, tr)), 300_000)
    )


def prove_pdr(
    bounds: Bounds,
    invariants: Sequence[str] | None = None,
    *,
    variant: type[Encoding] | None = None,
    time_limit: float = 60.0,
    progress: Callable[[PdrProof], None] | None = None,
) -> list[PdrProof]:
    """Each selected safety invariant proved for every depth of the bounded pool by Spacer, or refuted, or unknown.

    ``time_limit``: seconds Spacer may spend on each invariant.
    """
    names = list(SAFETY) if invariants is None else list(invariants)
    unknown = [n for n in names if n not in SAFETY]
    if unknown:
        raise ValueError(f"unknown invariant(s) {unknown}; known: {', '.join(SAFETY)}")
    enc = (variant or Encoding)(replace(bounds, arith="int"))
    out = []
    for name in names:
        proof = _prove_one(enc, name, time_limit)
        if proof.verdict == "violated":
            found = bmc(bounds, 12, variant=variant, invariants=[name], time_limit=max(time_limit, 60.0))
            proof.counterexample = found.counterexample
            if found.counterexample is None:
                proof.note = "Spacer derived a violation; BMC found none within depth 12 (not decoded)"
        if progress is not None:
            progress(proof)
        out.append(proof)
    return out


def _prove_one(enc: Encoding, name: str, time_limit: float) -> PdrProof:
    t0 = time.monotonic()
    s, op = enc.state("s"), enc.op("o")
    step = enc.step(s, op)
    terms = s.terms()
    relation = z3.Function(f"Inv_{name}", *[t.sort() for t in terms], z3.BoolSort())
    fp = z3.Fixedpoint()
    fp.set(engine="spacer")
    fp.set("timeout", max(1, int(time_limit * 1000)))
    fp.register_relation(relation)
    fp.declare_var(*terms, *op.terms())
    domain = enc.op_domain(op)
    fp.rule(relation(*enc.initial().terms()))
    fp.rule(relation(*step.after.terms()), [relation(*terms), domain])
    bad = z3.And(relation(*terms), domain, z3.Not(SAFETY[name](enc, SymTransition(s, op, step))))
    try:
        answer = fp.query(bad)
    except z3.Z3Exception as exc:  # Spacer's time limit cancels the query
        return PdrProof(name, "unknown", time.monotonic() - t0, note=f"Spacer gave up: {exc}")
    if answer == z3.sat:
        return PdrProof(name, "violated", time.monotonic() - t0)
    if answer != z3.unsat:
        return PdrProof(name, "unknown", time.monotonic() - t0, note=f"Spacer: {fp.reason_unknown()}")
    cover = fp.get_cover_delta(-1, relation)
    inductive = z3.substitute_vars(cover, *terms)
    spent = time.monotonic() - t0
    checked = check_inductive(enc, SAFETY[name], inductive)
    note = "" if checked else "the invariant Spacer returned failed the independent check"
    return PdrProof(name, "proved", spent, inductive, checked, note=note)


__all__ = ["PdrProof", "check_inductive", "prove_pdr"]
