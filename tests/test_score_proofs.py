"""The retention score's monotonicity, proved for all reals; broken scores are caught with a counterexample."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
import z3

from kvspec.reference.scheduler import SchedulerSim
from kvspec.spec.formal.score_proofs import (
    BROKEN_SCORES,
    PROPERTIES,
    ScoreFormula,
    check_property,
    check_score,
    spec_score,
)
from kvspec.spec.policies import retention_score

Number = int | float | Fraction


def _value(score: ScoreFormula, hits: Number, size: Number, age: Number, capacity: Number) -> Fraction:
    term = z3.simplify(score(*[z3.RealVal(Fraction(x)) for x in (hits, size, age, capacity)]))
    return Fraction(term.numerator_as_long(), term.denominator_as_long())


def test_the_spec_score_has_every_property_for_all_reals() -> None:
    results = check_score(spec_score)
    assert [r.prop for r in results] == [p.name for p in PROPERTIES]
    assert all(r.proved for r in results), results


def test_the_proved_formula_is_the_code_that_runs() -> None:
    """The Z3 transcription agrees with spec.retention_score and with the scheduler simulator's score."""
    rng = random.Random(3)
    for _ in range(300):
        hits, size = rng.randint(0, 50), rng.randint(0, 5000)
        age, capacity = rng.randint(-5, 2000), rng.choice([-3, 0, 1, 7, 1024, rng.randint(1, 10_000)])
        exact = float(_value(spec_score, hits, size, age, capacity))
        assert retention_score(hits, size, age, capacity) == pytest.approx(exact, rel=1e-12, abs=1e-12)
        if capacity >= 1:
            sim = SchedulerSim(capacity)
            sim.time = 10_000
            assert sim.score(hits, size, sim.time - age) == pytest.approx(exact, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("name", sorted(BROKEN_SCORES))
def test_a_broken_score_gets_a_real_counterexample(name: str) -> None:
    score, prop = BROKEN_SCORES[name]
    result = check_property(prop, score)
    assert not result.proved and not result.unknown
    c = {k: Fraction(v) for k, v in result.counterexample.items()}
    if prop == "more_hits_never_lower":
        assert c["hits1"] <= c["hits2"]
        assert _value(score, c["hits1"], c["size1"], c["age1"], c["capacity"]) > _value(
            score, c["hits2"], c["size1"], c["age1"], c["capacity"]
        )
    elif prop == "more_recent_never_lower":
        assert c["age1"] <= c["age2"]
        assert _value(score, c["hits1"], c["size1"], c["age1"], c["capacity"]) < _value(
            score, c["hits1"], c["size1"], c["age2"], c["capacity"]
        )
    else:
        assert c["size1"] <= c["size2"]
        assert _value(score, c["hits1"], c["size1"], c["age1"], c["capacity"]) < _value(
            score, c["hits1"], c["size2"], c["age1"], c["capacity"]
        )


def test_an_unknown_property_is_an_error() -> None:
    with pytest.raises(ValueError):
        check_property("cheaper_never_worse", spec_score)
