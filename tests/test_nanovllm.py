"""The nano-vllm adapter against the real package from PyPI (``nano-vllm-fork``, installed with --no-deps).

``.ci/run`` installs it (``kvspec[nanovllm]`` and ``pip install --no-deps nano-vllm-fork``); without it these
tests skip. The package's ``nanovllm/__init__`` imports torch: the adapter must never run it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("xxhash", reason="nano-vllm extra not installed: pip install 'kvspec[nanovllm]'")
if __import__("importlib.util").util.find_spec("nanovllm") is None:
    pytest.skip("nano-vllm not installed: pip install --no-deps nano-vllm-fork", allow_module_level=True)

from kvspec.adapters.nano_vllm import NanoVllmAdapter
from kvspec.spec import Config, Op
from kvspec.stateful_tests import PROFILES, Case, Options, replay_ops, run_check

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
    the block's key (f64d821) break hit_keeps_key there; the fork has neither (its lost hits are judged by the
    refinement checks, left out here)."""
    case = Case.load(CASES / f"{name}.json")
    assert case.expected["invariant"] == "hit_keeps_key"
    assert replay_ops(NanoVllmAdapter(), case.config, case.ops, refine=False) is None


def test_the_check_runs_in_its_child_process_and_reports_a_documented_finding(tmp_path: Path) -> None:
    """The random phase alone (no coverage cases) finds one of the two documented findings; nothing else breaks."""
    result = run_check(
        NanoVllmAdapter, "nano-vllm", Options(profile=PROFILES["ci"], cases_dir=tmp_path, max_examples=30)
    )
    assert result.exit_code == 1, (result.status, result.error)
    assert result.failure is not None
    assert set(result.failure.failures) <= {
        "index_completeness",
        "predicted_admission",
        "predicted_prefix_hits",
        "predicted_free_capacity",
        "no_spurious_refusal",
    }, result.failure
    assert "API generation 1" in result.adapter_version


class FreesAgain(NanoVllmAdapter):
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


def _contract_steps(result: Any) -> int:
    return sum(v for k, v in result.tally.coverage.items() if k.startswith("contract:"))


def test_the_machine_draws_the_declared_repeated_free_and_nano_vllm_keeps_it(tmp_path: Path) -> None:
    """Capabilities.contracts: the machine draws release/preempt with contract "repeated" (deallocate again);
    the fork's deallocate clears the Sequence's table, so the repeat frees nothing: no safety invariant breaks."""
    assert NanoVllmAdapter().capabilities.contracts == {"release:repeated", "preempt:repeated"}
    result = run_check(
        NanoVllmAdapter, "nano-vllm", Options(profile=PROFILES["ci"], cases_dir=tmp_path, max_examples=40, refine=False)
    )
    assert _contract_steps(result) > 0, result.tally.coverage
    broken = {row["name"] for row in result.report().to_json()["invariants"] if row["verdict"] == "violated"}
    assert broken <= {"no_spurious_refusal"}, broken  # the documented policy finding, nothing of the contract


def test_a_seeded_bug_on_the_contract_path_is_reported(tmp_path: Path) -> None:
    ops = [Op("admit", "a", (1, 2, 3)), Op("release", "a", contract="repeated")]
    found = replay_ops(FreesAgain(), Config(capacity=4, block_size=2), ops, refine=False)
    assert found is not None and found.step == 1 and "non_negative_ref_counts" in found.failures, found
    assert replay_ops(NanoVllmAdapter(), Config(capacity=4, block_size=2), ops, refine=False) is None
    # The machine draws it too, and reports the contract op by name in the shrunk case.
    result = run_check(
        FreesAgain, "frees-again", Options(profile=PROFILES["ci"], cases_dir=tmp_path, max_examples=100, refine=False)
    )
    assert result.failure is not None, result.status
    assert {"non_negative_ref_counts", "ref_count_matches_references"} & set(result.failure.failures), result.failure
    assert any(op.contract == "repeated" for op in result.failure_ops), result.failure_ops
