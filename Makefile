# Entry points for people and CI: `make run`, `make test`.
#
# Everything lives in .venv at the repo root. Installs are tracked by stamp files inside
# the venv, redone only when pyproject.toml changes, so re-running a target is quick.

PYTHON      ?= python3
VENV        := .venv
PY          := $(VENV)/bin/python
PROMPT      ?= Write a haiku about the sea.
PYTEST_ARGS ?=

# Through the environment rather than pasted into the command line, so a prompt with
# quotes or $ in it reaches frink intact.
export PROMPT

# llama-cpp-python (the test reference) builds from source: use every core. pip caches
# the built wheel, so this cost is paid once per machine.
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: help run test test-fast lint fuzz clean

help:
	@echo "make run    generate $(PROMPT) with the default model (fetched on first use)"
	@echo "make test   install the test extra and run pytest (PYTEST_ARGS=... passes through)"
	@echo "make test-fast  the same without the real-model tests (-m 'not real')"
	@echo "make lint   ruff check, ruff format --check (package, tests, scripts), mypy (package)"
	@echo "make fuzz   the hostile-input soak: 20,000+ seeded cases and 2,000 hostile HTTP"
	@echo "           clients against frink serve (FUZZ_CASES, FUZZ_HTTP_CASES, FUZZ_SEED)"
	@echo "make clean  remove .venv and caches"

$(PY):
	$(PYTHON) -m venv $(VENV)

# The host kernels are C compiled at install (setup.py): a change to them reinstalls.
NATIVE := setup.py $(wildcard frink_cli/quant/native*) $(wildcard frink_cli/backends/host/rowwise*.[ch])

$(VENV)/.stamp-run: pyproject.toml $(NATIVE) | $(PY)
	$(PY) -m pip install -q -e .
	@touch $@

$(VENV)/.stamp-test: pyproject.toml $(NATIVE) | $(PY)
	$(PY) -m pip install -q -e ".[test]"
	@touch $@

# The lint tools are pinned in the `lint` extra; installing the package with them gives
# mypy frink's own dependencies (numpy's types) to check against.
$(VENV)/.stamp-lint: pyproject.toml $(NATIVE) | $(PY)
	$(PY) -m pip install -q -e ".[lint]"
	@touch $@

run: $(VENV)/.stamp-run
	$(VENV)/bin/frink run --prompt "$$PROMPT" -n 64

test: $(VENV)/.stamp-test
	$(PY) -m pytest -q $(PYTEST_ARGS)

# The real models are fetched once per machine and are most of the suite's time.
test-fast: $(VENV)/.stamp-test
	$(PY) -m pytest -q -m "not real" $(PYTEST_ARGS)

# Not part of `make test`: tests/test_fuzz.py runs a CI-sized share of the same cases.
FUZZ_CASES ?= 20000
FUZZ_HTTP_CASES ?= 2000
FUZZ_SEED  ?= 1
fuzz: $(VENV)/.stamp-run
	$(PY) scripts/fuzz_inputs.py --cases $(FUZZ_CASES) --http-cases $(FUZZ_HTTP_CASES) \
		--seed $(FUZZ_SEED)

# Every tool runs even when one fails, so one run reports all three; the status is theirs.
LINT_PATHS := frink_cli tests scripts setup.py
lint: $(VENV)/.stamp-lint
	@status=0; \
	$(PY) -m ruff check $(LINT_PATHS) || status=1; \
	$(PY) -m ruff format --check $(LINT_PATHS) || status=1; \
	$(PY) -m mypy || status=1; \
	exit $$status

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache tests/.cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
