"""Real (tiny) training steps through `scale bench`, and the planner's memory predictions against them."""

import json
import os
import re
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from scale.bench.plan import Setting, activation_bytes, plan, predict, state_bytes
from scale.bench.run import bench_config
from scale.bench.trace import trace_step
from scale.cli import main
from scale.config import load_recipe
from scale.recipes.smoke import smoke_overrides
from tests import fork_server
from tests.helpers_run import FORKED_RANKS

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out

TINY_RECIPE = str(Path(__file__).with_name("tiny_dino.yaml"))
TINY = ["train.global_batch=4", "model.drop_path=0.1"]


def test_bench_command_prints_one_row_per_setting_and_writes_json(tmp_path, capsys):
    out = tmp_path / "rows.json"
    status = main(
        [
            "bench",
            TINY_RECIPE,
            *TINY,
            "--synthetic-data",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--matrix",
            "ac=none,full",
            "engine=fsdp2,ddp",
            "--json",
            str(out),
        ]
    )
    assert status == 0
    printed = capsys.readouterr().out
    assert "ac=none" in printed and "ac=full" in printed and "MFU" in printed
    all_rows = json.loads(out.read_text())
    # fsdp2 on this one rank runs as DDP (scale.engine.kinds.runs_as): each row says so, and the same step is measured
    # once, its row shown under both settings
    fsdp2 = [f"ac={ac} engine=fsdp2 [ddp (fsdp2 on one rank)]" for ac in ("none", "full")]
    assert [r["label"] for r in all_rows] == [fsdp2[0], f"ac=none engine=ddp = {fsdp2[0]}"] + [
        fsdp2[1],
        f"ac=full engine=ddp = {fsdp2[1]}",
    ]
    assert {r["engine"] for r in all_rows} == {"ddp"}
    assert [r["setting"]["engine"] for r in all_rows] == ["fsdp2", "ddp"] * 2
    rows = all_rows[::2]  # the measured ones
    assert all_rows[1]["step_s"] == rows[0]["step_s"] and all_rows[3]["step_s"] == rows[1]["step_s"]
    for row in rows:
        assert row["crops_per_image"] == 6 and row["world"] == 1
        assert row["images_per_s"] == pytest.approx(4 / row["step_s"])
        assert row["crops_per_s"] == pytest.approx(6 * row["images_per_s"])
        assert row["phases"]["forward"] > 0 and row["phases"]["backward"] > 0 and row["phases"]["optimizer"] > 0
        assert sum(row["phases"].values()) == pytest.approx(row["step_s"], rel=1e-6)
        state = row["state"]
        assert state["total"] == sum(v for k, v in state.items() if k != "total")
        assert row["peak_bytes"] > state["total"] and 0 < row["mfu"] < 1
        assert row["rss_peak_bytes"] > row["peak_bytes"]
    assert rows[1]["peak_bytes"] < rows[0]["peak_bytes"]  # checkpointing frees activations


def test_activation_table_command(tmp_path, capsys):
    out = tmp_path / "ac.json"
    args = ["bench", "ac", TINY_RECIPE, "--modes", "none,full", "--rounds", "1", "--steps", "1", "--warmup", "0"]
    assert main([*args, "--batches", "2,4", "--json", str(out)]) == 0
    none, full = json.loads(out.read_text())
    assert [none["mode"], full["mode"]] == ["none", "full"]
    assert 0 < full["per_image_bytes"] < none["per_image_bytes"]  # checkpointing keeps less per image
    assert "| full |" in capsys.readouterr().out
    assert main([*args, "--batches", "2"]) == 2
    assert "at least two --batches" in capsys.readouterr().err


def test_bench_still_routes_data_and_reports_bad_recipes(capsys):
    assert main(["bench", "no/such_recipe", "--steps", "1"]) == 2
    assert "no/such_recipe" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # `scale bench data` keeps its own options
        main(["bench", "data", TINY_RECIPE, "--steps", "1"])


def measured(cfg, group) -> dict:
    return bench_config(cfg, *group, steps=1, warmup=0, synthetic=True, count_flops=False)


def test_the_weights_held_in_bf16_are_reported_as_the_planner_counts_them(group):
    """DDP in bf16 keeps the student's and the teacher's Linear and Conv weights in bf16 (scale.engine.lowp):
    Engine.memory()'s "lowp" is what the planner predicts; FSDP2 (kept FSDP2 on this one rank) holds none."""
    base = load_recipe(TINY_RECIPE, ["train.global_batch=2", "engine.precision=bf16", "engine.unsharded_ddp=false"])
    trace = trace_step(base)
    for engine in ("ddp", "fsdp2"):
        held = measured(OmegaConf.merge(base, {"engine": {"kind": engine}}), group)["state"]
        predicted = predict(trace, Setting(engine, micro_batch=2), 1, "bf16", base.optim.name, 1e12, 1.0, 1e9)
        assert held["lowp"] == predicted.memory["lowp"], engine
        assert (held["lowp"] > 0) == (engine == "ddp")


def test_compile_time_is_reported_apart_from_the_step_time(group):
    """engine.compile: the seconds torch.compile spends (in the first, untimed step) come in their own column."""
    base = load_recipe(TINY_RECIPE, ["train.global_batch=2", "engine.compile_backend=aot_eager"])
    eager = measured(OmegaConf.merge(base, {"engine": {"compile": False}}), group)
    compiled = measured(OmegaConf.merge(base, {"engine": {"compile": True}}), group)
    assert eager["compile_s"] == 0
    assert compiled["compile_s"] > 0 and compiled["step_s"] > 0


@pytest.mark.parametrize(
    "recipe, engine, batches",
    [(TINY_RECIPE, "ddp", (2, 4)), (TINY_RECIPE, "fsdp2", (2, 4)), ("esvit/table9/a_swin_t_bs8_lvlr", "ddp", (4, 8))],
)
def test_memory_predictions_within_15_percent_of_measured(group, recipe, engine, batches):
    """State bytes as Engine.memory() counts them, peak tensor bytes with and without checkpointing, and activation
    bytes per image (the slope of the peak against the batch, over batches where activations dominate), on the
    CPU's tracked allocations."""
    # engine.unsharded_ddp=false: FSDP2's own memory on this one rank, which would run as DDP (kinds.runs_as)
    base = load_recipe(recipe, [f"engine.kind={engine}", "engine.precision=fp32", "engine.unsharded_ddp=false"])
    if recipe.startswith("esvit"):
        base = smoke_overrides(base)  # Swin-nano, 32 px and 16 px crops, region loss on
    # one trace for every batch and checkpointing mode: the trace runs its own batch without checkpointing
    # (scale.bench.steptrace.trace_config), the planner scales it to each setting
    trace = trace_step(base)
    for ac in ("none", "full"):
        peaks, prediction = {}, None
        for batch in batches:
            cfg = OmegaConf.merge(base, {"train": {"global_batch": batch}, "engine": {"activation_checkpointing": ac}})
            result = measured(cfg, group)
            prediction = predict(
                trace, Setting(engine, ac, micro_batch=batch), 1, "fp32", cfg.optim.name, 1e12, 1.0, 1e9
            )
            for key in ("params", "grads", "optimizer", "teacher"):
                assert prediction.memory[key] == pytest.approx(result["state"][key], rel=0.01, abs=64), key
            assert prediction.memory["total"] == pytest.approx(result["peak_bytes"], rel=0.15), (ac, batch)
            peaks[batch] = result["peak_bytes"]
        small, large = batches
        slope = (peaks[large] - peaks[small]) / (large - small)
        if ac == "none":
            assert activation_bytes(trace, 1, ac) == pytest.approx(slope, rel=0.15)
        else:  # the recomputed block is counted on top of everything saved: an upper bound
            assert slope <= activation_bytes(trace, 1, ac) * 1.15


def test_state_bytes_shard_as_the_engines_do():
    trace = trace_step(load_recipe(TINY_RECIPE))
    ddp, fsdp, zero1, zero3 = (
        sum(state_bytes(trace, e, 8, "fp32", "adamw").values()) for e in ("ddp", "fsdp2", "zero1", "zero3")
    )
    assert fsdp == pytest.approx(ddp / 8) and zero3 == pytest.approx(ddp / 8)
    # ZeRO-1: weights, gradients and teacher replicated; moments and an fp32 master copy sharded
    assert zero1 == pytest.approx(
        4 * (trace.params + trace.trainable + trace.teacher_params) + (8 + 4) * trace.trainable / 8
    )


def test_planner_proposes_the_fastest_setting_that_fits():
    trace = trace_step(load_recipe(TINY_RECIPE))
    args = dict(world=2, precision="fp32", optimizer="adamw", peak_flops=1e12, mfu=0.5, bandwidth=1e10)
    table, roomy = plan(trace, 32, gpu_mem=2**34, **args)
    assert [p.setting.engine for p in table] == ["ddp", "fsdp2", "zero1", "zero2", "zero3"]
    assert roomy.setting.ac == "none" and roomy.setting.micro_batch == 32
    no_ckpt = predict(trace, Setting("fsdp2", micro_batch=32), **args)
    tight = 0.8 * no_ckpt.memory["total"]
    _, fitted = plan(trace, 32, gpu_mem=tight / 0.9, **args)
    assert fitted.memory["total"] <= tight
    assert fitted.setting.ac != "none" or fitted.setting.micro_batch < 32
    _, none = plan(trace, 32, gpu_mem=1024, **args)
    assert none is None


def test_plan_command(capsys):
    assert main(["plan", TINY_RECIPE, "--gpus", "2", "--gpu-mem", "1", "--gpu-tflops", "10"]) == 0
    out = capsys.readouterr().out
    assert "proposed:" in out and "engine.kind=" in out and "zero3" in out
    assert main(["plan", TINY_RECIPE, "--gpus", "3", "--gpu-mem", "1"]) == 2


def test_esvit_table_row_at_tiny_scale(tmp_path, capsys):
    out = tmp_path / "esvit9.json"
    assert (
        main(["bench", "table", "esvit9", "--rows", "Swin-T bs1", "--steps", "1", "--warmup", "0", "--json", str(out)])
        == 0
    )
    rows = json.loads(out.read_text())
    assert [r["row"] for r in rows] == ["(a) Swin-T bs1"] and rows[0]["batch"] == 1
    row = rows[0]
    assert row["flops_ratio"] > 1 and row["mem_ratio"] > 1  # the region head and its loss on every token
    assert row["paper"]["lvlr"]["mem_mb"] == 2346
    assert "FLOP x" in capsys.readouterr().out


def fresh_env() -> dict:
    """This process's environment without the process-group variables an in-process group exported."""
    launched = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "SCALE_LOCAL_LAUNCH")
    return {k: v for k, v in os.environ.items() if k not in launched}


def test_bench_on_two_ranks_reports_sharded_state(tmp_path):
    """`--nproc 2` spawns a gloo group; FSDP2 holds half of DDP's per-rank state (Engine.memory())."""
    out = tmp_path / "ranks.json"
    done = fork_server.run(
        [
            sys.executable,
            str(FORKED_RANKS),  # forked by the fork server, its ranks from it (tests/fork_server.py)
            "bench",
            TINY_RECIPE,
            "train.global_batch=4",
            "--synthetic-data",
            "--steps",
            "1",
            "--warmup",
            "0",
            "--nproc",
            "2",
            "--matrix",
            "engine=ddp,fsdp2",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=fresh_env(),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # no profiler noise on a CPU: kineto's "ERROR: gpuGetDeviceCount failed" and its STAGE lines (issue 48)
    assert not re.search(r"^(ERROR|WARNING|STAGE|INFO):20", done.stderr, re.M), done.stderr[-2000:]
    ddp, fsdp = json.loads(out.read_text())
    assert ddp["world"] == fsdp["world"] == 2 and ddp["per_rank_batch"] == 2
    assert fsdp["state"]["total"] / ddp["state"]["total"] == pytest.approx(0.5, abs=0.02)
    assert fsdp["comm_s"] > 0  # gloo all-gathers and reduce-scatters were seen
