"""The papers' cost tables measured on the machine at hand, with the paper's numbers beside them.

- dino8: DINO Table 8, ViT-S/16 with 2x224, +2x96, +6x96, +10x96 crops: time per step, peak memory per device,
  and the hours of 100 / 300 epochs extrapolated to the paper's 16 devices from the measured images/s per device;
- esvit9: EsViT Table 9, memory and time per iteration with the view loss alone (LV) and with the region loss
  (LV+LR): (a) ViT-S vs Swin-T at batch 1, 8, 12; (b) Swin-T/S/B with window 7 and 14 at batch 1;
- mocov3-3: MoCo v3 Table 3, multiply-adds per 224 crop (counted at full size whatever the scale) and the hours of
  100 epochs extrapolated to `--devices` devices from the measured images/s per device.

`--scale full` runs the recipes' real models (a GPU, or small batches on a CPU); `--scale tiny` runs the same
recipes shrunk (scale.recipes.smoke: a nano model of the family, 32/16 px crops) with the crop counts and small
batches kept, which checks the machinery on a CPU in seconds, not the papers' ratios.
"""

import json

from omegaconf import OmegaConf

from scale.bench.mfu import step_flops
from scale.bench.run import bench_config
from scale.bench.trace import trace_step
from scale.config import load_recipe
from scale.data.synthetic import IMAGENET_TRAIN
from scale.errors import UserError
from scale.models.complexity import count_macs
from scale.models.config import ModelConfig
from scale.models.registry import build_backbone
from scale.recipes.smoke import smoke_overrides

DINO8 = [
    ("2x224", "dino/table8/crops_2x224_0x96_ep300"),
    ("2x224+2x96", "dino/table8/crops_2x224_2x96_ep300"),
    ("2x224+6x96", "dino/table8/crops_2x224_6x96_ep300"),
    ("2x224+10x96", "dino/table8/crops_2x224_10x96_ep300"),
]
ESVIT9 = [
    ("(a) ViT-S bs1", "a_vit_s_bs1"),
    ("(a) ViT-S bs8", "a_vit_s_bs8"),
    ("(a) ViT-S bs12", "a_vit_s_bs12"),
    ("(a) Swin-T bs1", "a_swin_t_bs1"),
    ("(a) Swin-T bs8", "a_swin_t_bs8"),
    ("(a) Swin-T bs12", "a_swin_t_bs12"),
    ("(b) Swin-T W7", "b_swin_t_w7"),
    ("(b) Swin-T W14", "b_swin_t_w14"),
    ("(b) Swin-S W7", "b_swin_s_w7"),
    ("(b) Swin-S W14", "b_swin_s_w14"),
    ("(b) Swin-B W7", "b_swin_b_w7"),
    ("(b) Swin-B W14", "b_swin_b_w14"),
]
MOCO3 = [
    ("ViT-S/16", "mocov3/table4/vit_s_mocov3", 4.6, 256, 1.2),
    ("ViT-B/16", "mocov3/table1/vit_b", 17.5, 256, 2.1),
    ("ViT-L/16", "mocov3/table1/vit_l", 61.3, 256, 6.1),
    ("ViT-H/14", "mocov3/table1/vit_h", 166.7, 512, 9.8),
]
SMALL_BATCH = 16  # recipes with at most this global batch (EsViT Table 9) keep it at tiny scale
TINY_BATCH = 4


def scaled(recipe: str, scale: str, batch: int | None, overrides: list[str]):
    """The recipe at `scale`; `batch` replaces its global batch (default: kept at full scale, small at tiny)."""
    cfg = load_recipe(recipe, overrides)
    if scale == "tiny":
        views = OmegaConf.to_container(cfg.data.views)
        keep = cfg.train.global_batch if cfg.train.global_batch <= SMALL_BATCH else TINY_BATCH
        cfg = smoke_overrides(cfg)
        cfg.data.views.n_global, cfg.data.views.n_local = views["n_global"], views["n_local"]
        cfg.train.global_batch = keep
    elif scale != "full":
        raise UserError(f"--scale must be tiny or full, got '{scale}'")
    if batch is not None:
        cfg.train.global_batch = batch
    return cfg


def hours(epochs: int, recipe_cfg, images_per_s_per_device: float, devices: int) -> float:
    """Hours of `epochs` epochs of the (unshrunk) recipe's data at this throughput per device."""
    samples = recipe_cfg.train.samples_per_epoch or IMAGENET_TRAIN
    return epochs * samples / (images_per_s_per_device * devices) / 3600


class Measure:
    def __init__(self, args):
        from scale.engine.dist import init_distributed

        self.args = args
        self.info, self.device = init_distributed()

    def __call__(self, cfg) -> dict:
        return bench_config(
            cfg,
            self.info,
            self.device,
            steps=self.args.steps,
            warmup=self.args.warmup,
            synthetic=True,
            count_flops=False,
        )


def mb(value) -> float:
    return value / 2**20


def dino8(args, measure) -> tuple[list[dict], str]:
    rows, lines = (
        [],
        [
            f"DINO Table 8 (ViT-S/16), {args.scale} scale: time/step and peak memory here; hours "
            f"extrapolated to the paper's devices (paper's in brackets)",
            f"{'crops':14s} {'batch':>5s} {'s/step':>8s} {'img/s/dev':>10s} {'peak MiB':>9s} "
            f"{'100ep h':>9s} {'300ep h':>9s} {'paper 300ep h':>14s} {'paper mem':>10s}",
        ],
    )
    for name, recipe in DINO8:
        cfg = scaled(recipe, args.scale, args.batch, args.overrides)
        r = measure(cfg)
        full, devices = load_recipe(recipe, args.overrides), cfg.meta.devices
        row = {
            "crops": name,
            "batch": cfg.train.global_batch,
            "step_s": r["step_s"],
            "peak_bytes": r["peak_bytes"],
            "images_per_s_per_device": r["images_per_s_per_device"],
            "hours_100": hours(100, full, r["images_per_s_per_device"], devices),
            "hours_300": hours(300, full, r["images_per_s_per_device"], devices),
            "paper": dict(cfg.meta.reported),
        }
        rows.append(row)
        lines.append(
            f"{name:14s} {row['batch']:5d} {r['step_s']:8.3f} {r['images_per_s_per_device']:10.2f} "
            f"{mb(r['peak_bytes']):9.1f} {row['hours_100']:9.1f} {row['hours_300']:9.1f} "
            f"{row['paper'].get('time_h', '-'):>14} {str(row['paper'].get('mem_gb', '-')) + 'G':>10s}"
        )
    return rows, "\n".join(lines)


def measured(result: dict, flops: float) -> dict:
    """A setting's numbers in a table row: the median step time (on a shared machine a few steps slowed by other
    processes would move a mean), the mean and the phases beside it."""
    return {
        "peak_bytes": result["peak_bytes"],
        "step_s": result["step_s_median"],
        "step_s_mean": result["step_s"],
        "phases": result["phases"],
        "flops": flops,
    }


def esvit9(args, measure) -> tuple[list[dict], str]:
    rows = []
    lines = [
        f"EsViT Table 9, {args.scale} scale: [peak MiB / median s per iteration] here, paper's in brackets; "
        f"FLOP x = the time ratio the model FLOPs of the extra region passes predict",
        f"{'row':16s} {'batch':>5s} {'LV':>20s} {'LV+LR':>20s} {'mem x':>6s} {'time x':>7s} {'FLOP x':>7s} "
        f"{'paper LV':>16s} {'paper LV+LR':>16s} {'paper x':>13s}",
    ]
    for name, stem in ESVIT9:
        if args.rows and not any(name.endswith(part) for part in args.rows):
            continue
        pair = {}
        for loss in ("lv", "lvlr"):
            cfg = scaled(f"esvit/table9/{stem}_{loss}", args.scale, args.batch, args.overrides)
            pair[loss] = (cfg, measure(cfg), step_flops(trace_step(cfg), cfg.train.global_batch))
        (cfg, lv, lv_flops), (_, lvlr, lvlr_flops) = pair["lv"], pair["lvlr"]
        paper = {k: dict(pair[k][0].meta.reported) for k in pair}
        row = {
            "row": name,
            "batch": cfg.train.global_batch,
            "lv": measured(lv, lv_flops),
            "lvlr": measured(lvlr, lvlr_flops),
            "mem_ratio": lvlr["peak_bytes"] / lv["peak_bytes"],
            "time_ratio": lvlr["step_s_median"] / lv["step_s_median"],
            "flops_ratio": lvlr_flops / lv_flops,
            "paper": paper,
        }
        rows.append(row)
        p_lv, p_lr = paper["lv"], paper["lvlr"]
        lines.append(
            f"{name:16s} {row['batch']:5d} {mb(lv['peak_bytes']):10.1f}/{lv['step_s_median']:8.3f} "
            f"{mb(lvlr['peak_bytes']):10.1f}/{lvlr['step_s_median']:8.3f} {row['mem_ratio']:6.2f} "
            f"{row['time_ratio']:7.2f} {row['flops_ratio']:7.2f} "
            f"{p_lv['mem_mb']:>8}/{p_lv['s_per_iter']:.3f} {p_lr['mem_mb']:>8}/{p_lr['s_per_iter']:.3f} "
            f"{p_lr['mem_mb'] / p_lv['mem_mb']:6.2f}/{p_lr['s_per_iter'] / p_lv['s_per_iter']:5.2f}"
        )
    return rows, "\n".join(lines)


def gmacs_224(model_cfg) -> float:
    cfg = ModelConfig(**OmegaConf.to_container(model_cfg))
    return count_macs(build_backbone(cfg, device="meta"), 224) / 1e9


def mocov3_3(args, measure) -> tuple[list[dict], str]:
    rows, lines = (
        [],
        [
            f"MoCo v3 Table 3, {args.scale} scale: GMACs per 224 crop (full-size model), hours per 100 "
            f"epochs extrapolated from the measured images/s per device (paper's TPU v3 in brackets)",
            f"{'model':9s} {'GMACs':>7s} {'vs R50':>7s} {'batch':>5s} {'s/step':>8s} {'img/s/dev':>10s} "
            f"{'devices':>8s} {'100ep h':>9s} {'paper GMACs':>12s} {'paper h':>8s}",
        ],
    )
    r50 = count_macs(build_backbone(ModelConfig(name="resnet50"), device="meta"), 224) / 1e9
    for name, recipe, paper_gmacs, paper_devices, paper_hours in MOCO3:
        full = load_recipe(recipe, args.overrides)
        cfg = scaled(recipe, args.scale, args.batch, args.overrides)
        r = measure(cfg)
        devices = args.devices or paper_devices
        gmacs = gmacs_224(full.model)
        row = {
            "model": name,
            "gmacs_per_crop": gmacs,
            "vs_r50": gmacs / r50,
            "batch": cfg.train.global_batch,
            "step_s": r["step_s"],
            "images_per_s_per_device": r["images_per_s_per_device"],
            "devices": devices,
            "hours_100": hours(100, full, r["images_per_s_per_device"], devices),
            "paper": {"gmacs": paper_gmacs, "devices": paper_devices, "hours_100": paper_hours},
        }
        rows.append(row)
        lines.append(
            f"{name:9s} {gmacs:7.1f} {gmacs / r50:6.1f}x {row['batch']:5d} {r['step_s']:8.3f} "
            f"{r['images_per_s_per_device']:10.2f} {devices:8d} {row['hours_100']:9.1f} "
            f"{paper_gmacs:12.1f} {paper_hours:8.1f}"
        )
    return rows, "\n".join(lines)


TABLES = {"dino8": dino8, "esvit9": esvit9, "mocov3-3": mocov3_3}


def run(args) -> int:
    """`scale bench table` with its parsed arguments (scale.commands.bench.table_parser)."""
    from scale.engine.dist import shutdown

    try:
        rows, text = TABLES[args.table](args, Measure(args))
    finally:
        shutdown()
    print(text)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    return 0
