"""Bounded model checking and k-induction over the Z3 encoding of the block spec.

``bmc`` unrolls the transition relation from the empty pool one operation at a
time and asks Z3, at each depth k, for an op sequence of length k whose last
step breaks an invariant. Every shorter depth was checked first, so the first
counterexample found is a shortest one. "Holds up to K" means: no sequence of
at most K operations of the bounded model (every op kind, every request, every
prompt and append within the bounds, bad input included) breaks a selected
invariant.

``prove`` proves invariants for every depth of the bounded model by
k-induction. An invariant P (a property of one step) is k-inductive when it
holds on the first k steps from the empty pool (base) and, from any state
whatever, k - 1 steps on which P held are followed by a step on which it holds
(step; k = 1: P holds after every step from every state). Few invariants are
inductive alone; each is 1-inductive relative to the auxiliary invariants of
spec.formal.symbolic_invariants, which are first proved jointly 1-inductive.

``inductive_lemmas`` finds, for the spec's encoding or any variant of it,
the largest subset of the auxiliary conjuncts that is inductive for
that variant (Houdini); BMC may assume them on every state without excluding a
single reachable one, which lets it go deeper.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import z3

from kvspec import stop

from ..ops import Op
from .symbolic import OP_KINDS, RESET, Bounds, Encoding, SymOp, SymState, SymTransition, Term
from .symbolic_invariants import AUXILIARY, SAFETY, auxiliary


def _solver(enc: Encoding, *, incremental: bool) -> z3.Solver:
    """An incremental solver for paths that grow, a bit-blasting one for one-shot queries."""
    if enc.bounds.arith != "bv":
        return z3.Solver()
    if incremental:
        return z3.SolverFor("QF_BV")
    return z3.Then("simplify", "propagate-values", "solve-eqs", "bit-blast", "sat").solver()


def _remaining_ms(deadline: float | None) -> int:
    return 0 if deadline is None else max(1, int((deadline - time.monotonic()) * 1000))


INTERRUPTED = ("interrupted from keyboard", "canceled")
"""Z3's reasons for an unknown answer that mean it was interrupted (its own SIGINT handler, or
``Context.interrupt`` from kvspec.cli.common's watch of signals), not out of time."""


def _check(solver: z3.Solver, deadline: float | None) -> z3.CheckSatResult:
    if deadline is not None:
        solver.set("timeout", _remaining_ms(deadline))
    answer: z3.CheckSatResult = solver.check()
    if answer == z3.unknown and solver.reason_unknown() in INTERRUPTED:
        raise KeyboardInterrupt  # Z3 took the SIGINT itself (or the kit interrupted it): a stop, not a timeout
    return answer


def _names(invariants: Sequence[str] | None) -> list[str]:
    names = list(SAFETY) if invariants is None else list(invariants)
    unknown = [n for n in names if n not in SAFETY]
    if unknown:
        raise ValueError(f"unknown invariant(s) {unknown}; known: {', '.join(SAFETY)}")
    return names


def op_cases(enc: Encoding, op: SymOp) -> list[Term]:
    """One constraint per (op kind, request): a one-step query split this way is exhaustive, and each
    part lets the simplifier drop every branch of the step but one."""
    out = []
    for kind in range(len(OP_KINDS)):
        for r in range(1 if kind == RESET else enc.bounds.requests):
            out.append(z3.And(op.kind == enc.num(kind), op.req == enc.num(r)))
    return out


def _one_step(
    enc: Encoding,
    assume: Callable[[SymState], Term] | None,
    goal: Callable[[SymTransition], Term],
    deadline: float | None,
) -> tuple[z3.CheckSatResult, z3.ModelRef | None, SymTransition | None]:
    """Is there a state (satisfying ``assume``) and a step from it where ``goal`` is false? Split by op case."""
    for case in op_cases(enc, enc.op("probe")):
        solver = _solver(enc, incremental=False)
        path = Path(enc, solver, enc.state("one0"), tag="one_")
        if assume is not None:
            solver.add(assume(path.states[0]))
        tr = path.extend()
        solver.add(z3.substitute(case, *zip(enc.op("probe").terms(), tr.op.terms(), strict=True)))
        solver.add(z3.Not(goal(tr)))
        answer = _check(solver, deadline)
        if answer != z3.unsat:
            return answer, solver.model() if answer == z3.sat else None, tr
    return z3.unsat, None, None


class Path:
    """An unrolled path: states s0..sk and the transitions between them, with their constraints.

    With a ``solver``, each step's constraint is also added to it as the path grows.
    """

    def __init__(
        self, enc: Encoding, solver: z3.Solver | None = None, start: SymState | None = None, tag: str = ""
    ) -> None:
        self.enc, self.solver, self.tag = enc, solver, tag
        self.states: list[SymState] = [start if start is not None else enc.initial()]
        self.transitions: list[SymTransition] = []
        self.constraints: list[Term] = []

    def extend(self) -> SymTransition:
        k = len(self.transitions)
        constraint, tr = self.enc.transition(
            self.states[-1], self.enc.op(f"{self.tag}op{k}"), self.enc.state(f"{self.tag}s{k + 1}")
        )
        self.constraints.append(constraint)
        if self.solver is not None:
            self.solver.add(constraint)
        self.states.append(tr.after)
        self.transitions.append(tr)
        return tr

    def decode(self, model: z3.ModelRef, upto: int | None = None) -> list[Op]:
        return [self.enc.decode_op(model, tr.op) for tr in self.transitions[:upto]]


# -- lemmas ------------------------------------------------------------------------------------------


@dataclass
class Lemmas:
    """Auxiliary conjuncts proved inductive for one encoding, as formulas over the template state."""

    template: SymState
    conjuncts: list[Term]
    dropped: int
    seconds: float

    def on(self, state: SymState) -> Term:
        pairs = list(zip(self.template.terms(), state.terms(), strict=True))
        return z3.substitute(z3.And(*self.conjuncts), *pairs) if self.conjuncts else z3.BoolVal(True)


def _conjuncts(term: Term) -> list[Term]:
    if z3.is_and(term):
        return [c for child in term.children() for c in _conjuncts(child)]
    return [term]


def auxiliary_conjuncts(enc: Encoding, template: SymState) -> list[Term]:
    """The auxiliary invariants on ``template``, split into their conjuncts (in one fixed order)."""
    return [c for f in AUXILIARY.values() for c in _conjuncts(f(enc, template))]


def inductive_lemmas(enc: Encoding, deadline: float | None = None) -> Lemmas:
    """Houdini: drop every auxiliary conjunct false initially or broken by a step, until the rest is inductive."""
    t0 = time.monotonic()
    template = enc.state("lemma")
    candidates = auxiliary_conjuncts(enc, template)
    total = len(candidates)
    pairs0 = list(zip(template.terms(), enc.initial().terms(), strict=True))
    candidates = [c for c in candidates if z3.is_true(z3.simplify(z3.substitute(c, *pairs0)))]
    solver = _solver(enc, incremental=True)
    path = Path(enc, solver, template, tag="lemma_")
    path.extend()
    after = list(zip(template.terms(), path.states[-1].terms(), strict=True))
    while candidates:
        solver.push()
        solver.add(*candidates)
        post = [z3.substitute(c, *after) for c in candidates]
        solver.add(z3.Not(z3.And(*post)))
        answer = _check(solver, deadline)
        if answer == z3.unsat:
            solver.pop()
            break
        if answer == z3.unknown:
            solver.pop()
            candidates = []
            break
        model = solver.model()
        kept = [
            c for c, p in zip(candidates, post, strict=True) if not z3.is_false(model.eval(p, model_completion=True))
        ]
        solver.pop()
        candidates = kept
    return Lemmas(template, candidates, total - len(candidates), time.monotonic() - t0)


# -- bounded model checking -------------------------------------------------------------------------------


@dataclass
class Counterexample:
    """A shortest op sequence whose last step (index ``step``) breaks ``invariants``."""

    ops: list[Op]
    step: int
    invariants: list[str]


@dataclass
class BmcResult:
    """``depth``: all sequences of at most this many ops were checked (they held, unless there is a
    ``counterexample``, which has exactly ``depth`` ops); ``complete``: the requested depth was reached."""

    bounds: Bounds
    requested: int
    depth: int
    seconds: float
    counterexample: Counterexample | None = None
    complete: bool = True
    variant: str | None = None  # the checked variant's name; None: the spec's own encoding
    interrupted: bool = False  # a stop was asked for (kvspec.stop): ``depth`` is the last depth completed
    lemmas: Lemmas | None = None
    per_depth: list[float] = field(default_factory=list)

    @property
    def holds(self) -> bool:
        return self.counterexample is None


def bmc(
    bounds: Bounds,
    depth: int,
    *,
    variant: type[Encoding] | None = None,
    invariants: Sequence[str] | None = None,
    time_limit: float | None = None,
    lemmas: bool = False,
    progress: Callable[[int, float], None] | None = None,
) -> BmcResult:
    """Check ``invariants`` (default: every safety invariant) on all op sequences of up to ``depth`` ops.

    ``variant``: a subclass of Encoding to check instead of the spec's own.

    Each depth k is one bit-blasted query: the path of k steps, the invariants
    already proved for the shorter depths assumed on its first k - 1 steps (they
    hold there: those depths were checked), and their negation on the last.
    lemmas=True first proves the inductive subset of the auxiliary invariants for
    this encoding and assumes it on every state too (sound: it excludes no
    reachable state).
    """
    names = _names(invariants)
    enc = (variant or Encoding)(bounds)
    t0 = time.monotonic()
    deadline = None if time_limit is None else t0 + time_limit
    result = BmcResult(bounds, depth, 0, 0.0, complete=False, variant=enc.name)
    path = Path(enc)
    if lemmas:
        result.lemmas = inductive_lemmas(enc, deadline)
    try:
        _deepen(enc, path, names, depth, deadline, t0, result, progress)
    except KeyboardInterrupt:  # at a depth's start, or out of a solve: the depths before it stand
        stop.clear()
        result.interrupted = True
    result.seconds = time.monotonic() - t0
    return result


def _deepen(
    enc: Encoding,
    path: Path,
    names: Sequence[str],
    depth: int,
    deadline: float | None,
    t0: float,
    result: BmcResult,
    progress: Callable[[int, float], None] | None,
) -> None:
    """Depths 1 to ``depth`` in turn, into ``result``: until a counterexample, the deadline, or a stop."""
    held: list[Term] = []
    for k in range(depth):
        stop.check()
        tr = path.extend()
        if result.lemmas is not None:
            path.constraints.append(result.lemmas.on(tr.after))
        holds = {n: SAFETY[n](enc, tr) for n in names}
        solver = _solver(enc, incremental=False)
        solver.add(*path.constraints, *held, z3.Not(z3.And(*holds.values())))
        answer = _check(solver, deadline)
        if answer == z3.sat:
            model = solver.model()
            broken = [n for n, f in holds.items() if z3.is_false(model.eval(f, model_completion=True))]
            result.counterexample = Counterexample(path.decode(model), k, broken)
            result.depth, result.complete = k + 1, True
            break
        if answer == z3.unknown:  # out of time
            break
        held.extend(holds.values())
        result.depth = k + 1
        result.per_depth.append(time.monotonic() - t0)
        if progress is not None:
            progress(k + 1, time.monotonic() - t0)
    else:
        result.complete = True


# -- k-induction --------------------------------------------------------------------------------------------


@dataclass
class Proof:
    """One invariant's induction: proved k-inductive (None: not proved), alone or strengthened."""

    invariant: str
    k: int | None
    strengthened: bool
    seconds: float
    counterexample: Counterexample | None = None
    note: str = ""

    @property
    def proved(self) -> bool:
        return self.k is not None and self.counterexample is None


@dataclass
class AuxiliaryProof:
    """The auxiliary invariants hold on the empty pool and every step preserves them (1-inductive)."""

    holds_initially: bool
    inductive: bool
    seconds: float
    failing: list[str] = field(default_factory=list)

    @property
    def proved(self) -> bool:
        return self.holds_initially and self.inductive


def prove_auxiliary(
    bounds: Bounds, deadline: float | None = None, *, variant: type[Encoding] | None = None
) -> AuxiliaryProof:
    """Aux(init), and Aux(s) and T(s, op, s') imply Aux(s'), for the whole AUXILIARY set at once."""
    t0 = time.monotonic()
    enc = (variant or Encoding)(bounds)
    holds_initially = z3.is_true(z3.simplify(auxiliary(enc, enc.initial())))
    answer, model, tr = _one_step(enc, lambda s: auxiliary(enc, s), lambda tr: auxiliary(enc, tr.after), deadline)
    failing: list[str] = []
    if answer == z3.sat and model is not None and tr is not None:
        failing = [n for n, f in AUXILIARY.items() if z3.is_false(model.eval(f(enc, tr.after), model_completion=True))]
    elif answer == z3.unknown:
        failing = ["(timed out)"]
    return AuxiliaryProof(holds_initially, answer == z3.unsat, time.monotonic() - t0, failing)


def base_case(
    enc: Encoding, names: Sequence[str], steps: int, deadline: float | None
) -> tuple[str, Counterexample | None]:
    """Do ``names`` hold on every path of up to ``steps`` steps from the empty pool? ("unsat": yes)."""
    time_limit = _remaining_ms(deadline) / 1000 or None
    result = bmc(enc.bounds, steps, variant=type(enc), invariants=names, time_limit=time_limit)
    if result.counterexample is not None:
        return "sat", result.counterexample
    return ("unsat" if result.complete else "unknown"), None


def step_case(
    enc: Encoding, name: str, k: int, assume: Callable[[SymState], Term] | None, deadline: float | None
) -> z3.CheckSatResult:
    """From any state (satisfying ``assume``): k steps on which ``name`` held, then one that breaks it?"""
    if k == 0:
        return _one_step(enc, assume, lambda tr: SAFETY[name](enc, tr), deadline)[0]
    solver = _solver(enc, incremental=False)
    path = Path(enc, solver, enc.state("ind0"), tag="ind_")
    if assume is not None:
        solver.add(assume(path.states[0]))
    for _ in range(k):
        solver.add(SAFETY[name](enc, path.extend()))
    solver.add(z3.Not(SAFETY[name](enc, path.extend())))
    return _check(solver, deadline)


def prove(
    bounds: Bounds,
    invariants: Sequence[str] | None = None,
    *,
    max_k: int = 2,
    time_limit: float | None = None,
    variant: type[Encoding] | None = None,
    progress: Callable[[Proof], None] | None = None,
) -> tuple[AuxiliaryProof, list[Proof]]:
    """k-induction for each invariant: alone for k = 1..max_k, else 1-induction strengthened by the auxiliary set.

    k counts the steps of the induction: the step case assumes the invariant on
    k - 1 consecutive steps from an arbitrary state and proves it on the next
    (k = 1: it holds after any step from any state, so it is a property of the
    step relation itself).
    """
    names = _names(invariants)
    deadline = None if time_limit is None else time.monotonic() + time_limit
    aux = prove_auxiliary(bounds, deadline, variant=variant)
    enc = (variant or Encoding)(bounds)
    proofs = []
    for name in names:
        t0 = time.monotonic()
        status, cex = base_case(enc, [name], max_k, deadline)
        if status == "sat":
            proof = Proof(
                name, None, False, time.monotonic() - t0, cex, "violated: a path from the empty pool breaks it"
            )
        else:
            k_alone = next(
                (k for k in range(1, max_k + 1) if step_case(enc, name, k - 1, None, deadline) == z3.unsat), None
            )
            if k_alone is not None and status == "unsat":
                proof = Proof(name, k_alone, False, time.monotonic() - t0, note="inductive alone")
            elif aux.proved and step_case(enc, name, 0, lambda s: auxiliary(enc, s), deadline) == z3.unsat:
                proof = Proof(name, 1, True, time.monotonic() - t0, note="1-inductive with the auxiliary invariants")
            else:
                why = "the auxiliary set is not inductive" if not aux.proved else "step case not proved"
                proof = Proof(name, None, True, time.monotonic() - t0, note=f"not proved: {why}")
        proofs.append(proof)
        if progress is not None:
            progress(proof)
    return aux, proofs
