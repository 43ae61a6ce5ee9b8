# Shardlab: `make run` starts the service with demo data; `make test` runs every check.
PY     ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8000

.PHONY: run test lint typecheck pytest bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip setuptools wheel

# Stamps record which extras are installed; they are redone when pyproject.toml changes.
$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	touch $@ $(VENV)/.installed-run

run: $(VENV)/.installed-run
	$(BIN)/shardlab serve --host $(HOST) --port $(PORT)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy

pytest: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q

test: lint typecheck pytest

bench: $(VENV)/.installed-dev
	$(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
