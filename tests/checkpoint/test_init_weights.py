"""train.init_weights: a fresh run starts from an exported backbone (student and teacher), also when the model is
built on the meta device and sharded first; a file that does not fit fails naming it."""

import pytest
import torch
from safetensors.torch import save_file

from scale.checkpoint.export import read_tensors
from scale.checkpoint.store import resolve
from scale.config import load_recipe
from scale.models import build_backbone
from tests.helpers_run import TINY, run_train

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out

FROZEN = TINY + ["train.max_steps=1", "optim.lr=0.0", "optim.min_lr=0.0", "optim.clip_grad=0.0"]


@pytest.fixture
def weights(tmp_path):
    torch.manual_seed(7)
    backbone = build_backbone(load_recipe("demo/dino_tiny").model)
    state = {k: v.contiguous() for k, v in backbone.state_dict().items()}
    path = tmp_path / "backbone.safetensors"
    save_file(state, str(path))
    return path, state


@pytest.mark.parametrize("engine", [["engine.kind=ddp"], ["engine.kind=fsdp2", "engine.meta_init=true"]])
def test_fresh_run_starts_from_exported_backbone(embedded_data, tmp_path, weights, engine):
    path, state = weights
    out = run_train(embedded_data, tmp_path / "run", FROZEN + engine + [f"train.init_weights={path}"])
    assert out.returncode == 0, out.stderr[-3000:]
    saved = resolve(tmp_path / "run")
    for part in ("student", "teacher"):  # lr 0: one step leaves the loaded weights as they were
        loaded = read_tensors(saved, f"engine.{part}.backbone.")
        assert loaded.keys() == state.keys()
        assert all(torch.equal(loaded[k], state[k]) for k in state), part


@pytest.mark.parametrize("wrong", ["names", "shapes"])
def test_mismatched_weights_fail_naming_the_file_before_any_rank_starts(embedded_data, tmp_path, weights, wrong):
    """Checked before spawning: one message, exit 2, no rank started (found on the ranks, the first to leave could
    tear down a collective a slower peer had not finished, seen once in a loaded flake loop as exit 1 and a gloo
    backtrace); a shape mismatch was a traceback from load_state_dict on every rank."""
    _, state = weights
    if wrong == "names":
        state = {"not_a_backbone.weight": torch.zeros(2)}
    else:
        name = next(k for k, v in state.items() if v.ndim == 2)
        state = {**state, name: torch.zeros(state[name].shape[0] + 1, state[name].shape[1])}
    path = tmp_path / "wrong.safetensors"
    save_file(state, str(path))
    out = run_train(embedded_data, tmp_path / "run", FROZEN + [f"train.init_weights={path}"])
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.count("wrong.safetensors: the file (backbone state dict") == 1, out.stderr[-3000:]
    assert "does not fit the recipe's student" in out.stderr and "Traceback" not in out.stderr
    assert (" in the file, " in out.stderr) == (wrong == "shapes")  # names the key and both shapes
    assert not list((tmp_path / "run").glob("logs/rank*.log"))  # no rank was started


def test_meta_init_on_one_rank_loads_into_the_ddp_that_runs(group, weights):
    """fsdp2 with engine.meta_init on one rank runs as DDP (scale.engine.kinds.runs_as), which holds the whole net:
    the nets are built off the meta device and the weights loaded before the engine wraps them, so that the
    teacher's bf16 copies (scale.engine.lowp) hold the loaded weights from the first step on (in process)."""
    from scale.data.synthetic import SyntheticLoader
    from scale.engine.ddp import DDPEngine
    from scale.loop.step import TrainStep

    info, device = group
    path, state = weights
    fsdp2 = ["engine.kind=fsdp2", "engine.meta_init=true", "engine.precision=bf16"]
    cfg = load_recipe("demo/dino_tiny", [*FROZEN, *fsdp2])
    step = TrainStep(cfg, info, device, lambda: SyntheticLoader(cfg, 0, 1), init_weights=str(path))
    assert isinstance(step.engine, DDPEngine)
    for part in ("student", "teacher"):
        loaded = step.engine.export_state_dict(part)
        loaded = {k.removeprefix("backbone."): v for k, v in loaded.items() if k.startswith("backbone.")}
        assert loaded.keys() == state.keys() and all(torch.equal(loaded[k], state[k]) for k in state), part
    copies = step.engine.lowp_teacher
    assert copies.masters and all(torch.equal(low, m.to(low.dtype)) for low, m in zip(copies.lowp, copies.masters))
