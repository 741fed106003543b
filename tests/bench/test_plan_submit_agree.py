"""`scale plan` and `scale submit` give one answer: the planner proposes the recipe's engine laid out as submit lays
it out (scale.engine.kinds.recipe_setting), and takes the GPU's memory from --gpu-mem, a named model or a default."""

from pathlib import Path

import pytest

from scale.cli import main
from scale.engine.kinds import recipe_setting
from scale.launch import slurm

TINY_RECIPE = str(Path(__file__).with_name("tiny_dino.yaml"))  # engine fsdp2


@pytest.mark.parametrize(
    "engine, nodes, expected",
    [
        (("fsdp2", 1, 0), 8, ("hsdp", 8)),  # several nodes: shard within each node
        (("fsdp2", 1, 0), 1, ("fsdp2", 0)),  # one node: every rank
        (("fsdp2", 1, 4), 8, ("hsdp", 4)),  # the recipe's shard size wins
        (("ddp", 1, 0), 8, ("ddp", 0)),
        (("deepspeed", 3, 0), 8, ("zero3", 8)),  # ZeRO++ hpZ
        (("deepspeed", 2, 0), 8, ("zero2", 0)),  # ZeRO-2 keeps the parameters whole
    ],
)
def test_recipe_setting(engine, nodes, expected):
    assert recipe_setting(*engine, nodes, 8) == expected


def test_plan_proposes_what_submit_runs(tmp_path, capsys):
    """dino/table2/vit_b16 on 64 x 8 GPUs: plan proposed DDP (fastest predicted) while submit ran fsdp2 sharded
    within each node; now plan proposes the latter and names DDP only as the faster alternative."""
    job = slurm.plan(TINY_RECIPE, [], tmp_path / "run", slurm.SlurmOptions(nodes=2, gpus_per_node=4))
    assert job.tasks[0].shard_size == 4 and "engine.shard_size=4" in job.tasks[0].overrides
    args = ["plan", TINY_RECIPE, "--nodes", "2", "--gpus-per-node", "4", "--gpu-mem", "1", "--gpu-tflops", "10"]
    assert main(args) == 0
    out = capsys.readouterr().out
    proposed = next(line for line in out.splitlines() if line.startswith("proposed:"))
    assert proposed.startswith("proposed: hsdp/4 ")
    assert "engine.kind=fsdp2 engine.shard_size=4" in out and "as `scale submit` lays it out" in out


def test_plan_gpu_memory_from_a_named_model_or_the_default(capsys):
    # the tiny recipe is fp32: an H100 SXM's fp32 peak
    assert main(["plan", TINY_RECIPE, "--gpus", "2", "--gpu", "h100-80gb"]) == 0
    assert "GPU --gpu h100-80gb: 79.1 GiB, 67 TFLOP/s" in capsys.readouterr().out
    assert main(["plan", TINY_RECIPE, "--gpus", "2", "--gpu", "h100-80gb", "--gpu-mem", "40"]) == 0
    assert "GPU --gpu-mem 40: 40.0 GiB, 67 TFLOP/s" in capsys.readouterr().out
    assert main(["plan", TINY_RECIPE, "--gpus", "2"]) == 0  # no --gpu: this machine's GPU, else the default
    out = capsys.readouterr().out
    assert "GPU this machine's" in out or "GPU a100-80gb (default" in out
    with pytest.raises(SystemExit):
        main(["plan", TINY_RECIPE, "--gpus", "2", "--gpu", "no-such-gpu"])
