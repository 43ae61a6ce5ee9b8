# Shardlab: `make run` starts the service with demo data; `make test` runs every check.
PY     ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
HOST   ?= 127.0.0.1
PORT   ?= 8000

.PHONY: run test lint typecheck pytest postgres chromium screenshots bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -U pip setuptools wheel

# Stamps record which extras are installed; they are redone when pyproject.toml changes.
# `make run` installs the worker (torch: verification on real ranks) and import extras
# (transformers: the Models view's Hugging Face import), so every view works out of the box.
$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[worker,import]'
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[dev]'
	touch $@ $(VENV)/.installed-run

# migrates the database (data/ by default), prints the first admin's one-time login link,
# seeds demo models and strategies, starts a worker and the service
run: $(VENV)/.installed-run
	$(BIN)/shardlab serve --demo --host $(HOST) --port $(PORT)

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(VENV)/.installed-dev
	$(BIN)/mypy

# one pytest worker per core (pytest-xdist); `make test PYTEST_WORKERS=0` runs in one process
PYTEST_WORKERS ?= auto
pytest: $(VENV)/.installed-dev postgres chromium
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist worksteal

# the API tests run against PostgreSQL too (database `test` on 127.0.0.1:5432, trust auth)
postgres:
	@if [ "$$SHARDLAB_SKIP_POSTGRES" = 1 ] || pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then exit 0; fi; \
	echo "PostgreSQL is not answering on 127.0.0.1:5432; starting it"; \
	service postgresql start >/dev/null 2>&1 || pg_ctlcluster 15 main start >/dev/null 2>&1 || true; \
	for i in 1 2 3 4 5 6 7 8 9 10; do pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null && exit 0; sleep 1; done; \
	echo "error: PostgreSQL is not reachable on 127.0.0.1:5432 (the API tests need database 'test')." >&2; \
	echo "       Start it (service postgresql start), or run with SHARDLAB_SKIP_POSTGRES=1." >&2; \
	exit 1

# the browser tests drive Debian's Chromium through Playwright
chromium:
	@if [ -x /usr/bin/chromium ]; then exit 0; fi; \
	echo "installing Debian's chromium for the browser tests"; \
	SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium >/dev/null \
	  || { $$SUDO apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q chromium >/dev/null; }

test: postgres chromium lint typecheck pytest

# refreshes the README's screenshots (the browser tests write them to build/ otherwise)
screenshots: $(VENV)/.installed-dev chromium
	SHARDLAB_SCREENSHOTS=docs/screenshots $(BIN)/python -m pytest -q tests/ui

bench: $(VENV)/.installed-dev chromium
	$(BIN)/python -m bench.run

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
