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

The time limit is a hard wall-clock stop. Spacer's own ``timeout`` is a cancellation
it checks only now and then (a 60 s limit returned after 78 s, a 30 s one ran 9.5
minutes), so each invariant's query runs in a child process forked for it, which is
killed at the limit: that invariant is then unknown, with ``timed_out`` set. What the
child answers crosses the pipe as JSON (the verdict, and the inductive invariant as
SMT-LIB text, parsed again over the parent's variables); nothing is unpickled.

Unlike k-induction (spec.bmc.prove), nothing is assumed: no auxiliary invariant is
given to Spacer, it must find what makes P inductive on its own. The encoding's
counters are mathematical integers here (``Bounds(arith="int")``; Spacer's
arithmetic is linear integer arithmetic, its bit-vector support is weak); token
strings stay bit-vectors.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import multiprocessing
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection

import z3

from .bmc import Counterexample, bmc
from .symbolic import Bounds, Encoding, SymTransition, Term
from .symbolic_invariants import SAFETY


@dataclass
class PdrProof:
    """One invariant's result: ``verdict`` proved, violated or unknown (with ``note``: why).

    ``inductive``: the invariant Spacer found, over the state's variables (proved only);
    ``checked``: the three validity queries confirmed it (initial, inductive, implies P);
    ``timed_out``: unknown because the child running the query was killed at the time limit.
    """

    invariant: str
    verdict: str
    seconds: float
    inductive: Term | None = None
    checked: bool = False
    counterexample: Counterexample | None = None
    note: str = ""
    timed_out: bool = False

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

    ``time_limit``: wall-clock seconds Spacer may spend on each invariant, building the
    query included; the child running it is killed then (the independent check of a
    proof and the BMC's decoding of a violation run after it, in this process).
    """
    names = list(SAFETY) if invariants is None else list(invariants)
    unknown = [n for n in names if n not in SAFETY]
    if unknown:
        raise ValueError(f"unknown invariant(s) {unknown}; known: {', '.join(SAFETY)}")
    if not time_limit > 0:
        raise ValueError(f"the time limit must be a positive number of seconds, not {time_limit}")
    enc = (variant or Encoding)(replace(bounds, arith="int"))
    out = []
    for name in names:
        proof = _prove_in_child(enc, name, time_limit)
        if proof.verdict == "violated":
            found = bmc(bounds, 12, variant=variant, invariants=[name], time_limit=max(time_limit, 60.0))
            proof.counterexample = found.counterexample
            if found.counterexample is None:
                proof.note = "Spacer derived a violation; BMC found none within depth 12 (not decoded)"
        if progress is not None:
            progress(proof)
        out.append(proof)
    return out


def _prove_in_child(enc: Encoding, name: str, time_limit: float) -> PdrProof:
    """Spacer's verdict on ``name`` from a child forked for it, killed after ``time_limit`` s of wall clock.

    A proof's inductive invariant comes back as SMT-LIB text and is checked here, on what
    crossed the pipe, by :func:`check_inductive`.
    """
    t0 = time.monotonic()
    ctx = multiprocessing.get_context("fork")  # the encoding (and a variant class defined anywhere) is inherited
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_answer, args=(enc, name, send), daemon=True, name=f"kvspec-spacer-{name}")
    child.start()
    send.close()
    raw: bytes | None = None
    try:
        answered = receive.poll(time_limit)  # also true when the child died: then there is nothing to read
        if answered:
            with contextlib.suppress(EOFError):
                raw = receive.recv_bytes()
    finally:
        if child.is_alive():
            child.kill()
        child.join()
        receive.close()
    seconds = time.monotonic() - t0
    if not answered:
        note = f"time limit: Spacer had no answer within {time_limit:g} s (its process was stopped)"
        return PdrProof(name, "unknown", seconds, note=note, timed_out=True)
    if raw is None:
        return PdrProof(name, "unknown", seconds, note=f"the process running Spacer died (exit {child.exitcode})")
    answer = json.loads(raw)
    if answer["verdict"] != "proved":
        return PdrProof(name, answer["verdict"], seconds, note=answer["note"])
    terms = enc.state("s").terms()
    inductive = _parse(answer["inductive"], terms)
    checked = check_inductive(enc, SAFETY[name], inductive)
    note = "" if checked else "the invariant Spacer returned failed the independent check"
    return PdrProof(name, "proved", seconds, inductive, checked, note=note)


def _answer(enc: Encoding, name: str, send: Connection) -> None:
    """In the child: Spacer's answer on ``name`` as one JSON message (a plain-data dict)."""
    with contextlib.suppress(Exception):  # die with the parent (Linux), so a killed kit leaves no solver running
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    try:
        answer = _query(enc, name)
    except Exception as exc:  # anything Z3 raises is Spacer's failure to answer, not the kit's
        answer = {"verdict": "unknown", "note": f"Spacer failed: {exc}"}
    send.send_bytes(json.dumps(answer).encode())
    send.close()


def _query(enc: Encoding, name: str) -> dict[str, str]:
    """Spacer on the three Horn clauses of ``name``: verdict, note, and (proved) the inductive invariant as SMT-LIB."""
    s, op = enc.state("s"), enc.op("o")
    step = enc.step(s, op)
    terms = s.terms()
    relation = z3.Function(f"Inv_{name}", *[t.sort() for t in terms], z3.BoolSort())
    fp = z3.Fixedpoint()
    fp.set(engine="spacer")
    fp.register_relation(relation)
    fp.declare_var(*terms, *op.terms())
    domain = enc.op_domain(op)
    fp.rule(relation(*enc.initial().terms()))
    fp.rule(relation(*step.after.terms()), [relation(*terms), domain])
    bad = z3.And(relation(*terms), domain, z3.Not(SAFETY[name](enc, SymTransition(s, op, step))))
    answer = fp.query(bad)
    if answer == z3.sat:
        return {"verdict": "violated", "note": ""}
    if answer != z3.unsat:
        return {"verdict": "unknown", "note": f"Spacer: {fp.reason_unknown()}"}
    cover = fp.get_cover_delta(-1, relation)
    return {"verdict": "proved", "note": "", "inductive": z3.substitute_vars(cover, *terms).sexpr()}


def _parse(text: str, terms: Sequence[Term]) -> Term:
    """The SMT-LIB term ``text`` over the state variables ``terms`` (by name), as a Z3 term of this process."""
    decls = {t.decl().name(): t.decl() for t in terms}
    (term,) = z3.parse_smt2_string(f"(assert {text})", decls=decls)
    return term


__all__ = ["PdrProof", "check_inductive", "prove_pdr"]
