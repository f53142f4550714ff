"""Unbounded proofs of the safety invariants with Z3's Spacer engine (PDR/IC3 over constrained Horn clauses).

The bounded pool's transition relation (``spec.formal.symbolic.Encoding``) as three Horn clauses
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

Unlike k-induction (spec.formal.bmc.prove), nothing is assumed: no auxiliary invariant is
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection

import z3

from .bmc import Counterexample, Lemmas, auxiliary_conjuncts, bmc, inductive_lemmas
from .symbolic import Bounds, Encoding, SymTransition, Term
from .symbolic_invariants import SAFETY

DIRECTIONS = ("forward", "backward")


@dataclass
class PdrProof:
    """One invariant's result: ``verdict`` proved, violated or unknown (with ``note``: why).

    ``seconds``: Spacer's, and the independent check's for a proof (the BMC's decoding of a
    violation not included).

    ``inductive``: the invariant Spacer found, over the state's variables (proved only);
    ``checked``: the three validity queries confirmed it (initial, inductive, implies P);
    ``timed_out``: unknown because the child running the query was killed at the time limit;
    ``assumed``: how many auxiliary conjuncts (proved inductive first) Spacer was given.
    """

    invariant: str
    verdict: str
    seconds: float
    inductive: Term | None = None
    checked: bool = False
    counterexample: Counterexample | None = None
    note: str = ""
    timed_out: bool = False
    assumed: int = 0

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
    options: Mapping[str, bool | int | str] | None = None,
    lemmas: bool = False,
    direction: str = "forward",
    progress: Callable[[PdrProof], None] | None = None,
) -> list[PdrProof]:
    """Each selected safety invariant proved for every depth of the bounded pool by Spacer, or refuted, or unknown.

    ``time_limit``: wall-clock seconds Spacer may spend on each invariant, building the
    query included; the child running it is killed then (the independent check of a
    proof and the BMC's decoding of a violation run after it, in this process).
    ``options``: Z3 Fixedpoint parameters set on each query (e.g. ``{"spacer.ground_pobs": False}``).
    ``lemmas``: first find the auxiliary conjuncts that are inductive (``spec.formal.bmc.inductive_lemmas``,
    plain Z3 queries, within ``time_limit``) and give them to Spacer as facts of every
    state it reasons about; a proof's inductive invariant is then the lemmas and Spacer's
    invariant together, and the independent check proves all of it again.
    ``direction``: ``forward`` (Spacer's ``Inv`` of the reachable states) or ``backward``
    (its over-approximation of the states from which a violation is reachable; Spacer then
    searches forward from the empty pool and refutes faster): see :class:`Query`.
    """
    names = list(SAFETY) if invariants is None else list(invariants)
    unknown = [n for n in names if n not in SAFETY]
    if unknown:
        raise ValueError(f"unknown invariant(s) {unknown}; known: {', '.join(SAFETY)}")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {', '.join(DIRECTIONS)}, not {direction!r}")
    if not time_limit > 0:
        raise ValueError(f"the time limit must be a positive number of seconds, not {time_limit}")
    enc = (variant or Encoding)(replace(bounds, arith="int"))
    assumed = _lemmas(enc, variant or Encoding, time.monotonic() + max(60.0, time_limit)) if lemmas else None
    out = []
    for name in names:
        proof = _prove_in_child(Query(enc, name, direction, dict(options or {}), assumed), time_limit)
        proof.assumed = 0 if assumed is None else len(assumed.conjuncts)
        if proof.verdict == "violated":
            found = bmc(bounds, 12, variant=variant, invariants=[name], time_limit=max(time_limit, 60.0))
            proof.counterexample = found.counterexample
            if found.counterexample is None:
                proof.note = "Spacer derived a violation; BMC found none within depth 12 (not decoded)"
        if progress is not None:
            progress(proof)
        out.append(proof)
    return out


@dataclass(frozen=True)
class Query:
    """One invariant's Horn clauses for Spacer, on ``enc``, in one ``direction``.

    ``forward``: ``Inv`` holds of the empty pool and is closed under steps; query: a state
    of ``Inv`` with a step breaking P. ``backward``: ``Bad`` holds of each state with a
    step breaking P and is closed under predecessors; query: the empty pool is in
    ``Bad``. Spacer works from the query back, so backward it searches forward from the
    empty pool, where every state on the way is concrete (it finds bugs faster); a
    backward proof's ``Bad`` excludes the empty pool, and its complement is then an
    inductive invariant implying P. ``assumed``: lemmas true in every reachable state,
    added to every step's body (restricting steps to such states leaves what is
    reachable, and what can reach a violation from a reachable state, as it is).
    ``options``: Z3 Fixedpoint parameters.
    """

    enc: Encoding
    invariant: str
    direction: str = "forward"
    options: Mapping[str, bool | int | str] = field(default_factory=dict)
    assumed: Lemmas | None = None

    def solve(self) -> dict[str, str]:
        """Spacer's verdict, a note, and (proved) the inductive invariant as SMT-LIB text."""
        enc, name, direction, assumed = self.enc, self.invariant, self.direction, self.assumed
        s, op = enc.state("s"), enc.op("o")
        terms = s.terms()
        step = enc.step(s, op)
        after = step.after.terms()
        domain = z3.And(enc.op_domain(op), *([] if assumed is None else [assumed.on(s)]))
        broken = z3.Not(SAFETY[name](enc, SymTransition(s, op, step)))
        fp = z3.Fixedpoint()
        fp.set(engine="spacer")
        for key, value in self.options.items():
            fp.set(key, value)
        fp.declare_var(*terms, *op.terms())
        relation = z3.Function(f"{direction}_{name}", *[t.sort() for t in terms], z3.BoolSort())
        fp.register_relation(relation)
        if direction == "forward":
            fp.rule(relation(*enc.initial().terms()))
            fp.rule(relation(*after), [relation(*terms), domain])
            answer = fp.query(z3.And(relation(*terms), domain, broken))
        else:
            fp.rule(relation(*terms), [domain, broken])
            fp.rule(relation(*terms), [domain, relation(*after)])
            answer = fp.query(relation(*enc.initial().terms()))
        if answer == z3.sat:
            return {"verdict": "violated", "note": ""}
        if answer != z3.unsat:
            return {"verdict": "unknown", "note": f"Spacer: {fp.reason_unknown()}"}
        cover = z3.substitute_vars(fp.get_cover_delta(-1, relation), *terms)  # the lemmas at the fixpoint
        if direction == "forward":
            inductive = cover
        else:  # a Bad that Z3 removed while simplifying (no step breaks P) has no lemmas: its cover reads true
            inductive = z3.Not(_interpretation(fp.get_answer(), relation, terms) if z3.is_true(cover) else cover)
        return {"verdict": "proved", "note": "", "inductive": inductive.sexpr()}


def _lemmas(enc: Encoding, kind: type[Encoding], deadline: float) -> Lemmas:
    """The auxiliary conjuncts inductive on ``enc`` (integer counters), found by Houdini on bit-vector counters.

    Houdini on bit-vectors bit-blasts each query and is about five times faster (N=3, R=2:
    6 s, 35 s on integers); the conjuncts it keeps are taken, by position, from the same
    candidates built on ``enc``. Nothing rests on the two agreeing: every proof that uses them
    is checked again, lemmas included, on ``enc`` (:func:`check_inductive`).
    """
    bv = kind(replace(enc.bounds, arith="bv"))
    found = inductive_lemmas(bv, deadline)
    on_bv, on_int = auxiliary_conjuncts(bv, found.template), auxiliary_conjuncts(enc, enc.state("lemma"))
    if len(on_bv) != len(on_int):  # not the same candidates: Houdini on the integers themselves
        return inductive_lemmas(enc, deadline)
    kept = {c.get_id() for c in found.conjuncts}
    chosen = [i for i, c in enumerate(on_bv) if c.get_id() in kept]
    return Lemmas(enc.state("lemma"), [on_int[i] for i in chosen], len(on_int) - len(chosen), found.seconds)


def _prove_in_child(query: Query, time_limit: float) -> PdrProof:
    """Spacer's verdict on ``query`` from a child forked for it, killed after ``time_limit`` s of wall clock.

    A proof's inductive invariant comes back as SMT-LIB text and is checked here, on what
    crossed the pipe, by :func:`check_inductive`.
    """
    t0, enc, name = time.monotonic(), query.enc, query.invariant
    ctx = multiprocessing.get_context("fork")  # the encoding (and a variant class defined anywhere) is inherited
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_answer, args=(query, send), daemon=True, name=f"kvspec-spacer-{name}")
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
    s = enc.state("s")
    inductive = _parse(answer["inductive"], s.terms())
    if query.assumed is not None:
        inductive = z3.And(query.assumed.on(s), inductive)
    checked = check_inductive(enc, SAFETY[name], inductive)
    note = "" if checked else "the invariant Spacer returned failed the independent check"
    return PdrProof(name, "proved", time.monotonic() - t0, inductive, checked, note=note)


def _answer(query: Query, send: Connection) -> None:
    """In the child: Spacer's answer to ``query`` as one JSON message (a plain-data dict)."""
    with contextlib.suppress(Exception):  # die with the parent (Linux), so a killed kit leaves no solver running
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    try:
        answer = query.solve()
    except Exception as exc:  # anything Z3 raises is Spacer's failure to answer, not the kit's
        answer = {"verdict": "unknown", "note": f"Spacer failed: {exc}"}
    send.send_bytes(json.dumps(answer).encode())
    send.close()


def _interpretation(answer: Term, relation: z3.FuncDeclRef, terms: Sequence[Term]) -> Term:
    """The formula Spacer's solution ``answer`` gives ``relation``, over ``terms`` (its arguments in order).

    The solution is ``ForAll(xs, relation(xs) == phi)`` (a conjunction of those, one per
    relation). Where Spacer searched, its lemmas at the fixpoint (``get_cover_delta``) are
    the compact form; a relation Z3 removed while simplifying the clauses has no lemmas (its
    cover reads ``true``) and only the answer says what it is (``false``).
    """
    parts = answer.children() if z3.is_and(answer) else [answer]
    for part in parts:
        body = part.body() if z3.is_quantifier(part) else part
        if z3.is_eq(body) and z3.is_app_of(body.arg(0), relation.kind()) and body.arg(0).decl() == relation:
            head, phi = body.arg(0), body.arg(1)
        elif z3.is_app(body) and body.decl() == relation:  # relation(xs) is true everywhere
            head, phi = body, z3.BoolVal(True)
        elif z3.is_not(body) and body.arg(0).decl() == relation:  # relation is empty
            head, phi = body.arg(0), z3.BoolVal(False)
        else:
            continue
        by_index: dict[int, Term] = {z3.get_var_index(a): t for a, t in zip(head.children(), terms, strict=True)}
        return z3.substitute_vars(phi, *[by_index[i] for i in range(len(by_index))])
    raise ValueError(f"Spacer's answer gives no interpretation of {relation.name()}: {answer}")


def _parse(text: str, terms: Sequence[Term]) -> Term:
    """The SMT-LIB term ``text`` over the state variables ``terms`` (by name), as a Z3 term of this process."""
    decls = {t.decl().name(): t.decl() for t in terms}
    (term,) = z3.parse_smt2_string(f"(assert {text})", decls=decls)
    return term


__all__ = ["DIRECTIONS", "PdrProof", "Query", "check_inductive", "prove_pdr"]
