"""The adapter toolkit and the capabilities a small adapter leans on (docs/writing-an-adapter.md)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from kvspec.adapter import Capabilities, append_atomically, derived_events, import_without_init
from kvspec.adapters.reference_paged import ReferenceNewestAdapter, ReferencePagedAdapter
from kvspec.spec import Config, ObjectView, Observation, Op, Outcome, Semantics
from kvspec.spec.invariants import KeyMemory, Transition, check_transition
from kvspec.spec.ledger import LedgerModel
from kvspec.stateful_tests import PROFILES, Options, replay_ops, run_check
from kvspec.stateful_tests.bad_inputs import bad_input_cases


def _obs(objects: dict[int, str | None], free: int = 0) -> Observation:
    views = {oid: ObjectView(oid, 1, 2, 0, key) for oid, key in objects.items()}
    return Observation(len(objects) + free, free, views, {}, {k: (o,) for o, k in objects.items() if k})


def test_derived_events_name_each_block_that_lost_or_changed_its_key_and_each_cached_block_taken() -> None:
    before = _obs({0: "a", 1: "b", 2: "c", 3: None})
    after = _obs({1: "x", 2: "c", 3: None}, free=1)
    assert [(e.kind, e.oid, e.key) for e in derived_events(before, after)] == [("evict", 0, "a"), ("evict", 1, "b")]
    # Block 2 was popped from the free pool and keyed again with the same prefix within the step.
    taken = derived_events(before, after, taken=[2, 3, 1])  # in the order the engine took them
    assert [(e.oid, e.key) for e in taken] == [(2, "c"), (1, "b"), (0, "a")]


def test_append_atomically_refuses_before_the_first_token_or_appends_them_all() -> None:
    seen: list[int] = []
    refused = append_atomically((1, 2, 3), blocks_needed=2, free_blocks=1, append_one=seen.append)
    assert refused.status == "refused" and seen == []
    assert append_atomically((1, 2, 3), blocks_needed=1, free_blocks=1, append_one=seen.append) == Outcome.ok()
    assert seen == [1, 2, 3]


def test_import_without_init_never_runs_the_packages_init(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "heavyengine"
    (package / "engine").mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('the model runner needs a GPU')\n")
    (package / "engine" / "allocator.py").write_text("from heavyengine.engine.util import SIZE\nBLOCKS = SIZE\n")
    (package / "engine" / "util.py").write_text("SIZE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [n for n in sys.modules if n.startswith("heavyengine")]:
        monkeypatch.delitem(sys.modules, name)
    try:
        (allocator,) = import_without_init("heavyengine", "engine.allocator")
        assert allocator.BLOCKS == 7
    finally:
        for name in [n for n in sys.modules if n.startswith("heavyengine")]:
            del sys.modules[name]
    with pytest.raises(ImportError, match="not installed"):
        import_without_init("no_such_engine_here", "engine")


class _TrustsItsInput(ReferencePagedAdapter):
    """An engine with no input checks at all: bad input crashes it."""

    name = "trusts-its-input"
    capabilities = Capabilities(semantics=Semantics(), checks_input=False)

    def apply(self, op: Op) -> Outcome:
        outcome = super().apply(op)
        if outcome.status == "invalid":
            raise AssertionError(f"the engine was given bad input: {op}")
        return outcome


def test_an_adapter_that_leaves_input_checks_to_the_kit_never_sees_bad_input() -> None:
    caps = _TrustsItsInput.capabilities
    cases = bad_input_cases(caps.ops, "block")
    assert len(cases) == 13
    for case in cases:
        assert replay_ops(_TrustsItsInput(), case.config, case.ops) is None, case.expected
    # The same engine, claiming its own validation is under test, is caught by the first bad op.
    claiming = _TrustsItsInput()
    claiming.capabilities = Capabilities(semantics=Semantics(), checks_input=True)
    found = replay_ops(claiming, cases[0].config, cases[0].ops)
    assert found is not None and found.invariant == "adapter_contract"


class _NoDropOnRelease(ReferencePagedAdapter):
    """An engine that cannot drop a request's cache on release."""

    name = "no-drop-on-release"
    capabilities = Capabilities(semantics=Semantics(), declines=frozenset({"release_drop"}))

    def apply(self, op: Op) -> Outcome:
        if op.op == "release" and not op.keep:
            raise NotImplementedError("release(keep=False)")
        return super().apply(op)


def test_a_declined_op_is_never_drawn_and_every_check_still_runs(tmp_path: Path) -> None:
    result = run_check(
        _NoDropOnRelease, "no-drop", Options(profile=PROFILES["ci"], max_examples=60, cases_dir=tmp_path, isolate=False)
    )
    assert result.exit_code == 0, result.failure
    rows = {row["name"]: row for row in result.report().verdicts()}
    assert rows["predicted_eviction"]["verdict"] == "held"
    assert rows["index_completeness"]["verdict"] == "held"
    assert not Capabilities(semantics=Semantics(), declines=frozenset({"release_drop"})).allows(
        Op("release", "r0", keep=False)
    )
    with pytest.raises(ValueError, match="cannot decline"):
        Capabilities(semantics=Semantics(), declines=frozenset({"reset"}))


def test_a_free_count_that_includes_cached_free_blocks_is_named_as_a_double_count() -> None:
    config, sem = Config(capacity=4, block_size=2), Semantics()
    model = LedgerModel(config, sem)
    before = model.observe()
    model.step(Op("admit", "r0", (1, 2, 3)))
    model.step(Op("release", "r0"))
    right = model.observe()
    wrong = Observation(right.capacity, right.free + 1, right.objects, right.requests, right.index)  # 1 cached free
    t = Transition(before, Op("release", "r0"), Outcome.ok(), (), wrong, config, sem, KeyMemory())
    problems = check_transition(t)["capacity_conservation"]
    assert problems and "cached unreferenced block(s) that are objects too" in problems[0]


def test_newest_duplicate_takes_the_index_and_the_older_copy_takes_it_back_once_the_owner_goes() -> None:
    """duplicate_keys="newest": the ledger and the reference pool that implements it agree on a short history; the
    older copy stays findable behind the newest (no value of duplicate_keys loses a copy the pool holds)."""
    config = Config(capacity=4, block_size=2)
    model = LedgerModel(config, Semantics(duplicate_keys="newest"))
    ops = [
        Op("admit", "a", (1,)),
        Op("append", "a", (2,)),  # a's block becomes full: keyed (1, 2)
        Op("admit", "b", (1,)),  # a partial block: no hit
        Op("append", "b", (2,)),  # a duplicate of (1, 2): b's block takes the entry, a's behind it
    ]
    for op in ops:
        assert model.step(op).outcome.status == "ok"
    obs = model.observe()
    a_block, b_block = obs.requests["a"].objects[0], obs.requests["b"].objects[0]
    key = obs.objects[a_block].key
    assert obs.objects[b_block].key == key and obs.index == {key: (b_block, a_block)}
    assert model.step(Op("release", "b", keep=False)).lost == ()  # the owner's key went; a's copy takes the entry
    assert model.observe().index == {key: (a_block,)}
    assert replay_ops(ReferenceNewestAdapter(), config, [*ops, Op("release", "b", keep=False)]) is None


def test_declared_contracts_are_validated_and_only_they_are_allowed() -> None:
    """Capabilities.contracts: each is OP:NAME of an implemented op; an undeclared contract op is never given."""
    with pytest.raises(ValueError, match="OP:NAME"):
        Capabilities(semantics=Semantics(), ops=frozenset({"admit"}), contracts=frozenset({"release:repeated"}))
    with pytest.raises(ValueError, match="OP:NAME"):
        Capabilities(semantics=Semantics(), contracts=frozenset({"release"}))
    caps = Capabilities(semantics=Semantics(), contracts=frozenset({"release:repeated"}))
    assert caps.allows(Op("release", "a", contract="repeated"))
    assert not caps.allows(Op("release", "a", contract="twice")) and not caps.allows(
        Op("admit", "a", (1,), contract="repeated")
    )
    assert Op.from_json(Op("release", "a", contract="repeated").to_json()).contract == "repeated"
    assert "contract" not in Op("release", "a").to_json()  # plain ops serialize as before


def test_only_an_adapter_with_contracts_gets_the_contract_rule() -> None:
    """A machine without contracts is the plain one, so its draws (and every committed measurement) are unchanged."""
    from kvspec.stateful_tests.harness import Tally
    from kvspec.stateful_tests.machine import KVLifecycleWithContracts, build_machine

    plain = ReferencePagedAdapter()
    assert not issubclass(build_machine(plain, Tally()), KVLifecycleWithContracts)
    plain.capabilities = dataclasses.replace(plain.capabilities, contracts=frozenset({"release:repeated"}))
    machine = build_machine(plain, Tally())
    assert issubclass(machine, KVLifecycleWithContracts) and machine.contracts == ("release:repeated",)
