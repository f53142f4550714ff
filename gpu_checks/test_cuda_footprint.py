"""CUDA footprint assertions on a real device: N KV blocks as torch tensors take N x the theoretical size.

Run with ``pytest gpu_checks``. Without CUDA every test here is skipped, and says why; the
CPU-computable parts live in ``tests/test_gpu_checks.py`` and run everywhere.
"""

from __future__ import annotations

import pytest

from kvspec.gpu_checks.checks import Check
from kvspec.gpu_checks.cuda_probe import ProbeCase, TorchCudaBackend, cuda_missing, judge, measure, probe
from kvspec.gpu_checks.footprint import KV_DTYPES, KVBlockShape

torch = pytest.importorskip(
    "torch", reason="no CUDA device: torch is not installed (install the kit's gpu extra: pip install 'kvspec[gpu]')"
)

NO_CUDA = cuda_missing()
pytestmark = pytest.mark.skipif(NO_CUDA is not None, reason=NO_CUDA or "")

DTYPES = [d for d in KV_DTYPES if isinstance(getattr(torch, d, None), torch.dtype)]
SHAPES = [
    KVBlockShape(block_tokens=16, kv_heads=8, head_dim=128, dtype="bfloat16", num_layers=32),  # Llama-3-8B
    KVBlockShape(block_tokens=32, kv_heads=2, head_dim=32, dtype="bfloat16", num_layers=2),
    KVBlockShape(block_tokens=3, kv_heads=1, head_dim=100, dtype="bfloat16", num_layers=2),  # no 512 multiple
]


def failed(checks: list[Check]) -> list[str]:
    return [c.line() for c in checks if not c.held]


@pytest.fixture(scope="module")
def backend() -> TorchCudaBackend:
    return TorchCudaBackend()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s.tensor_shape)))
@pytest.mark.parametrize("n_blocks", [1, 7, 64])
@pytest.mark.parametrize("layout", ["per_block", "per_layer_pool"])
def test_n_blocks_take_n_times_the_theoretical_size(
    backend: TorchCudaBackend, dtype: str, shape: KVBlockShape, n_blocks: int, layout: str
) -> None:
    case = ProbeCase(shape.with_dtype(dtype), n_blocks, layout)  # type: ignore[arg-type]
    checks, records = probe(backend, [case], repeats=3)
    assert not failed(checks), "\n".join(failed(checks))
    run = records[0]["runs"][0]
    assert run["requested_delta"] in (None, case.theoretical_bytes)


def test_small_pool_growth_is_exactly_the_rounded_size(backend: TorchCudaBackend) -> None:
    shape = KVBlockShape(block_tokens=3, kv_heads=1, head_dim=100, dtype="bfloat16", num_layers=1)  # 1200 B
    run = measure(backend, ProbeCase(shape, 10))
    assert run.allocated == 10 * 1536 and run.peak == run.allocated and run.after_free == 0


def test_a_formula_without_k_and_v_is_caught_on_the_device(backend: TorchCudaBackend) -> None:
    real = KVBlockShape(block_tokens=16, kv_heads=8, head_dim=128, dtype="bfloat16", num_layers=4)
    runs = [measure(backend, ProbeCase(real, 8)) for _ in range(2)]
    as_if_no_v = ProbeCase(KVBlockShape(16, 4, 128, "bfloat16", 4), 8)  # half the bytes per block
    assert failed(judge(as_if_no_v, runs))
    assert not failed(judge(ProbeCase(real, 8), runs))


def test_freeing_returns_to_baseline_and_the_figure_is_stable(backend: TorchCudaBackend) -> None:
    case = ProbeCase(KVBlockShape(16, 8, 128, "float16", 32), 32)
    runs = [measure(backend, case) for _ in range(5)]
    assert {r.allocated for r in runs} == {32 * 32 * 65536}
    assert all(r.after_free == 0 for r in runs)


def test_device_record_names_the_device_and_versions(backend: TorchCudaBackend) -> None:
    from kvspec.gpu_checks.cuda_probe import environment

    env = environment(backend)
    assert env["device_name"] and env["torch"] == torch.__version__ and env["torch_cuda"] == torch.version.cuda
