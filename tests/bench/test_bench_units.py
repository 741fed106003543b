"""Units of the benchmark: matrix settings, synthetic batches, collective time, FLOPs of a step, table formulas."""

from pathlib import Path

import pytest
import torch

from scale.bench.activation_memory import format_rows as format_activation_rows
from scale.bench.activation_memory import table as activation_table
from scale.bench.matrix import crop_overrides, format_table, load_setting, parse_matrix, setting_overrides, split_axes
from scale.bench.memory import union_seconds
from scale.bench.mfu import mfu, step_flops, table_peak
from scale.bench.tables import IMAGENET_TRAIN, hours, scaled
from scale.bench.trace import trace_step
from scale.commands.bench import _train_parser
from scale.config import load_recipe
from scale.data.prefetch import prefetch_to_device
from scale.data.synthetic import SyntheticLoader, crop_layout, random_batch
from scale.errors import UserError
from scale.loop.step import TrainStep
from scale.models.complexity import count_macs
from scale.models.config import ModelConfig
from scale.models.registry import build_backbone

TINY_RECIPE = str(Path(__file__).with_name("tiny_dino.yaml"))


def test_matrix_settings_become_recipe_overrides():
    assert setting_overrides("engine", "zero3") == ["engine.kind=deepspeed", "engine.zero_stage=3"]
    assert setting_overrides("ac", "every3") == ["engine.activation_checkpointing=every_n", "engine.ac_every_n=3"]
    assert setting_overrides("compile", "true") == ["engine.compile=true"]
    assert parse_matrix(["compile=false,true", "ac=none,selective"]) == [
        ("compile", ["false", "true"]),
        ("ac", ["none", "selective"]),
    ]
    assert crop_overrides("2x224+10x96") == [
        "data.views.n_global=2",
        "data.views.global_size=224",
        "data.views.local_sizes=[96]",
        "data.views.n_local=[10]",
    ]
    assert crop_overrides("2x224")[-1] == "data.views.n_local=[0]"
    cfg = load_setting(TINY_RECIPE, [], {"micro_batch": "8", "crops": "2x64+6x32"}, world_size=2)
    assert cfg.engine.grad_accum == 4  # 64 images / 2 ranks / 8 per forward
    assert list(cfg.data.views.n_local) == [6]
    for bad in (["engine"], ["nokey=1"]):
        with pytest.raises(UserError):
            parse_matrix(bad)
    with pytest.raises(UserError, match="micro_batch 5"):
        load_setting(TINY_RECIPE, [], {"micro_batch": "5"}, world_size=2)
    with pytest.raises(UserError):
        crop_overrides("two crops")


def test_matrix_takes_axes_and_overrides_in_any_order():
    argv = ["R", "--matrix", "engine=ddp,fsdp2", "optim.lr=0.1", "--steps", "2", "--matrix", "ac=none,full", "a.b=1"]
    args = _train_parser().parse_intermixed_args(argv)
    assert args.matrix == ["engine=ddp,fsdp2", "ac=none,full"]
    assert args.overrides == ["optim.lr=0.1", "a.b=1"] and args.steps == 2
    # several short-key axes after one flag (the form) are axes; a dotted override among them is not
    argv = ["R", "--matrix", "compile=false,true", "ac=none,selective,full", "optim.lr=0.1"]
    overrides, axes = split_axes(_train_parser().parse_intermixed_args(argv).overrides)
    assert axes == ["ac=none,selective,full"] and overrides == ["optim.lr=0.1"]


def test_synthetic_batches_have_the_recipes_layout():
    cfg = load_recipe("dino/table8/crops_2x224_10x96_ep300")
    assert crop_layout(cfg.data.views) == [(2, 224), (10, 96)]
    assert crop_layout(load_recipe("mocov3/table1/vit_b").data.views) == [(2, 224)]
    tiny = load_recipe(TINY_RECIPE, ["train.global_batch=6"])
    batch = next(iter(SyntheticLoader(tiny, rank=1, world_size=2)))
    assert batch.batch_size == 3 and batch.views_per_group == [2, 4]
    assert [tuple(c.shape) for c in batch.crops] == [(6, 3, 64, 64), (12, 3, 32, 32)]
    assert random_batch(tiny, 2).labels.max() < tiny.data.num_classes
    with pytest.raises(UserError, match="divisible"):
        SyntheticLoader(load_recipe(TINY_RECIPE, ["train.global_batch=5"]), 0, 2)


def test_a_synthetic_batch_on_the_device_is_made_once_and_never_copied():
    """The bench's batch lives on the device: no prefetcher (a CUDA device is named, never touched) and no copy."""
    tiny = load_recipe(TINY_RECIPE, ["train.global_batch=2"])
    loader = SyntheticLoader(tiny, 0, 1, torch.device("cpu"))
    assert prefetch_to_device(loader, torch.device("cuda"), True, lambda batch: None) is loader
    first, second = list(zip(range(2), loader))
    assert first[1] is second[1] and loader.on_device and not SyntheticLoader(tiny, 0, 1).on_device


def test_collective_time_counts_overlaps_once():
    assert union_seconds([(0, 10**9), (5 * 10**8, 2 * 10**9), (3 * 10**9, 4 * 10**9)]) == pytest.approx(3.0)
    assert union_seconds([]) == 0


def test_step_flops_count_every_crop_through_student_and_global_crops_through_teacher():
    cfg = load_recipe("dino/table8/crops_2x224_10x96_ep300")
    trace = trace_step(cfg)  # ViT-S/16 at full size, on fake tensors
    vit_s = build_backbone(ModelConfig(name="vit_small", patch_size=16), device="meta")
    global_flops, local_flops = 2 * count_macs(vit_s, 224), 2 * count_macs(vit_s, 96)
    backbone_student = 2 * global_flops + 10 * local_flops
    heads = trace.per_image(trace.student_flops) - backbone_student
    # the DINO head on 12 pooled vectors: 384->2048->2048->256->65536 multiply-adds
    head_flops = 2 * 12 * (384 * 2048 + 2048 * 2048 + 2048 * 256 + 256 * 65536)
    assert heads == pytest.approx(head_flops, rel=0.01)
    assert trace.per_image(trace.teacher_flops) == pytest.approx(2 * global_flops + head_flops / 6, rel=0.01)
    assert step_flops(trace, 4) == pytest.approx(4 * trace.per_image(3 * trace.student_flops + trace.teacher_flops))
    assert len(trace.blocks) == 2 * 12  # one backbone call per resolution group
    assert mfu(100.0, 2.0, 25.0, 2) == pytest.approx(1.0)
    assert table_peak("NVIDIA A100-SXM4-80GB", "bf16") == 312e12
    assert table_peak("NVIDIA H100 PCIe", "fp32") == 51e12
    assert table_peak("Some CPU", "fp32") is None


def test_the_planner_traces_the_training_step_itself(monkeypatch):
    calls, step_call = [], TrainStep.__call__

    def spy(self, step, batch):
        calls.append((step, type(self.engine).__name__, batch.batch_size))
        return step_call(self, step, batch)

    monkeypatch.setattr(TrainStep, "__call__", spy)
    trace = trace_step(load_recipe(TINY_RECIPE, ["method.esvit.region_from_epoch=2"]))
    assert calls == [(2, "TracingEngine", 2)]  # one step of 2 images, at the epoch where a region loss is on
    assert len(trace.blocks) == 2 * 3 and trace.loss_saved > 0 and trace.net_saved > 0  # 2 resolutions, depth 3


def test_tables_shrink_but_keep_crop_counts_and_extrapolate_hours():
    cfg = scaled("dino/table8/crops_2x224_10x96_ep300", "tiny", None, [])
    assert cfg.model.name == "vit_nano" and list(cfg.data.views.n_local) == [10] and cfg.train.global_batch == 4
    esvit = scaled("esvit/table9/a_swin_t_bs12_lvlr", "tiny", None, [])
    assert esvit.model.name == "swin_nano" and esvit.train.global_batch == 12
    assert scaled("esvit/table9/a_swin_t_bs12_lvlr", "full", 2, []).model.name == "swin_tiny"
    recipe = load_recipe("dino/table8/crops_2x224_10x96_ep300")
    assert hours(100, recipe, 1000.0, 16) == pytest.approx(100 * IMAGENET_TRAIN / 16000 / 3600)
    with pytest.raises(UserError):
        scaled(TINY_RECIPE, "huge", None, [])


def test_table_formatting():
    row = {
        "label": "ac=none",
        "step_s": 2.0,
        "compile_s": 31.0,
        "images_per_s": 4.0,
        "images_per_s_per_device": 2.0,
        "crops_per_s_per_device": 12.0,
        "comm_s": 0.1,
        "peak_bytes": 2**20,
        "rss_peak_bytes": None,
        "state": {"total": 2**21},
        "mfu": 0.25,
        "phases": {"data": 0.0, "forward": 0.5, "backward": 1.0, "optimizer": 0.3, "other": 0.2},
    }
    line = format_table([row]).splitlines()[1]
    assert "ac=none" in line and "25.0%" in line and " 1.0 " in line and " 2.0 " in line and " 31.0 " in line
    # a long setting is printed whole, and the columns after it stay aligned with the header
    long = {**row, "label": "compile=true ac=selective batch=2 precision=fp32"}
    head, short_line, long_line = format_table([row, long]).splitlines()
    assert long_line.startswith(long["label"] + " ")
    assert (
        head.index("step s") + len("step s") == short_line.index("2.000") + len("2.000") == long_line.index("2.000") + 5
    )


def test_activation_table_takes_the_slope_over_batches_and_medians_over_rounds():
    def run(peak, step_s, cpu_s):
        return {"peak_bytes": peak, "step_s_median": step_s, "step_cpu_s_median": cpu_s}

    mib = 2**20
    runs = {
        ("none", 1): [run(1000 * mib, 1.0, 1.0)] * 3,
        ("none", 3): [run(1400 * mib, s, 2 * s) for s in (9.0, 3.0, 4.0)],  # 200 MiB per image
        ("full", 1): [run(900 * mib, 1.0, 1.0)] * 3,
        ("full", 3): [run(950 * mib, s, 2 * s) for s in (5.0, 4.0, 6.0)],  # 25 MiB per image
    }
    none, full = activation_table(runs, ["none", "full"], [3, 1])
    assert none["per_image_bytes"] == 200 * mib and full["per_image_bytes"] == 25 * mib
    assert (none["step_s"], full["step_s"], full["step_cpu_s"]) == (4.0, 5.0, 10.0)
    line = format_activation_rows([none, full], [1, 3]).splitlines()[-1]
    assert line == "| full | 900 / 950 | 25 MiB | 8.00x | 5.00 | 1.25x | 10.00 | 1.25x |"
