"""The uninterrupted reference run, trained once per session (once per xdist worker that runs one of them) for
every module here that compares with it."""

import pytest

from tests.checkpoint.runs import OVERRIDES
from tests.helpers_run import run_train


@pytest.fixture(scope="session")
def reference(embedded_data, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("reference")
    out = run_train(embedded_data, run_dir, OVERRIDES)
    assert out.returncode == 0, out.stderr[-3000:]
    return run_dir
