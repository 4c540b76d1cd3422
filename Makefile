# llamafleet: the two commands of the README are `make demo` and `make test`.
# Everything they need is installed or built here; builds and models are cached outside the checkout
# (~/.cache/llamafleet, or $LLAMAFLEET_CACHE), so a second run reuses them.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

.PHONY: help venv bed build-server models lint types check test test-fast demo bench bench-quick reliability crds clean

help:
	@echo "make demo   - build or reuse llama-server and a tiny model, run the demo"
	@echo "make test   - lint, type-check and run the whole test suite against real processes"
	@echo "make test-fast - only the tests that need no llama-server, sdist or tiny model (pytest -m 'not llama and not models')"
	@echo "make bench  - the seed table: llamafleet against llama-server and sglang-router (~15 min)"
	@echo "make reliability - the fault scenarios and their figures (~1 min)"

# The test bed (testbed/pyproject.toml) is a distribution of its own, out of the pod image.
$(VENV)/.installed: pyproject.toml testbed/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -U pip
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev,bench]' -e testbed
	touch $@

venv: $(VENV)/.installed

# Both builds of llama-server: upstream, and patched with the project's series (patches/llama.cpp).
build-server: venv
	$(VENV)/bin/llamafleet build-server
	$(VENV)/bin/llamafleet build-server --patched

models: venv
	$(VENV)/bin/llamafleet models

# The real test bed: the llama-server binaries and the tiny GGUF models (all cached).
bed: build-server models

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

types: venv
	$(VENV)/bin/mypy

check: lint types

crds: venv
	$(PY) -m llamafleet_core.crd.generate

# The real-server tests that start llama-server with flags of their own run again on the patched build,
# its flags off: it must behave as upstream. Tests of `llamafleet up` and of feature detection stay on
# upstream: a patched binary turns its flags on there (the fleet on patched pods).
PATCHED_AS_UPSTREAM = tests/integration tests/agent tests/core/test_prefix_real_server.py \
	tests/core/test_warming_real.py tests/security/test_secrets_real.py tests/testbed/test_server_bed.py

test: bed check
	$(VENV)/bin/pytest $(PYTEST_ARGS)
	LLAMAFLEET_TEST_BUILD=patched $(VENV)/bin/pytest -m llama $(PATCHED_AS_UPSTREAM) $(PYTEST_ARGS)

# Needs nothing of the bed: no llama-server build, no llama.cpp sdist, no tiny model (tests/fixtures/bed_guard.py).
test-fast: venv
	$(VENV)/bin/pytest -m "not llama and not models" $(PYTEST_ARGS)

demo: bed
	$(VENV)/bin/llamafleet demo

bench: bed
	$(VENV)/bin/llamafleet bench seed-table

bench-quick: bed
	$(VENV)/bin/llamafleet bench seed-table --quick

reliability: bed
	$(VENV)/bin/llamafleet reliability

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache results runs
