# Two entry points for a fresh machine: `make check` and `make test`.
# Both create the virtual environment on first use.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.kvspec-installed
TYPECHECK_DIR := build/typecheck

.PHONY: check test lint typecheck importlint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

## Run the conformance suite against the embedded default adapter (the paged reference).
check: $(STAMP)
	$(BIN)/kvspec check --adapter reference --profile ci

## The kit's own tests, after lint, type and architecture checks.
test: lint $(STAMP)
	$(BIN)/python -m pytest

lint: $(STAMP) typecheck importlint
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# mypy cannot follow the package-dir mapping of an editable install: check an installed copy.
typecheck: $(STAMP)
	rm -rf $(TYPECHECK_DIR)
	$(BIN)/python -m pip install -q --no-deps --no-compile --target $(TYPECHECK_DIR) .
	cd $(TYPECHECK_DIR) && ../../$(BIN)/mypy -p kvspec

# import-linter reads the same installed copy, where kvspec.spec etc. are real subpackages.
importlint: typecheck
	cd $(TYPECHECK_DIR) && ../../$(BIN)/lint-imports --config ../../pyproject.toml

bench: $(STAMP)
	$(BIN)/python benchmarks/steps_per_second.py

clean:
	rm -rf $(VENV) build .kvspec *.egg-info
