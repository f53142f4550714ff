# Two entry points for a fresh machine: `make check` and `make test`.
# Both create the virtual environment on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.kvspec-installed
TYPECHECK_DIR := build/typecheck

GPU_VENV ?= .venv-gpu
GPU_STAMP := $(GPU_VENV)/.kvspec-installed

# The kit's tests run in this many pytest-xdist processes (auto: one per core).
PYTEST_WORKERS ?= auto

.PHONY: check test test-slow lint typecheck importlint bench gpu-check formal clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

## Run the conformance suite against the embedded default adapter (the paged reference) and its eviction policies.
check: $(STAMP)
	$(BIN)/kvspec check --adapter reference --profile ci
	for a in reference-score reference-shared-aware reference-family-protect; do \
		$(BIN)/kvspec check --adapter $$a --profile ci --quiet || exit $$?; done

## The kit's own core tests in parallel, after lint, type and architecture checks (about 4 min on 2 cores).
test: lint $(STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) -m "not slow"

## The slow tier: the long end-to-end tests (marked slow); CI runs it beside `make test`.
test-slow: $(STAMP)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) -m slow

lint: $(STAMP) typecheck importlint
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy cannot follow the package-dir mapping of an editable install: check an installed copy.
typecheck: $(STAMP)
	rm -rf $(TYPECHECK_DIR) build/lib  # setuptools reuses build/lib: a deleted module would linger there
	$(BIN)/python -m pip install -q --no-deps --no-compile --target $(TYPECHECK_DIR) .
	cd $(TYPECHECK_DIR) && ../../$(BIN)/mypy --cache-dir ../mypy-cache -p kvspec

# import-linter reads the same installed copy, where kvspec.spec etc. are real subpackages.
importlint: typecheck
	cd $(TYPECHECK_DIR) && ../../$(BIN)/lint-imports --config ../../pyproject.toml

$(GPU_STAMP): pyproject.toml
	$(PYTHON) -m venv $(GPU_VENV)
	$(GPU_VENV)/bin/python -m pip install -q -e '.[gpu]'
	touch $(GPU_STAMP)

## KV block bytes: arithmetic, torch tensors, CLI; the CUDA part skips with its reason without a GPU.
gpu-check: $(GPU_STAMP)
	$(GPU_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/test_gpu_checks.py gpu_checks
	$(GPU_VENV)/bin/kvspec gpu-check --json build/gpu_check.json

## Bounded model checking, induction proofs, CrossHair contracts (docs/formal.md).
formal: $(STAMP)
	$(BIN)/kvspec bmc --blocks 3 --requests 2 --depth 3
	$(BIN)/kvspec prove --blocks 3 --requests 2
	$(BIN)/kvspec explore --blocks 2 --requests 2 --adapter reference --quiet
	$(BIN)/kvspec prove --engine pdr --blocks 2 --requests 1 --block-size 1 \
		--invariant bad_input_rejected --invariant share_without_duplication
	$(BIN)/kvspec crosshair --per-condition-timeout 1 --budget 900

bench: $(STAMP)
	$(BIN)/python benchmarks/steps_per_second.py

clean:
	rm -rf $(VENV) $(GPU_VENV) build .kvspec *.egg-info
