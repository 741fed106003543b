# The README's first two commands. Both create .venv when it is missing and are quick when it exists.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test test-fast lint venv clean

venv: $(STAMP)

# DS_BUILD_OPS=0: DeepSpeed's CUDA ops are built just in time on a GPU node, never at install time.
# dali: the DALI wheel (~424 MB, ~25 s to install) runs its CPU mode in the tests; on a GPU node it decodes on the GPU.
$(STAMP): setup.cfg pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	DS_BUILD_OPS=0 $(BIN)/pip install --quiet -e '.[test,deepspeed,dali]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/scale demo

# the full suite: what CI runs
test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

# the unit tier for inner loops: everything but the tests marked slow (multi-process, end-to-end, Slurm, demo)
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) runs .pytest_cache
