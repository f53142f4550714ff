"""The nano-vllm adapter against the real package from PyPI (``nano-vllm-fork``, installed with --no-deps).

``.ci/run`` installs it (``kvspec[nanovllm]`` and ``pip install --no-deps nano-vllm-fork``); without it these
tests skip. The package's ``nanovllm/__init__`` imports torch: the adapter must never run it.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("xxhash", reason="nano-vllm extra not installed: pip install 'kvspec[nanovllm]'")
if __import__("importlib.util").util.find_spec("nanovllm") is None:
    pytest.skip("nano-vllm not installed: pip install --no-deps nano-vllm-fork", allow_module_level=True)

from kvspec.adapters.nano_vllm import CONTRACTS, UNCHECKED, NanoVllmAdapter
from kvspec.spec import Config, Op
from kvspec.spec.invariants import INVARIANT_NAMES
from kvspec.stateful_tests import PROFILES, Case, Options, Tally, replay_ops, run_check

CASES = Path(__file__).parent / "data" / "nanovllm"


def test_the_engine_modules_load_without_the_package_init_or_torch() -> None:
    adapter = NanoVllmAdapter()
    assert "torch" not in sys.modules
    assert adapter.gen == 1  # the PyPI fork is of the first API generation (can_allocate -> bool)
    assert "API generation 1" in adapter.capabilities.version
    assert adapter.capabilities.semantics.duplicate_keys == "newest"
    assert not adapter.capabilities.semantics.hit_cap  # generation 1 hits a whole-prompt match


def test_a_prefix_hit_on_a_running_request_shares_its_blocks() -> None:
    adapter = NanoVllmAdapter()
    adapter.reset(Config(capacity=8, block_size=2))
    assert adapter.apply(Op("admit", "a", (1, 2, 3, 4, 5))).status == "ok"
    hit = adapter.apply(Op("admit", "b", (1, 2, 3, 4, 6)))
    assert hit.status == "ok" and hit.hit_tokens == 4
    obs = adapter.observe()
    assert obs.requests["a"].objects[:2] == obs.requests["b"].objects[:2]
    assert obs.objects[obs.requests["a"].objects[0]].ref_count == 2
    assert obs.free + len(obs.objects) == obs.capacity


def test_an_append_that_does_not_fit_changes_nothing() -> None:
    """The atomic append helper: the whole append is checked before the first decode step."""
    adapter = NanoVllmAdapter()
    adapter.reset(Config(capacity=2, block_size=2))
    assert adapter.apply(Op("admit", "a", (1, 2, 3))).status == "ok"
    before = adapter.observe()
    assert adapter.apply(Op("append", "a", (4, 5, 6))).status == "refused"
    assert adapter.observe() == before
    assert adapter.apply(Op("append", "a", (4,))).status == "ok"
    assert adapter.observe().requests["a"].tokens == (1, 2, 3, 4)


@pytest.mark.parametrize("name", ["spurious-refusal", "lost-hits"])
def test_the_documented_nanovllm_findings_reproduce_on_the_pypi_package(name: str) -> None:
    """docs/nanovllm-matrix.md: each finding's case (from `kvspec check --adapter nano-vllm`) still breaks
    its invariant on the installed package, on its last op."""
    case = Case.load(CASES / f"{name}.json")
    found = replay_ops(NanoVllmAdapter(), case.config, case.ops)
    assert found is not None, f"{name} no longer reproduces: update docs/nanovllm-matrix.md"
    assert found.invariant == case.expected["invariant"]
    assert found.step == len(case.ops) - 1


@pytest.mark.parametrize("name", ["stale-entry-wrong-hit", "hit-drops-key"])
def test_the_upstream_bugs_do_not_occur_on_the_pypi_package(name: str) -> None:
    """docs/nanovllm-matrix.md: upstream's stale index entry served as a hit (up to 8d63a98) and its hit that drops
    the block's key (f64d821) break hit_keeps_key there; the fork has neither (its lost hits, judged by the
    lost-hit checks and the refinement checks, are left out here: test_the_documented_nanovllm_findings...)."""
    case = Case.load(CASES / f"{name}.json")
    assert case.expected["invariant"] == "hit_keeps_key"
    assert replay_ops(NanoVllmAdapter(), case.config, case.ops, Tally(ignored=LOST_HITS), refine=False) is None


def test_the_check_runs_in_its_child_process_and_reports_a_documented_finding(tmp_path: Path) -> None:
    """The random phase alone (no coverage cases) finds one of the two documented findings; nothing else breaks."""
    result = run_check(
        NanoVllmAdapter, "nano-vllm", Options(profile=PROFILES["ci"], cases_dir=tmp_path, max_examples=30)
    )
    assert result.exit_code == 1, (result.status, result.error)
    assert result.failure is not None
    assert set(result.failure.failures) <= {
        *LOST_HITS,
        "index_completeness",
        "predicted_admission",
        "predicted_prefix_hits",
        "predicted_free_capacity",
        "no_spurious_refusal",
    }, result.failure
    assert "API generation 1" in result.adapter_version


LOST_HITS = frozenset({"no_lost_hit", "release_keeps_cache"})
"""The fork's documented lost hits (docs/nanovllm-matrix.md): its deallocate drops a freed block's index entry."""


def judging(*names: str) -> frozenset[str]:
    """``Options.ignore`` that leaves only ``names`` (and adapter_contract) judged: a search that must reach a
    contract's case goes on past the fork's documented findings, which it would otherwise stop at and shrink."""
    return frozenset(INVARIANT_NAMES) - {*names, "adapter_contract"}


FREES = ("non_negative_ref_counts", "ref_count_matches_references", "capacity_conservation", "atomic_failure")
"""What a free that frees more than it should, or an allocation that fails half done, breaks."""


class FreesOnly(NanoVllmAdapter):
    """The nano-vllm adapter with the free contracts alone (the unchecked allocation is tested on its own)."""

    def __init__(self) -> None:
        super().__init__()
        self.capabilities = dataclasses.replace(self.capabilities, contracts=CONTRACTS)


class FreesAgain(FreesOnly):
    """A BlockManager whose deallocate, called again on a freed Sequence, drops the references of the table it
    freed last time once more (a seeded bug on the misuse-contract path only: the Scheduler never repeats it)."""

    def reset(self, config: Config) -> None:
        super().reset(config)
        base = self.bm_mod.BlockManager

        class Manager(base):  # type: ignore[misc, valid-type]
            def deallocate(self, seq: Any) -> None:
                if not seq.block_table:  # already freed: the table it freed last time, once more
                    for block_id in reversed(getattr(seq, "last_table", [])):
                        self.blocks[block_id].ref_count -= 1
                    return
                seq.last_table = list(seq.block_table)
                super().deallocate(seq)

        self.bm = Manager(config.capacity, config.block_size)


class FreesByContent(FreesOnly):
    """A BlockManager whose deallocate of a Sequence it never allocated (an empty table) frees the blocks its
    tokens hash to, as a free keyed by content would: a never-admitted request's free drops a live one's refs."""

    def reset(self, config: Config) -> None:
        super().reset(config)
        base = self.bm_mod.BlockManager

        class Manager(base):  # type: ignore[misc, valid-type]
            def deallocate(self, seq: Any) -> None:
                h = -1
                for i in range(len(seq) // self.block_size if not seq.block_table else 0):
                    h = self.compute_hash(seq.block(i), h)
                    if h in self.hash_to_block_id:
                        self.blocks[self.hash_to_block_id[h]].ref_count -= 1
                super().deallocate(seq)

        self.bm = Manager(config.capacity, config.block_size)


def _violated(result: Any) -> set[str]:
    return {row["name"] for row in result.report().to_json()["invariants"] if row["verdict"] == "violated"}


def test_the_declared_contracts_follow_the_api_generation() -> None:
    """Generation 1 (the fork) declares the unchecked allocation; the frees are declared for both generations."""
    assert NanoVllmAdapter().capabilities.contracts == CONTRACTS | UNCHECKED
    assert {"release:repeated", "preempt:repeated", "release:never_admitted"} == CONTRACTS
    assert {"admit:unchecked", "resume:unchecked"} == UNCHECKED


def test_the_machine_draws_the_declared_frees_and_nano_vllm_keeps_them(tmp_path: Path) -> None:
    """Capabilities.contracts: the machine draws release/preempt with contract "repeated" (deallocate again) and
    release with "never_admitted" (deallocate of a fresh Sequence first); the fork's deallocate clears the
    Sequence's table and frees a fresh one's empty table, so neither frees anything: no safety invariant breaks.
    The report counts each as contract:OP:NAME:STATUS."""
    options = Options(profile=PROFILES["ci"], cases_dir=tmp_path, max_examples=40, refine=False, ignore=judging(*FREES))
    result = run_check(FreesOnly, "nano-vllm", options)
    coverage = result.report().to_json()["coverage"]
    for contract in sorted(CONTRACTS):
        assert coverage.get(f"contract:{contract}:ok", 0) > 0, (contract, coverage)
    assert _violated(result) == set(), result.failure


def test_a_seeded_bug_on_the_contract_path_is_reported(tmp_path: Path) -> None:
    ops = [Op("admit", "a", (1, 2, 3)), Op("release", "a", contract="repeated")]
    found = replay_ops(FreesAgain(), Config(capacity=4, block_size=2), ops, refine=False)
    assert found is not None and found.step == 1 and "non_negative_ref_counts" in found.failures, found
    kept = Tally(ignored=LOST_HITS)  # the fork's own lost hit on release (documented), not the contract's
    assert replay_ops(NanoVllmAdapter(), Config(capacity=4, block_size=2), ops, kept, refine=False) is None
    # The machine draws it too, and reports the contract op by name in the shrunk case.
    options = Options(
        profile=PROFILES["ci"], cases_dir=tmp_path, max_examples=100, refine=False, ignore=judging(*FREES)
    )
    result = run_check(FreesAgain, "frees-again", options)
    assert result.failure is not None, result.status
    assert {"non_negative_ref_counts", "ref_count_matches_references"} & set(result.failure.failures), result.failure
    assert any(op.contract == "repeated" for op in result.failure_ops), result.failure_ops


def test_a_free_of_a_never_admitted_request_that_frees_a_live_ones_blocks_is_reported(tmp_path: Path) -> None:
    """release:never_admitted: the plain release of a live request with, in the same step, the engine's free of a
    Sequence of its tokens that was never allocated. A free keyed by content (seeded) takes the live request's
    references: the kit reports it; the fork's frees nothing more."""
    ops = [Op("admit", "a", (1, 2, 3)), Op("admit", "b", (1, 2, 5)), Op("release", "a", contract="never_admitted")]
    found = replay_ops(FreesByContent(), Config(capacity=4, block_size=2), ops, refine=False)
    assert found is not None and found.step == 2, found
    assert {"ref_count_matches_references", "non_negative_ref_counts"} & set(found.failures), found
    assert replay_ops(NanoVllmAdapter(), Config(capacity=4, block_size=2), ops, refine=False) is None
    options = Options(profile=PROFILES["ci"], cases_dir=tmp_path, max_examples=60, refine=False, ignore=judging(*FREES))
    result = run_check(FreesByContent, "frees-by-content", options)
    assert result.failure is not None, result.status
    assert any(op.contract == "never_admitted" for op in result.failure_ops), result.failure_ops


UNCHECKED_SHORT = [Op("admit", "r0", (1000,)), Op("admit", "r1", (0, 0, 0), contract="unchecked")]
"""The minimal case: a 2-block pool holds one request's block; allocate(seq) of a 2-block prompt with no
can_allocate first takes and indexes the one free block for [0, 0], then raises (IndexError) on [0]."""


def test_allocate_without_can_allocate_is_not_atomic_when_the_pool_lacks_room() -> None:
    """admit:unchecked on generation 1: allocate takes blocks and indexes their hashes before it finds the free list
    empty and raises; the adapter answers refused and the checks judge what allocate left: a block held by no
    request (atomic_failure: a refusal changed the pool; ref_count_matches_references: the leaked reference)."""
    adapter = NanoVllmAdapter()
    adapter.reset(Config(capacity=2, block_size=2))
    outcomes = [adapter.apply(op) for op in UNCHECKED_SHORT]
    assert [o.status for o in outcomes] == ["ok", "refused"] and "IndexError" in outcomes[1].message, outcomes
    found = replay_ops(NanoVllmAdapter(), Config(capacity=2, block_size=2), UNCHECKED_SHORT, refine=False)
    assert found is not None and found.step == 1, found
    assert found.invariant == "atomic_failure" and "ref_count_matches_references" in found.failures, found
    checked = [UNCHECKED_SHORT[0], dataclasses.replace(UNCHECKED_SHORT[1], contract="")]
    assert replay_ops(NanoVllmAdapter(), Config(capacity=2, block_size=2), checked, refine=False) is None


def test_allocate_without_can_allocate_admits_what_can_allocate_refuses_spuriously() -> None:
    """Where the pool has room, the unchecked allocation is the spec's admission: the prompt that can_allocate
    refuses (it counts the hit on a running request's block as a free block taken) is admitted, hit included."""
    case = Case.load(CASES / "spurious-refusal.json")
    unchecked = [*case.ops[:-1], dataclasses.replace(case.ops[-1], contract="unchecked")]
    assert replay_ops(NanoVllmAdapter(), case.config, case.ops) is not None  # the documented finding
    assert replay_ops(NanoVllmAdapter(), case.config, unchecked) is None


def test_the_check_reports_the_unchecked_allocation_by_the_invariant_it_breaks(tmp_path: Path) -> None:
    """The ci profile's search, judging what a half-done allocation can break, reaches a pool that lacks room: the
    report names atomic_failure and its shrunk case is an unchecked admission."""
    options = Options(profile=PROFILES["ci"], cases_dir=tmp_path, max_examples=20, ignore=judging(*FREES))
    result = run_check(NanoVllmAdapter, "nano-vllm", options)
    assert result.failure is not None and result.failure.invariant == "atomic_failure", result.failure
    assert {"atomic_failure", "ref_count_matches_references"} <= _violated(result), _violated(result)
    assert result.failure_ops[-1].contract == "unchecked" and len(result.failure_ops) <= 3, result.failure_ops
    assert result.report().to_json()["coverage"].get("contract:admit:unchecked:refused", 0) > 0
