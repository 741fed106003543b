"""`scale eval finetune`, a command over the training loop: end-to-end fine-tuning from an exported backbone (MoCo v3 Table 5, DINO Table 6, DRLoc Table 4).

A fine-tuning row is a supervised recipe (DeiT's: AdamW, warmup + cosine, drop path, RandAugment, mixup/cutmix,
label smoothing), so `scale eval finetune RECIPE --weights FILE` is `scale train RECIPE train.init_weights=FILE`:
it shards, checkpoints, resumes after preemption and runs under Slurm like any run, and its result is the
validation history the training loop records (top-1/top-5 on data.val every train.val_every_epochs epochs).
`--random-init` trains the same recipe from scratch (the tables' "random init" baselines).
"""

from pathlib import Path

from omegaconf import DictConfig

from scale.engine.dist import detect
from scale.errors import UserError
from scale.loop import train
from scale.methods import has_class_head
from scale.readback import VAL_RESULT, read_json


def check_recipe(cfg: DictConfig, recipe: str) -> None:
    if not has_class_head(cfg):
        raise UserError(
            f"scale eval finetune: {recipe} trains method.kind={cfg.method.kind}, which has no class "
            f"head; fine-tune with a supervised recipe, e.g. mocov3/table5/vit_b_cifar10_mocov3, "
            f"dino/table6/vit_s16_cifar10 or drloc/table4/swin_cifar10_drloc"
        )
    if cfg.train.val_every_epochs <= 0:
        raise UserError(
            "scale eval finetune: train.val_every_epochs must be positive (the result is the validation history)"
        )


def run(
    cfg: DictConfig, recipe: str, overrides: list[str], weights: str | None, run_dir: str | None, nproc: int
) -> dict | int:
    """Train (or continue) the fine-tuning run; its result on the main process, else the exit status (a
    preempted run returns PREEMPTED_EXIT_CODE: run the same command again to continue it)."""
    check_recipe(cfg, recipe)
    run_dir = Path(run_dir or Path("runs") / "finetune" / cfg.meta.name)
    # --random-init clears the recipe's own init_weights
    init = f"train.init_weights={Path(weights).resolve()}" if weights else "train.init_weights=''"
    status = train.main(recipe, [*overrides, init], str(run_dir), nproc)
    if status != 0 or not detect().is_main:
        return status
    val = read_json(run_dir / "eval" / "val.json", VAL_RESULT)  # BadFile: exit 2 naming it
    history = val["history"]
    return {
        "eval": "finetune",
        "model": cfg.model.name,
        "weights": weights,
        "random_init": weights is None,
        "recipe": cfg.meta.name,
        "run_dir": str(run_dir),
        "val": val["val"],
        "epochs": cfg.train.epochs,
        "global_batch": cfg.train.global_batch,
        "history": history,
        "top1": history[-1]["top1"],
        "top5": history[-1]["top5"],
        "best_top1": max(h["top1"] for h in history),
    }
