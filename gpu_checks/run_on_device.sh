#!/usr/bin/env bash
# The whole GPU part of kvspec, prepared for one run on a machine with one CUDA GPU (under 5 minutes).
#
#   bash gpu_checks/run_on_device.sh            # results in $OUT (default: build/gpu)
#
# 1. Python: $PYTHON if set, else python3 when its torch already sees a GPU (a CUDA image),
#    else a fresh venv with the kit's gpu extra (needs a package index).
# 2. kvspec is installed without dependencies into $WORK/site (the image's torch, pytest and
#    hypothesis are used as they are), so nothing needs the network on a CUDA image.
# 3. pytest gpu_checks tests/test_gpu_checks.py   -> $OUT/pytest.log, $OUT/pytest.xml
# 4. kvspec gpu-check --require-cuda --json $OUT/gpu_footprint.json
# 5. the live vLLM server check, when vLLM is importable -> $OUT/vllm_live.json
#
# Exit code: that of gpu-check (0 held, 1 footprint mismatch, 2 could not run), or the
# first failure of the other steps. Every step is time-limited; the log says which ran.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/build/gpu}
WORK=${KVSPEC_GPU_WORK:-${TMPDIR:-/tmp}/kvspec-gpu}
mkdir -p "$OUT" "$WORK"
unset PYTORCH_CUDA_ALLOC_CONF PYTORCH_ALLOC_CONF  # the footprint rule is that of the default allocator
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
started=$(date +%s)
say() { echo "[run_on_device $(($(date +%s) - started))s] $*" | tee -a "$OUT/run.log"; }

has_cuda_torch() { "$1" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }

if [[ -n "${PYTHON:-}" ]]; then
    PY=$PYTHON
elif has_cuda_torch python3; then
    PY=$(command -v python3)
else
    say "python3 has no CUDA torch: creating $WORK/venv with the kit's gpu extra"
    python3 -m venv "$WORK/venv" && "$WORK/venv/bin/pip" install -q -e "$ROOT[gpu]" || { say "venv failed"; exit 2; }
    PY=$WORK/venv/bin/python
fi
say "python: $PY ($("$PY" -P -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1))"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$OUT/run.log"

# Install the kit (no deps, no build isolation: offline) unless this Python already imports it.
if ! "$PY" -P -c 'import kvspec.cli' 2>/dev/null; then
    rm -rf "$WORK/site"
    "$PY" -m pip install -q --no-deps --no-build-isolation --no-compile --target "$WORK/site" "$ROOT" \
        >>"$OUT/run.log" 2>&1 || { say "installing kvspec failed (see run.log)"; exit 2; }
    export PYTHONPATH=$WORK/site${PYTHONPATH:+:$PYTHONPATH}
fi
"$PY" -P -c 'import kvspec.cli' || { say "kvspec.cli does not import"; exit 2; }

# importlib mode: the source folder kvspec/ must not shadow the installed package; the kit's
# pytest plugin (the conformance suite) is not needed here.
say "pytest gpu_checks tests/test_gpu_checks.py"
timeout 150 "$PY" -P -m pytest -q -rs -p no:kvspec -p no:cacheprovider --import-mode=importlib \
    --junitxml="$OUT/pytest.xml" gpu_checks tests/test_gpu_checks.py >"$OUT/pytest.log" 2>&1
pytest_rc=$?
tail -n 15 "$OUT/pytest.log"
say "pytest exit $pytest_rc"

GPU_CHECK=("$PY" -P -m kvspec.cli gpu-check)
say "${GPU_CHECK[*]} --require-cuda --json $OUT/gpu_footprint.json"
timeout 120 "${GPU_CHECK[@]}" --require-cuda --json "$OUT/gpu_footprint.json" 2>&1 | tee "$OUT/gpu_check.log"
check_rc=${PIPESTATUS[0]}
say "gpu-check exit $check_rc"

live_rc=0
if "$PY" -P -c 'import vllm.v1.kv_cache_interface' 2>/dev/null; then
    say "live vLLM server check"
    timeout 200 "$PY" -P -m kvspec.gpu_checks.live_vllm --timeout 150 --json "$OUT/vllm_live.json" 2>&1 | tail -n 20
    live_rc=${PIPESTATUS[0]}
    say "live vLLM exit $live_rc"
else
    say "SKIP live vLLM server check: vLLM not installed for $PY"
fi

say "done in $(($(date +%s) - started)) s; results in $OUT"
if [[ $check_rc -ne 0 ]]; then exit "$check_rc"; fi
if [[ $pytest_rc -ne 0 ]]; then exit 1; fi
exit "$live_rc"
