"""Class 6 (bad input defined once): every class of bad input spec.validate defines is tried on every adapter
that can be given it, the reference adapters reject all of them (negative token ids included), and
bad_input_rejected never reads "held" for a class that was never tried."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvspec.adapters import load
from kvspec.spec import Op, Semantics, SpecError
from kvspec.spec.ledger import LedgerModel, validate
from kvspec.spec.ops import BAD_INPUT, OP_KINDS, bad_input_kinds
from kvspec.stateful_tests import PROFILES, Harness, Options, run_check
from kvspec.stateful_tests.bad_inputs import TOUR_CONFIG, tour_ops

ALL_OPS = frozenset(OP_KINDS)


@pytest.mark.parametrize("kind", list(BAD_INPUT))
def test_each_tour_ends_in_bad_input_of_its_class(kind: str) -> None:
    """The spec itself: the tour's last op is bad input of exactly that class, the ops before it are valid."""
    model = LedgerModel(TOUR_CONFIG, Semantics())
    *before, last = tour_ops(kind, ALL_OPS, TOUR_CONFIG, "block")
    for op in before:
        assert model.step(op).outcome.status == "ok", op
    with pytest.raises(SpecError) as raised:
        validate(last, model.observe(), TOUR_CONFIG, Semantics())
    assert raised.value.kind == kind


@pytest.mark.parametrize("name", ["reference", "lifecycle-sim", "scheduler-sim"])
def test_the_reference_adapters_reject_every_class_they_can_be_given(name: str) -> None:
    """Through the kit's front end (the Harness): the paged reference rejects bad input itself
    (checks_input=True), the simulators are answered by the spec's validation before they are called."""
    adapter = load(name)()
    caps = adapter.capabilities
    assert caps.checks_input is (name == "reference")
    for kind in bad_input_kinds(caps.ops, caps.semantics.granularity):
        harness = Harness(adapter, TOUR_CONFIG)
        *before, last = tour_ops(kind, caps.ops, TOUR_CONFIG, caps.semantics.granularity)
        for op in before:
            assert harness.step(op).status == "ok", (kind, op)
        assert harness.step(last).status == "invalid", (name, kind, last)


def test_negative_token_ids_are_bad_input_for_the_paged_reference() -> None:
    adapter = load("reference")()
    adapter.reset(TOUR_CONFIG)
    assert adapter.apply(Op("admit", "r0", (1, -1))).status == "invalid"
    assert adapter.apply(Op("admit", "r1", (1, 2))).status == "ok"
    assert adapter.apply(Op("append", "r1", (-5,))).status == "invalid"


def test_a_check_tries_every_class_and_only_then_says_held(tmp_path: Path) -> None:
    from kvspec.cli import main

    report = tmp_path / "r.json"
    assert main(["check", "--adapter", "reference", "--max-examples", "5", "--quiet", "--report", str(report)]) == 0
    import json

    data = json.loads(report.read_text())
    tried = {k.split(":", 1)[1] for k in data["coverage"] if k.startswith("bad_input:")}
    assert tried == set(BAD_INPUT)
    assert next(r for r in data["invariants"] if r["name"] == "bad_input_rejected")["verdict"] == "held"


def test_a_class_never_tried_leaves_bad_input_rejected_unknown(tmp_path: Path) -> None:
    """One example of the random phase alone cannot reach every class: the verdict says so, it does not pass."""
    result = run_check(
        load("reference"), "reference", Options(profile=PROFILES["ci"], max_examples=1, cases_dir=tmp_path)
    )
    row = next(r for r in result.report().verdicts() if r["name"] == "bad_input_rejected")
    assert row["verdict"] == "unknown" and row["reason"].startswith("bad input never tried:"), row
