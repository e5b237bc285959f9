# Two commands on a fresh clone:  `make run`  and  `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q

.PHONY: run test lint typecheck pytest bench clean

# Core install: everything `hipipe plan|compare|simulate` needs (no torch).
$(VENV)/.core: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -e .
	touch $@

# Full install for the tests: torch is pinned to the CPU wheel *before* the
# extras so that the `torch` extra is already satisfied and no CUDA build is pulled.
# As root, the testbed tests also need `ip` and `tc` (iproute2); elsewhere they skip with a reason.
$(VENV)/.full: $(VENV)/.core
	@if [ "$$(id -u)" = 0 ] && ! command -v tc >/dev/null && command -v apt-get >/dev/null; then \
		apt-get update -qq && apt-get install -y -qq iproute2; fi
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[torch,test]'
	touch $@

run: $(VENV)/.core
	$(VENV)/bin/hipipe compare

lint: $(VENV)/.full
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

typecheck: $(VENV)/.full
	$(VENV)/bin/mypy

# Tests that keep one core busy (fast ones, and slow planners and MIPs: `one_process`) on
# 2 workers, slow ones first (conftest.py) and handed out one by one (`--maxschedchunk 1`:
# by default pytest-xdist sends each worker a quarter of its share up front, and the first
# worker got every slow test); the multi-process ones (8 ranks on the host's cores,
# testbeds, torchrun) one at a time, since each already keeps every core busy. The two runs
# select complementary sets, so no test is left out. Each lists its slowest tests, to keep
# `make test` near its time budget.
pytest: $(VENV)/.full
	$(PY) -m pytest -q -m "not slow or one_process" -n 2 --maxschedchunk 1 --durations=15
	$(PY) -m pytest -q -m "slow and not one_process" --durations=15

test: lint typecheck pytest

bench: $(VENV)/.core
	$(PY) benchmarks/planners.py

clean:
	rm -rf $(VENV) build src/*.egg-info .mypy_cache .ruff_cache .pytest_cache .hypothesis
