"""Shared test set-up: one thread per process (the machine has 2 cores and tests spawn process pairs)."""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
# every Python process a test starts prints its threads' stacks when it dies of a fatal signal
os.environ.setdefault("PYTHONFAULTHANDLER", "1")

import torch  # noqa: E402

torch.set_num_threads(1)
