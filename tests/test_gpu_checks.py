"""The CPU side of the GPU checks: byte arithmetic, the allocator rule, agreement checks, the CLI.

Every check is also shown to bite: a wrong table, a formula that forgets the factor 2 for
K and V, an allocator that does not round, leaks or drifts, a server over its budget.
torch and vLLM are optional: the tests that need them skip with the reason.
"""

from __future__ import annotations

import json
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvspec.cli import main as kvspec_main
from kvspec.gpu_checks import sections as gpu_sections
from kvspec.gpu_checks.checks import Check, Section, compare
from kvspec.gpu_checks.cuda_probe import CannotProbe, ProbeCase, cuda_missing, default_cases, judge, measure, probe
from kvspec.gpu_checks.footprint import (
    DTYPE_BYTES,
    KV_DTYPES,
    MODEL_SHAPES,
    KVBlockShape,
    blocks_in_budget,
    canonical_dtype,
    element_bytes,
    kv_bytes_for_pool,
    kv_bytes_for_tokens,
)
from kvspec.gpu_checks.rounding import (
    SMALL_ALLOC_BYTES,
    expandable_segments,
    expected_growth,
    round_up,
    unsupported_alloc_conf,
)
from kvspec.gpu_checks.vllm_agreement import (
    check_budget,
    check_page_sizes,
    parse_cache_config_info,
    shape_from_hf_config,
)
from kvspec.spec import Config

LLAMA3_8B = KVBlockShape(block_tokens=16, kv_heads=8, head_dim=128, dtype="bfloat16", num_layers=32)


def forgets_k_and_v(shape: KVBlockShape) -> int:
    """A seeded wrong formula: one tensor per block instead of K and V."""
    return shape.block_tokens * shape.kv_heads * shape.head_dim * shape.element_bytes


def failed(checks: list[Check]) -> list[str]:
    return [c.name for c in checks if not c.held]


# -- the arithmetic, against hand-computed values ---------------------------------------


def test_llama3_8b_bf16_block_is_64_kib_per_layer_and_2_mib_per_block() -> None:
    # 2 (K, V) x 16 tokens x 8 KV heads x 128 head_dim x 2 bytes
    assert LLAMA3_8B.bytes_per_layer == 2 * 16 * 8 * 128 * 2 == 65536
    assert LLAMA3_8B.bytes_per_block == 65536 * 32 == 2 * 1024 * 1024
    assert LLAMA3_8B.bytes_per_token == 2 * 8 * 128 * 2 * 32 == 131072
    assert MODEL_SHAPES["llama-3-8b"] == LLAMA3_8B


@pytest.mark.parametrize(
    ("shape", "per_layer", "per_block"),
    [
        (KVBlockShape(16, 8, 128, "float16", 32), 65536, 2097152),
        (KVBlockShape(16, 8, 128, "float8_e4m3fn", 32), 32768, 1048576),
        (KVBlockShape(16, 8, 128, "float8_e5m2", 32), 32768, 1048576),
        (KVBlockShape(16, 8, 128, "float32", 32), 131072, 4194304),
        (KVBlockShape(16, 8, 128, "bfloat16", 80), 65536, 5242880),  # llama-3-70b
        (KVBlockShape(16, 4, 128, "bfloat16", 28), 32768, 917504),  # qwen2.5-7b
        (KVBlockShape(32, 2, 32, "bfloat16", 2), 8192, 16384),  # the tiny CPU model
        (KVBlockShape(3, 1, 100, "float16", 1), 1200, 1200),
        (KVBlockShape(1, 1, 1, "fp8", 1), 2, 2),
    ],
)
def test_sizes_match_hand_computed_values(shape: KVBlockShape, per_layer: int, per_block: int) -> None:
    assert (shape.bytes_per_layer, shape.bytes_per_block) == (per_layer, per_block)


def test_dtype_aliases_and_element_sizes() -> None:
    assert canonical_dtype("bf16") == canonical_dtype("torch.bfloat16") == "bfloat16"
    assert canonical_dtype("fp8") == "float8_e4m3fn" and canonical_dtype("FP8_E5M2") == "float8_e5m2"
    assert [element_bytes(d) for d in ("float32", "half", "bfloat16", "fp8_e4m3")] == [4, 2, 2, 1]
    assert KVBlockShape(16, 8, 128, "bf16", 32) == LLAMA3_8B  # stored under the canonical name
    assert set(KV_DTYPES) <= set(DTYPE_BYTES)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"block_tokens": 0},
        {"kv_heads": -1},
        {"head_dim": 0},
        {"num_layers": 0},
        {"block_tokens": 16.0},
        {"kv_heads": True},
        {"head_dim": "128"},
        {"dtype": "int4"},
        {"dtype": "float64"},
        {"dtype": None},
    ],
)
def test_bad_shapes_raise_value_error_naming_the_field(kwargs: dict[str, Any]) -> None:
    good: dict[str, Any] = {"block_tokens": 16, "kv_heads": 8, "head_dim": 128, "dtype": "bfloat16", "num_layers": 2}
    with pytest.raises(ValueError, match=next(iter(kwargs)) if "dtype" not in kwargs else "dtype"):
        KVBlockShape(**{**good, **kwargs})


def test_pool_bytes_tie_the_spec_block_count_to_bytes() -> None:
    config = Config(capacity=8, block_size=16)
    assert kv_bytes_for_pool(config, LLAMA3_8B) == 8 * 2 * 1024 * 1024
    with pytest.raises(ValueError, match="block_size"):
        kv_bytes_for_pool(Config(capacity=8, block_size=4), LLAMA3_8B)
    with pytest.raises(ValueError, match="Config"):
        kv_bytes_for_pool({"capacity": 8}, LLAMA3_8B)  # type: ignore[arg-type]


def test_tail_rounding_in_bytes_and_blocks_in_a_budget() -> None:
    per_block = LLAMA3_8B.bytes_per_block
    blocks = [kv_bytes_for_tokens(n, LLAMA3_8B) // per_block for n in (0, 1, 16, 17, 32)]
    assert blocks == [0, 1, 1, 2, 2]
    assert kv_bytes_for_tokens(17, LLAMA3_8B) == 2 * per_block
    assert blocks_in_budget(per_block * 10 + per_block - 1, LLAMA3_8B) == 10
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError):
            kv_bytes_for_tokens(bad, LLAMA3_8B)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            blocks_in_budget(bad, LLAMA3_8B)  # type: ignore[arg-type]


# -- the allocator's rounding rule ------------------------------------------------------


def test_round_up_is_512_byte_granular_with_a_512_byte_minimum() -> None:
    assert [round_up(n) for n in (0, 1, 511, 512, 513, 1200, 65536)] == [512, 512, 512, 512, 1024, 1536, 65536]
    with pytest.raises(ValueError):
        round_up(-1)


def test_expected_growth_is_exact_in_the_small_pool_and_bounded_in_the_large_one() -> None:
    small = expected_growth(10, 1200)
    assert small.exact and (small.requested, small.low) == (12000, 15360)
    assert small.admits(15360) and not small.admits(12000) and not small.admits(15361)
    large = expected_growth(2, SMALL_ALLOC_BYTES + 1)
    assert not large.exact and large.high - large.low == 2 * (1 << 20)
    assert expected_growth(2, SMALL_ALLOC_BYTES + 1, expandable_segments=True).exact


def test_allocator_configurations_the_rule_does_not_model_are_named() -> None:
    assert unsupported_alloc_conf("") is None
    assert unsupported_alloc_conf("expandable_segments:True") is None
    for conf in ("backend:cudaMallocAsync", "roundup_power2_divisions:4", "max_split_size_mb:128"):
        assert unsupported_alloc_conf(conf) is not None
    assert expandable_segments("garbage_collection_threshold:0.6, expandable_segments:True")
    assert not expandable_segments("expandable_segments:False")


# -- the CUDA probe's logic, on a simulated allocator -------------------------------------


class _Tensor:
    """A stand-in for a device tensor: the simulated allocator frees its block when it is collected."""


@dataclass
class FakeAllocator:
    """PyTorch's caching-allocator accounting, simulated, with switchable bugs to show the checks bite."""

    bug: str = ""
    expandable_segments: bool = False
    allocated: int = 0
    peak: int = 0
    requested: int = 0
    reps: int = 0
    live: dict[int, tuple[int, int]] = field(default_factory=dict)

    def _release(self, key: int) -> None:
        block, asked = self.live.pop(key)
        if self.bug != "leak":
            self.allocated -= block
        self.requested -= asked

    def allocate(self, shape: tuple[int, ...], dtype: str) -> object:
        nbytes = element_bytes(dtype)
        for dim in shape:
            nbytes *= dim
        block = nbytes if self.bug == "no_rounding" else round_up(nbytes)
        if self.bug == "drift":
            block += 512 * self.reps
        if self.bug == "over_budget":
            block += 2 << 20
        self.allocated += block
        self.peak = max(self.peak, self.allocated + (4096 if self.bug == "spike" else 0))
        self.requested += nbytes // 2 if self.bug == "half_requested" else nbytes

        handle = _Tensor()
        key = id(handle)
        self.live[key] = (block, nbytes // 2 if self.bug == "half_requested" else nbytes)
        weakref.finalize(handle, self._release, key)  # dropping the handle frees, as with a tensor
        return handle

    def synchronize(self) -> None: ...

    def empty_cache(self) -> None:
        self.reps += 1

    def reset_peak(self) -> None:
        self.peak = self.allocated

    def memory_allocated(self) -> int:
        return self.allocated

    def max_memory_allocated(self) -> int:
        return self.peak

    def memory_reserved(self) -> int:
        return self.allocated

    def requested_bytes(self) -> int | None:
        return None if self.bug == "no_requested_stat" else self.requested


ODD = KVBlockShape(block_tokens=3, kv_heads=1, head_dim=100, dtype="bfloat16", num_layers=2)  # 1200 B per layer
CASES = [
    ProbeCase(LLAMA3_8B, 7, "per_block"),
    ProbeCase(ODD, 5, "per_block"),
    ProbeCase(ODD, 64, "per_layer_pool"),
    ProbeCase(LLAMA3_8B.with_dtype("fp8"), 64, "per_layer_pool"),  # 2 MiB tensors: the large pool
]


def test_probe_on_a_faithful_allocator_holds_and_records_the_figures() -> None:
    checks, records = probe(FakeAllocator(), CASES, repeats=3)
    assert checks and not failed(checks)
    first = records[0]
    assert first["theoretical_bytes"] == 7 * 2 * 1024 * 1024 and first["tensors"] == 7 * 32
    assert [r["allocated_delta"] for r in first["runs"]] == [7 * 2 * 1024 * 1024] * 3
    odd = records[1]
    assert odd["expected"]["allocated_low"] == 5 * 2 * 1536 and odd["runs"][0]["requested_delta"] == 5 * 2 * 1200
    json.dumps(records)


@pytest.mark.parametrize(
    ("bug", "bites"),
    [
        ("no_rounding", "memory_allocated growth"),  # 1200-byte tensors measured as 1200, not 1536
        ("leak", "back at baseline after free"),
        ("drift", "stable across repetitions"),
        ("spike", "max_memory_allocated growth"),
        ("half_requested", "requested_bytes growth"),
        ("over_budget", "memory_allocated growth"),
    ],
)
def test_each_probe_assertion_bites(bug: str, bites: str) -> None:
    checks, records = probe(FakeAllocator(bug=bug), CASES, repeats=2)
    assert any(bites in name for name in failed(checks)), failed(checks)
    assert not all(r["held"] for r in records)


def test_without_a_requested_bytes_stat_the_other_checks_still_run() -> None:
    checks, _ = probe(FakeAllocator(bug="no_requested_stat"), CASES[:1], repeats=2)
    assert not failed(checks) and not any("requested" in c.name for c in checks)


def test_a_wrong_theoretical_size_is_caught_by_the_measured_growth() -> None:
    # Measure the real shape, judge it against a formula that forgot K and V (half the heads' bytes).
    runs = [measure(FakeAllocator(), ProbeCase(LLAMA3_8B, 4)) for _ in range(2)]
    halved = ProbeCase(KVBlockShape(16, 4, 128, "bfloat16", 32), 4)
    assert "rep 0: requested_bytes growth == N x bytes_per_block" in failed(judge(halved, runs))


def test_probe_cases_validate_and_the_default_grid_exercises_rounding() -> None:
    with pytest.raises(ValueError):
        ProbeCase(LLAMA3_8B, 0)
    with pytest.raises(ValueError):
        ProbeCase(LLAMA3_8B, 2, "sideways")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        probe(FakeAllocator(), CASES, repeats=0)
    grid = default_cases()
    assert {c.shape.dtype for c in grid} == set(KV_DTYPES)
    assert {c.layout for c in grid} == {"per_block", "per_layer_pool"}
    assert any(c.shape.bytes_per_layer % 512 for c in grid)
    assert len({c.n_blocks for c in grid}) >= 3 and len({c.shape.block_tokens for c in grid}) >= 2
    peak = max(c.expected().high for c in grid)
    assert peak < 3 * 1024**3


# -- torch on the CPU: meta and CPU tensors -----------------------------------------------


def test_torch_dtype_table_agrees_and_a_wrong_table_is_caught() -> None:
    pytest.importorskip("torch", reason="torch is not installed (the kit's gpu extra)")
    from kvspec.gpu_checks.torch_crosscheck import check_dtype_table

    checks, absent = check_dtype_table()
    assert checks and not failed(checks)
    assert not set(KV_DTYPES) & set(absent), f"this torch build lacks {absent}"
    wrong, _ = check_dtype_table({**DTYPE_BYTES, "float16": 1, "float8_e5m2": 2})
    assert set(failed(wrong)) == {
        "float16: finfo bits / 8",
        "float16: element_size()",
        "float8_e5m2: finfo bits / 8",
        "float8_e5m2: element_size()",
    }


SHAPES = [
    KVBlockShape(b, h, d, dtype, 1)
    for b, h, d in ((16, 8, 128), (32, 2, 32), (3, 1, 100), (1, 1, 1), (128, 4, 64))
    for dtype in (*KV_DTYPES, "float32")
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s.tensor_shape}-{s.dtype}")
def test_meta_and_cpu_tensors_take_the_formula_bytes(shape: KVBlockShape) -> None:
    pytest.importorskip("torch", reason="torch is not installed (the kit's gpu extra)")
    from kvspec.gpu_checks.torch_crosscheck import tensor_bytes

    for device in ("meta", "cpu"):
        assert tensor_bytes(shape, device) == (shape.bytes_per_layer, shape.bytes_per_layer)


def test_torch_tensor_check_catches_a_formula_without_the_factor_two() -> None:
    pytest.importorskip("torch", reason="torch is not installed (the kit's gpu extra)")
    from kvspec.gpu_checks.torch_crosscheck import check_tensor_bytes

    assert not failed(check_tensor_bytes(SHAPES))
    wrong = check_tensor_bytes(SHAPES[:2], formula=forgets_k_and_v)
    assert wrong and len(failed(wrong)) == len(wrong)


# -- agreement with vLLM ------------------------------------------------------------------

# vLLM 0.32's FullAttentionSpec.page_size_bytes for these shapes, computed by hand from its
# definition (num_kv_heads x block_size x (head_size + head_size_v) x dtype size).
VLLM_PAGE_BYTES = {
    (16, 8, 128, "bfloat16"): 65536,
    (16, 8, 128, "float8_e4m3fn"): 32768,
    (32, 2, 32, "bfloat16"): 8192,
    (16, 4, 128, "float16"): 32768,
}


def hand_vllm(shape: KVBlockShape) -> int:
    return VLLM_PAGE_BYTES[(shape.block_tokens, shape.kv_heads, shape.head_dim, shape.dtype)]


AGREEMENT_SHAPES = [KVBlockShape(b, h, d, t, 4) for (b, h, d, t) in VLLM_PAGE_BYTES]


def test_page_size_agreement_holds_and_a_seeded_wrong_formula_is_reported() -> None:
    assert not failed(check_page_sizes(AGREEMENT_SHAPES, reference=hand_vllm))
    wrong = check_page_sizes(AGREEMENT_SHAPES, reference=hand_vllm, kit=forgets_k_and_v)
    assert len(failed(wrong)) == len(AGREEMENT_SHAPES)
    assert wrong[0].expected == 65536 and wrong[0].measured == 32768


def test_vllm_own_kv_cache_spec_agrees_with_the_kit() -> None:
    pytest.importorskip("torch", reason="vLLM not installed (and torch is missing too)")
    from kvspec.gpu_checks.vllm_agreement import vllm_page_size
    from kvspec.vllm_env import vllm_missing

    reason = vllm_missing()
    if reason is not None:
        pytest.skip(reason)
    shapes = [s.with_dtype(d) for s in MODEL_SHAPES.values() for d in KV_DTYPES] + AGREEMENT_SHAPES
    assert not failed(check_page_sizes(shapes))
    assert [vllm_page_size(s) for s in AGREEMENT_SHAPES] == [hand_vllm(s) for s in AGREEMENT_SHAPES]
    assert len(failed(check_page_sizes(shapes, kit=forgets_k_and_v))) == len(shapes)


METRICS = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="32",cache_dtype="auto",enable_prefix_caching="True",num_gpu_blocks="256"} 1.0
vllm:num_requests_running{engine="0"} 0.0
"""
TINY = MODEL_SHAPES["tiny-llama-cpu"]


def test_cache_config_info_is_parsed_from_a_metrics_page() -> None:
    info = parse_cache_config_info(METRICS)
    assert info["num_gpu_blocks"] == "256" and info["block_size"] == "32"
    with pytest.raises(ValueError, match="cache_config_info"):
        parse_cache_config_info("vllm:num_requests_running 0\n")


def test_budget_check_holds_for_a_full_budget_and_bites_otherwise() -> None:
    budget = 4 * 1024 * 1024  # 4 MiB / 16 KiB per block (2 layers x 8 KiB) = 256 blocks
    assert not failed(check_budget(256, TINY, budget))
    assert failed(check_budget(257, TINY, budget)) == [
        "blocks x bytes_per_block fits the KV cache budget",
        "num_gpu_blocks == budget // bytes_per_block",
    ]
    assert failed(check_budget(200, TINY, budget)) == ["num_gpu_blocks == budget // bytes_per_block"]
    assert not failed(check_budget(64, TINY, budget, overridden=True))
    # a kit that forgot K and V would predict 512 blocks in the same budget
    assert blocks_in_budget(budget, TINY) == 256 != budget // (2 * forgets_k_and_v(TINY))


def test_shape_from_a_hugging_face_config() -> None:
    llama = {
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "torch_dtype": "bfloat16",
    }
    assert shape_from_hf_config(llama, 16) == LLAMA3_8B
    tiny = {"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "hidden_size": 128}
    assert shape_from_hf_config({**tiny, "num_hidden_layers": 2}, 32, "bf16") == TINY
    with pytest.raises(ValueError, match="dtype"):
        shape_from_hf_config({**tiny, "num_hidden_layers": 2}, 32)
    with pytest.raises(ValueError, match="decoder"):
        shape_from_hf_config(tiny, 32, "bf16")


# -- sections and the command line --------------------------------------------------------


def test_section_verdicts() -> None:
    ok, bad = compare("a", 1, 1), compare("b", 1, 2)
    assert Section("s", checks=[ok]).held and not Section("s", checks=[ok]).violated
    assert Section("s", checks=[ok, bad]).violated and "FAIL" in bad.line()
    skipped = Section("s", skipped="why")
    assert not skipped.held and not skipped.violated and skipped.to_json() == {"skipped": "why"}


def test_cuda_skip_reason_is_clear_on_this_machine() -> None:
    reason = cuda_missing()
    if reason is None:
        pytest.skip("this machine has a CUDA device: gpu_checks/test_cuda_footprint.py measures it")
    assert reason.startswith("no CUDA device: ")
    assert "torch" in reason


def run_cli(argv: list[str], tmp_path: Path) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "gpu.json"
    code = kvspec_main(["gpu-check", "--json", str(out), *argv])
    return code, json.loads(out.read_text())


def test_cli_without_cuda_runs_the_cpu_parts_skips_cuda_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if cuda_missing() is None:
        pytest.skip("this machine has a CUDA device")
    code, record = run_cli([], tmp_path)
    printed = capsys.readouterr().out
    assert code == 0 and record["exit_code"] == 0 and record["verdict"] == "held"
    assert record["cuda"]["skipped"].startswith("no CUDA device: ")
    assert f"SKIP cuda: {record['cuda']['skipped']}" in printed
    assert record["arithmetic"]["held"] and record["kvspec_gpu_check"] == 1
    assert record["arithmetic"]["models"]["llama-3-8b"]["bfloat16"]["bytes_per_layer"] == 65536
    assert "held" in record["torch"] or record["torch"]["skipped"].startswith("torch is not installed")


def test_cli_require_cuda_turns_the_skip_into_could_not_run(tmp_path: Path) -> None:
    if cuda_missing() is None:
        pytest.skip("this machine has a CUDA device")
    code, record = run_cli(["--require-cuda"], tmp_path)
    assert code == 2 and record["verdict"] == "could_not_run" and "skipped" in record["cuda"]


def test_cli_rejects_a_non_positive_repeat_count(tmp_path: Path) -> None:
    assert kvspec_main(["gpu-check", "--repeats", "0"]) == 2


def with_fake_cuda(monkeypatch: pytest.MonkeyPatch, make: Callable[[], object]) -> None:
    monkeypatch.setattr(gpu_sections, "cuda_missing", lambda: None)
    monkeypatch.setattr(gpu_sections, "TorchCudaBackend", make)
    monkeypatch.setattr(gpu_sections, "environment", lambda backend=None: {"device_name": "simulated"})
    monkeypatch.setattr(gpu_sections, "default_cases", lambda dtypes: CASES)


def test_cli_with_a_faithful_allocator_exits_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with_fake_cuda(monkeypatch, FakeAllocator)
    code, record = run_cli(["--repeats", "2", "--require-cuda"], tmp_path)
    assert code == 0 and record["cuda"]["held"] and len(record["cuda"]["cases"]) == len(CASES)
    assert record["cuda"]["environment"]["device_name"] == "simulated"


def test_cli_reports_a_footprint_mismatch_with_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with_fake_cuda(monkeypatch, lambda: FakeAllocator(bug="leak"))
    code, record = run_cli([], tmp_path)
    assert code == 1 and record["verdict"] == "violated" and not record["cuda"]["held"]
    assert any("baseline" in f["name"] for case in record["cuda"]["cases"] for f in case["failed"])


def test_cli_cannot_probe_an_unmodelled_allocator_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> object:
        raise CannotProbe("PYTORCH_CUDA_ALLOC_CONF sets roundup_power2_divisions")

    with_fake_cuda(monkeypatch, refuse)
    code, record = run_cli([], tmp_path)
    assert code == 2 and "roundup_power2_divisions" in record["cuda"]["skipped"]


# -- the live vLLM server (opt-in: it builds a tiny model and starts a server, about a minute) ----


def test_live_check_without_vllm_cannot_run_and_says_why(tmp_path: Path) -> None:
    from kvspec.gpu_checks import live_vllm
    from kvspec.vllm_env import vllm_missing

    if vllm_missing() is None:
        pytest.skip("vLLM is installed here: test_live_vllm_server_fits_its_budget covers the live check")
    out = tmp_path / "live.json"
    assert live_vllm.main(["--json", str(out)]) == 2
    assert json.loads(out.read_text())["skipped"].startswith("vLLM not installed")


@pytest.mark.skipif(os.environ.get("KVSPEC_LIVE_VLLM") != "1", reason="opt-in: set KVSPEC_LIVE_VLLM=1")
def test_live_vllm_server_fits_its_budget(tmp_path: Path) -> None:
    from kvspec.gpu_checks import live_vllm
    from kvspec.vllm_env import vllm_missing

    reason = vllm_missing()
    if reason is not None:
        pytest.skip(reason)
    out = tmp_path / "live.json"
    code = live_vllm.main(["--json", str(out), "--workdir", str(tmp_path / "work")])
    record = json.loads(out.read_text())
    assert code == 0, record
    assert record["cache_config_info"]["num_gpu_blocks"] == str(4 * 1024 * 1024 // TINY.bytes_per_block)
