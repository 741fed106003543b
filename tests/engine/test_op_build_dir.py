"""DeepSpeed's just-in-time op builds go to a folder of this Python environment's own: with torch's shared default
two venvs on one machine rebuilt each other's ops, and torch 2.11 waited forever on a lock file torch 2.14 left.
The shared-memory all-reduce op of DeepSpeed's CPU accelerator, which training never uses, is not built at all."""

import os
from pathlib import Path

import pytest
import torch
from torch.utils.cpp_extension import _get_build_directory

from scale.engine.deepspeed import import_deepspeed, op_build_dir


def test_each_environment_has_its_own_folder():
    first, second = op_build_dir("/venvs/a"), op_build_dir("/venvs/b")
    assert first != second and op_build_dir("/venvs/a") == first
    assert Path(first).parent == Path.home() / ".cache" / "scale" / "torch_extensions"


def test_importing_deepspeed_points_torch_at_it_unless_the_user_chose(monkeypatch):
    pytest.importorskip("deepspeed")
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    import_deepspeed(torch.device("cpu"))
    assert os.environ["TORCH_EXTENSIONS_DIR"] == op_build_dir()
    assert _get_build_directory("an_op", verbose=False).startswith(op_build_dir())
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", "/chosen")
    import_deepspeed(torch.device("cpu"))
    assert os.environ["TORCH_EXTENSIONS_DIR"] == "/chosen"


def test_the_cpu_accelerators_shared_memory_comm_op_is_not_built(monkeypatch, tmp_path):
    """It took 45-90 s of g++ on 2 cores at each fresh environment's first DeepSpeed run (every CI run)."""
    pytest.importorskip("deepspeed")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    import_deepspeed(torch.device("cpu"))
    from deepspeed.comm.torch import build_shm_op

    assert build_shm_op() is None
    assert not any(tmp_path.iterdir())
