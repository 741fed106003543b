"""`scale plan` and `scale submit` give one answer: the planner proposes the recipe's engine laid out as submit lays
it out (scale.engine.kinds.recipe_setting), and takes the GPU's memory from --gpu-mem, a named model or a default;
plan judges the recipe as submit launches it (scale.launch.layout.launch_setting, one function for both), submit prints
that verdict and refuses a job that does not fit; the step time is calibrated from the measured device rows
(scale/bench/measured.yaml)."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf, read_write

from scale.bench.gpus import GPUS
from scale.bench.measured import load_rows
from scale.bench.mfu import card_key
from scale.cli import main
from scale.engine.kinds import recipe_setting
from scale.launch import slurm
from scale.launch.layout import launch_setting
from tests.helpers_recipes import loaded_recipe

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
    assert proposed.endswith("(the recipe as written)")
    assert "as `scale submit` launches it: hsdp/4 ac=none" in out


def test_plan_on_one_gpu_judges_an_fsdp2_recipe_as_the_ddp_that_runs(capsys):
    """fsdp2 on one rank runs as DDP (scale.engine.kinds.runs_as): plan judges DDP's memory, its bf16 weight copies
    (scale/engine/lowp.py) included, says why, and lists no FSDP2 row; engine.unsharded_ddp=false keeps FSDP2."""
    from scale.bench.plan import predict
    from scale.bench.trace import trace_step
    from scale.config import load_recipe

    cfg = load_recipe(TINY_RECIPE, ["engine.precision=bf16"])
    setting = launch_setting(cfg, [], 1, 1)
    trace = trace_step(cfg)
    memory = predict(trace, setting, 1, "bf16", "adamw", 1e12, 1.0, 1e9).memory
    assert setting.engine == "ddp" and memory["lowp"] == 2 * (trace.student_cast + trace.teacher_cast) > 0
    kept = launch_setting(load_recipe(TINY_RECIPE, ["engine.precision=bf16", "engine.unsharded_ddp=false"]), [], 1, 1)
    assert kept.engine == "fsdp2" and predict(trace, kept, 1, "bf16", "adamw", 1e12, 1.0, 1e9).memory["lowp"] == 0
    args = ["plan", TINY_RECIPE, "engine.precision=bf16", "--gpus", "1", "--gpu-mem", "1", "--gpu-tflops", "10"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "as `scale submit` launches it: ddp ac=none micro=64 accum=1 (engine ddp (fsdp2 on one rank)):" in out
    assert not any(line.startswith("fsdp2 ") for line in out.splitlines())


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


def all_recipes() -> list[str]:
    from scale.config import list_recipes, recipe_name

    return [recipe_name(path) for path in list_recipes()]


def test_plan_and_submit_describe_the_same_run_for_every_recipe_on_2x8():
    """What submit renders (its task's overrides, slurm.shard_within_nodes) reads back as the setting plan judges,
    for every recipe (one recipe load each: the task's overrides are merged onto it)."""
    options = slurm.SlurmOptions(nodes=2, gpus_per_node=8)
    names = all_recipes()
    for name in names:
        cfg = loaded_recipe(name)  # read-only: plan and submit read it, neither changes it
        planned = launch_setting(cfg, [], 2, 8)
        task = slurm.shard_within_nodes(slurm.Task(Path("run"), []), cfg, options)
        with read_write(cfg):  # OmegaConf.merge merges into a copy of cfg, which copies the flag
            submitted_cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(task.overrides))
        assert launch_setting(submitted_cfg, task.overrides, 2, 8) == planned, name
        assert planned.ac == cfg.engine.activation_checkpointing and planned.grad_accum == cfg.engine.grad_accum
        assert planned.compile == cfg.engine.compile and task.shard_size == planned.shard_size, name
    assert len(names) > 100


def test_plan_judges_the_recipes_checkpointing_and_submit_refuses_what_does_not_fit(tmp_path, capsys):
    """mocov3/table1/vit_bn_l7 sets full checkpointing: plan judged it without, and submit launched 73 GiB into a
    71 GiB limit without a word."""
    ac = "engine.activation_checkpointing=full"
    gpu = ["--nodes", "2", "--gpus-per-node", "2", "--gpu-mem", "0.001", "--mfu", "0.1"]
    assert main(["plan", TINY_RECIPE, ac, *gpu]) == 0
    out = capsys.readouterr().out
    verdict = next(line for line in out.splitlines() if line.startswith("as `scale submit` launches it:"))
    assert "hsdp/2 ac=full micro=" in verdict and "does NOT fit" in verdict
    assert "as the recipe runs (ac=full, accum=1)" in out
    run = ["submit", TINY_RECIPE, ac, *gpu, "--dry-run", "--run-dir", str(tmp_path / "r")]
    assert main(run) == 2
    captured = capsys.readouterr()
    assert "does NOT fit" in captured.out
    assert captured.err.count("\n") == 1 and "hsdp/2 ac=full micro=" in captured.err and "does not fit" in captured.err
    assert main([*run, "--force"]) == 0
    assert "engine.shard_size=2" in capsys.readouterr().out


@pytest.mark.parametrize("row", load_rows(), ids=lambda r: f"{r['setting']['recipe']}-compile{r['setting']['compile']}")
def test_plan_step_time_within_25_percent_of_every_measured_row(row, capsys):
    s = row["setting"]
    overrides = [
        f"engine.kind={s['engine']}",
        f"engine.precision={s['precision']}",
        f"engine.compile={str(s['compile']).lower()}",
        f"engine.activation_checkpointing={s['activation_checkpointing']}",
        f"train.global_batch={s['batch_per_gpu']}",
    ]
    gpu = next(name for name, (_, key) in GPUS.items() if key == card_key(row["card"]))  # the row's card
    assert main(["plan", s["recipe"], *overrides, "--gpus", "1", "--gpu", gpu]) == 0
    out = capsys.readouterr().out
    assert "step time: MFU" in out and "measured" in out
    verdict = next(line for line in out.splitlines() if line.startswith("as `scale submit` launches it:"))
    predicted = float(verdict.split("; ")[-1].split(" s/step")[0])
    assert abs(predicted - row["step_s"]) <= 0.25 * row["step_s"], (predicted, row["step_s"])
