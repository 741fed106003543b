"""The DeepSpeed fit check reads the shapes of the model states file, not its weights (DeepSpeed's load reads them
right after): the file is mapped through the same restricted reader, so a crafted pickle is still refused."""

import types

import pytest
import torch
from torch import nn

from scale.checkpoint.resume import check_deepspeed_fits
from scale.checkpoint.safe_load import UnsafeCheckpoint, load_torch
from scale.engine.deepspeed import CHECKPOINT_TAG
from scale.errors import UserError
from tests.checkpoint.test_faults import Marker


def bytes_read() -> int:
    """What this process has read through read() calls so far (a mapped file's pages do not count)."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar")).split()[1])


def zero1_engine(module: nn.Module):
    """What check_deepspeed_fits reads of a ZeRO-1 engine without a teacher."""
    ds, method = types.SimpleNamespace(module=module), types.SimpleNamespace(teacher=None)
    return types.SimpleNamespace(stage=1, ds=ds, method=method)


def write_states(folder, module: nn.Module):
    (folder / CHECKPOINT_TAG).mkdir(parents=True)
    path = folder / CHECKPOINT_TAG / "mp_rank_00_model_states.pt"
    torch.save({"module": module.state_dict(), "param_shapes": [], "ds_version": "0.19.8"}, path)
    return path


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    module = nn.Linear(1024, 4096)  # 16 MiB of weights
    return module, write_states(tmp_path / "engine", module)


def test_the_fit_check_reads_shapes_without_reading_the_weights(saved):
    module, path = saved
    engine = zero1_engine(module)
    before = bytes_read()
    check_deepspeed_fits(engine, path.parent.parent, is_main=True)
    assert bytes_read() - before < path.stat().st_size // 10


def test_the_fit_check_still_names_a_misfit(saved):
    _, path = saved
    engine = zero1_engine(nn.Linear(1024, 2048))
    with pytest.raises(UserError, match=r"engine.student.bias is \[4096\] in the checkpoint, \[2048\] in this run"):
        check_deepspeed_fits(engine, path.parent.parent, is_main=True)


def test_a_mapped_load_gives_the_saved_tensors(saved):
    module, path = saved
    loaded = load_torch(path, mmap=True)["module"]
    assert all(torch.equal(loaded[k], v) for k, v in module.state_dict().items())


def test_a_mapped_load_runs_no_code(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "mp_rank_00_model_states.pt"
    torch.save({"module": Marker(marker)}, path)
    with pytest.raises(UnsafeCheckpoint):
        load_torch(path, mmap=True)
    assert not marker.exists()
