"""The Z3 side's results as the kit's report: bounded model checking and k-induction.

``kvspec bmc`` and ``kvspec prove`` print their own progress; these functions turn what
they found into the same :class:`~kvspec.report.Report` every other check writes, so a CI
gate reads a proof, a bounded check and a Hypothesis run the same way. A bounded check
that held up to depth K has each invariant ``held`` on K depths; one stopped by its time
limit is ``error`` (exit 2: never a pass); a proof is ``held`` once proved, ``unknown``
with the reason when the solver could not decide, ``violated`` with its counterexample.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvspec.case import Case
from kvspec.report import Report, Row, Status
from kvspec.spec import Op
from kvspec.spec.formal.bmc import AuxiliaryProof, BmcResult, Counterexample, Proof
from kvspec.spec.formal.parametric import EveryNProof, Refinement
from kvspec.spec.formal.pdr import PdrProof
from kvspec.spec.formal.score_proofs import PropertyResult
from kvspec.spec.formal.symbolic import Bounds
from kvspec.spec.formal.symbolic_invariants import SAFETY

SPEC = "spec"
"""The ``adapter`` of a formal report: the spec's own Z3 encoding (or a variant of it, in ``formal.variant``)."""


def save_counterexample(
    source: str,
    bounds: Bounds,
    ops: Sequence[Op],
    violated: Sequence[str],
    step: int,
    cases_dir: Path,
    *,
    invariant: str | None = None,
    variant: str | None = None,
) -> Path:
    """Save a formal command's counterexample (``source``: bmc, pdr, explore) as a case on the reference
    adapter, replayable on any adapter (``kvspec replay PATH --adapter NAME``); its path. ``invariant``: the
    one the case stands for (default: the first violated)."""
    expected: dict[str, Any] = {"invariant": invariant or violated[0], "violated": list(violated), "step": step}
    expected["source"] = source
    if source != "explore":
        expected["variant"] = variant
    expected["bounds"] = bounds.to_json()
    return Case("reference", bounds.config, list(ops), expected).save(cases_dir)


def _violation(cex: Counterexample) -> dict[str, Any]:
    return {
        "step": cex.step,
        "ops": [op.to_json() for op in cex.ops],
        "problems": [f"broken by the last of {len(cex.ops)} ops ({', '.join(cex.invariants)})"],
    }


def bmc_report(
    result: BmcResult,
    *,
    started_at: str,
    invariants: Sequence[str] | None = None,
    variant: str | None = None,
    cases: Sequence[str] = (),
) -> Report:
    """One row per safety invariant of the encoding: held on every depth checked, violated, or not checked."""
    cex = result.counterexample
    held_depths = result.depth - (1 if cex is not None else 0)  # the counterexample's depth held only in part
    checked = set(invariants or SAFETY)
    rows = []
    for name in SAFETY:
        if name not in checked:
            rows.append(Row(name, "safety", applicable=False, reason="not checked (--invariant)"))
        elif cex is not None and name in cex.invariants:
            rows.append(Row(name, "safety", result.depth, _violation(cex)))
        else:
            rows.append(Row(name, "safety", held_depths, reason="no depth was completed"))
    status: Status = "violated" if cex is not None else ("passed" if result.complete else "error")
    error = "" if result.complete else f"time limit reached: held up to depth {result.depth} of {result.requested}"
    if result.interrupted and cex is None:
        status, error = "interrupted", f"interrupted: held up to depth {result.depth} of {result.requested}"
    return Report(
        adapter=SPEC,
        rows=rows,
        profile="bmc",
        started_at=started_at,
        duration_s=result.seconds,
        examples=1,
        steps=result.depth,
        status=status,
        error=error,
        cases=list(cases),
        sections={
            "formal": {
                "engine": "bmc",
                "bounds": result.bounds.to_json(),
                "variant": variant,
                "depth_requested": result.requested,
                "depth_reached": result.depth,
                "complete": result.complete,
                "assumed_lemmas": None if result.lemmas is None else len(result.lemmas.conjuncts),
                "seconds_per_depth": [round(s, 3) for s in result.per_depth],
            }
        },
    )


def _proof_row(proof: Proof) -> Row:
    if proof.counterexample is not None:
        return Row(proof.invariant, "safety", proof.k or 1, _violation(proof.counterexample))
    return Row(proof.invariant, "safety", proof.k or 0, reason=proof.note or "not proved within the limits")


def _decided(name: str, proved: bool, reason: str) -> Row:
    """A property outside the transition system's invariants: one proof, held once proved."""
    return Row(name, "proof", 1 if proved else 0, reason=None if proved else reason)


def prove_report(
    bounds: Bounds,
    aux: AuxiliaryProof,
    proofs: Sequence[Proof],
    every: EveryNProof,
    refinement: Refinement,
    scores: Sequence[PropertyResult],
    *,
    started_at: str,
    seconds: float,
) -> Report:
    """One row per invariant proved by k-induction, then the auxiliary lemmas, the all-N proof and the score."""
    rows = [_proof_row(p) for p in proofs]
    rows.append(_decided("auxiliary_invariants_inductive", aux.proved, f"not inductive: {', '.join(aux.failing)}"))
    rows.append(_decided("capacity_conservation_every_n", every.proved, "not proved"))
    rows.append(_decided("bounded_encoding_refines_counting", refinement.holds, refinement.answer))
    for r in scores:
        if r.counterexample:
            rows.append(Row(f"score_{r.prop}", "proof", 1, {"counterexample": r.counterexample, "problems": []}))
        else:
            rows.append(_decided(f"score_{r.prop}", r.proved, "unknown to the solver"))
    violated = any(row.verdict == "violated" for row in rows)
    status: Status = "violated" if violated else ("passed" if all(r.verdict == "held" for r in rows) else "error")
    undecided = [row.name for row in rows if row.verdict == "unknown"]
    return Report(
        adapter=SPEC,
        rows=rows,
        profile="prove",
        started_at=started_at,
        duration_s=seconds,
        examples=1,
        steps=max((p.k or 0 for p in proofs), default=0),
        status=status,
        error=f"not decided within the limits: {', '.join(undecided)}" if status == "error" else "",
        sections={"formal": {"engine": "k-induction", "bounds": bounds.to_json()}},
    )


def interrupted_report(bounds: Bounds, proofs: Sequence[Proof], *, started_at: str, seconds: float) -> Report:
    """``kvspec prove`` stopped by a signal: the invariants decided before it, status interrupted (exit 2)."""
    return Report(
        adapter=SPEC,
        rows=[_proof_row(p) for p in proofs],
        profile="prove",
        started_at=started_at,
        duration_s=seconds,
        examples=1,
        steps=max((p.k or 0 for p in proofs), default=0),
        status="interrupted",
        error=f"interrupted: {len(proofs)} invariants decided",
        sections={"formal": {"engine": "k-induction", "bounds": bounds.to_json()}},
    )


def _pdr_row(proof: PdrProof) -> Row:
    if proof.counterexample is not None:
        return Row(proof.invariant, "safety", 1, _violation(proof.counterexample))
    if proof.verdict == "violated":  # derived by Spacer, not decoded into ops: a violation all the same
        return Row(proof.invariant, "safety", 1, {"step": None, "ops": [], "problems": [proof.note]})
    return Row(proof.invariant, "safety", 1 if proof.proved else 0, reason=proof.note or "not proved")


def pdr_report(
    bounds: Bounds,
    proofs: Sequence[PdrProof],
    *,
    started_at: str,
    time_limit: float,
    direction: str = "forward",
    cases: Sequence[str] = (),
) -> Report:
    """One row per invariant Spacer was asked about: held once proved (and checked), violated, or unknown
    (``timed_out``: stopped at ``time_limit`` seconds)."""
    rows = [_pdr_row(p) for p in proofs]
    violated = any(row.verdict == "violated" for row in rows)
    status: Status = "violated" if violated else ("passed" if all(r.verdict == "held" for r in rows) else "error")
    undecided = [row.name for row in rows if row.verdict == "unknown"]
    return Report(
        adapter=SPEC,
        rows=rows,
        profile="prove",
        started_at=started_at,
        duration_s=sum(p.seconds for p in proofs),
        examples=1,
        steps=0,
        status=status,
        error=f"not proved by Spacer within the limits: {', '.join(undecided)}" if status == "error" else "",
        cases=list(cases),
        sections={
            "formal": {
                "engine": "pdr",
                "bounds": bounds.to_json(),
                "time_limit_s": time_limit,
                "direction": direction,
                "invariants": {
                    p.invariant: {
                        "verdict": p.verdict,
                        "seconds": round(p.seconds, 3),
                        "checked": p.checked,
                        "inductive_invariant": None if p.inductive is None else str(p.inductive),
                        "note": p.note,
                        "timed_out": p.timed_out,
                        "assumed_lemmas": p.assumed,
                    }
                    for p in proofs
                },
            }
        },
    )


__all__ = ["SPEC", "bmc_report", "pdr_report", "prove_report"]
