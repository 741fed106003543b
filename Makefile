# The README's first two commands. Both create .venv when it is missing and are quick when it exists.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# pytest-xdist workers: on 2 cores, two workers keep both busy (most tests run one single-threaded process)
TEST_WORKERS ?= 2
# The oldest torch scale supports (setup.cfg takes torch>=2.11,<2.15): `make test-oldest` runs the fast tier on it in a
# second venv, so a call that only the newest torch accepts fails in CI, not on a cluster that runs an older build.
OLDEST_VENV := .venv-oldest
OLDEST_BIN := $(OLDEST_VENV)/bin
OLDEST_STAMP := $(OLDEST_VENV)/.installed
OLDEST_TORCH_STAMP := $(OLDEST_VENV)/.torch-installed
OLDEST_TORCH := torch==2.11.0 torchvision==0.26.0

.PHONY: demo docs test test-fast test-oldest test-wheel test-gpu bench-gpu device-wheels lint venv venv-oldest venv-oldest-torch clean

venv: $(STAMP)

# DS_BUILD_OPS=0: DeepSpeed's CUDA ops are built just in time on a GPU node, never at install time.
# dali: the DALI wheel (~424 MB, ~25 s to install) runs its CPU mode in the tests; on a GPU node it decodes on the GPU.
$(STAMP): setup.cfg pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	DS_BUILD_OPS=0 $(BIN)/pip install --quiet -e '.[test,demo,trackers,deepspeed,dali]'
	touch $(STAMP)

venv-oldest: $(OLDEST_STAMP)

# The oldest torch alone, the bulk of that venv (~2.5 GB with its CUDA libraries): it writes nothing in the checkout,
# so CI installs it beside .venv's build (pip installs in one thread; scale's editable install writes scale.egg-info
# here, so the two venvs' own installs of scale never run at once).
venv-oldest-torch: $(OLDEST_TORCH_STAMP)

$(OLDEST_TORCH_STAMP):
	test -d $(OLDEST_VENV) || $(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_BIN)/pip install --quiet --upgrade pip
	$(OLDEST_BIN)/pip install --quiet $(OLDEST_TORCH)
	touch $(OLDEST_TORCH_STAMP)

# The same extras as .venv but dali: DALI does not depend on the torch release, and its tests skip cleanly without it
# (the full suite on .venv runs them); leaving it out saves ~1 GB and ~25 s. torch and torchvision are pinned on the
# same pip command as scale so that the resolver never replaces them with the newest release.
$(OLDEST_STAMP): setup.cfg pyproject.toml $(OLDEST_TORCH_STAMP)
	DS_BUILD_OPS=0 $(OLDEST_BIN)/pip install --quiet $(OLDEST_TORCH) -e '.[test,demo,trackers,deepspeed]'
	touch $(OLDEST_STAMP)

demo: $(STAMP)
	$(BIN)/scale demo

# the full suite: what CI runs; it ends with where the time went: the 25 slowest tests, then each xdist worker's busy
# time and the longest units (tests/conftest.py)
test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --durations=25 $(PYTEST_ARGS)

# the unit tier for inner loops: everything but the tests marked slow (multi-process, end-to-end, Slurm, demo)
test-fast: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) -m "not slow" $(PYTEST_ARGS)

# the fast tier on the oldest supported torch: what CI runs after `make test`
test-oldest: $(OLDEST_STAMP)
	$(OLDEST_BIN)/python -m pytest -n $(TEST_WORKERS) -m "not slow" $(PYTEST_ARGS)

# scale as a user installs it: the wheel built, installed in a fresh venv outside the checkout (core, then with
# the demo extra; torch as in .venv, from pip's cache) and run from a folder with no checkout (tools/test-wheel).
# SCALE_WHEEL_DEMO=0 runs a one-step `scale train` instead of `scale demo --steps 6` (about 3 of its 9 minutes on 2
# loaded cores).
test-wheel: $(STAMP)
	PY=$(BIN)/python tools/test-wheel

# The GPU targets stop at once, in one line, where torch sees no GPU.
CUDA_CHECK = $(BIN)/python -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 'no CUDA device: make $@ needs a GPU that torch can use')"

# tests/gpu only (marked gpu; those marked multigpu too need 2 GPUs: srun --gpus 2 make test-gpu)
test-gpu: $(STAMP)
	@$(CUDA_CHECK)
	$(BIN)/python -m pytest tests/gpu -m gpu $(PYTEST_ARGS)

# DINO Table 8, EsViT Table 9 and MoCo v3 Table 3 rows measured on this machine's first GPU (scale/bench/tables.py);
# DINO and MoCo v3 at a per-GPU share of the papers' batches
bench-gpu: $(STAMP)
	@$(CUDA_CHECK)
	$(BIN)/scale bench table dino8 --scale full --batch 64 --steps 5
	$(BIN)/scale bench table esvit9 --scale full --steps 5
	$(BIN)/scale bench table mocov3-3 --scale full --batch 32 --steps 5

# the wheels the offline GPU machine lacks (omegaconf, webdataset, DeepSpeed built from its sdist, ...), a few MB in
# .whl/ for tools/device-check there (README: "Running on a GPU node")
device-wheels: $(STAMP)
	PY=$(BIN)/python tools/device-wheels

# the documentation site (docs/, mkdocs.yml) into site/; --strict: a broken link, anchor or included file fails.
# The docs extra (mkdocs, mkdocs-material) is installed on first use. Reference pages: python -m scale.reference
docs: $(STAMP)
	$(BIN)/python -c "import mkdocs, material" 2>/dev/null || $(BIN)/pip install --quiet -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) $(OLDEST_VENV) runs .pytest_cache
