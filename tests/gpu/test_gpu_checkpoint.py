"""A checkpoint written on the GPU resumes on the CPU and one written on the CPU resumes on the GPU, with
bit-exact weights (student and EMA teacher): DCP (DDP, FSDP2) and DeepSpeed's own files (ZeRO-1, ZeRO-3), the
toy method of tests/engine/engine_toy.py after 3 steps."""

import pytest
import torch
from engine_toy import engine_run, load_and_finish, spawn
from gpu_env import DEVICE

pytestmark = pytest.mark.gpu

ENGINES = {
    "ddp": {"kind": "ddp"},
    # FSDP2 itself on one device, which would run as DDP (scale.engine.kinds.runs_as)
    "fsdp2": {"kind": "fsdp2", "unsharded_ddp": False},
    "zero1": {"kind": "deepspeed", "zero_stage": 1},
    "zero3": {"kind": "deepspeed", "zero_stage": 3},
}
SAVED_STEPS = 3


@pytest.mark.parametrize("saved_on,loaded_on", [(DEVICE, "cpu"), ("cpu", DEVICE)], ids=["gpu_to_cpu", "cpu_to_gpu"])
@pytest.mark.parametrize("engine", ENGINES)
def test_checkpoint_moves_between_gpu_and_cpu_bit_exact(engine, saved_on, loaded_on, tmp_path):
    if ENGINES[engine]["kind"] == "deepspeed":
        pytest.importorskip("deepspeed")
    folder, kw = str(tmp_path / "ckpt"), ENGINES[engine]
    # engine_run(engine_kw, optim_kw, steps, start, load_from, save_to)
    saved = spawn(engine_run, kw, {}, SAVED_STEPS, 0, None, folder, world=1, tmp_path=tmp_path, device=saved_on)
    # a fresh method and engine load it (its state as loaded kept), and training goes on from it: one process
    resumed = spawn(
        load_and_finish, kw, folder, SAVED_STEPS, 1, None, SAVED_STEPS + 1, True, tmp_path=tmp_path, world=1,
        device=loaded_on,
    )  # fmt: skip
    loaded = resumed["loaded"]
    for part in ("student", "teacher"):
        assert loaded[part].keys() == saved[part].keys()
        for name, value in saved[part].items():
            assert torch.equal(loaded[part][name], value), f"{part} {name}"
    assert len(resumed["losses"]) == 1 and torch.isfinite(torch.tensor(resumed["losses"])).all()
    assert not torch.equal(resumed["student"]["head.mlp.weight"], saved["student"]["head.mlp.weight"])
