"""Shrink any recipe to a smoke run: the same method, engine, precision, view kinds and model options on a tiny
model of the same family, a few steps of embedded photos (nothing downloaded), 2 gloo ranks.

What is kept is what selects a code path (method and its variant switches, engine kind, activation checkpointing,
precision, grad accumulation, pos-embed / pooling / BN options, window size, local crops on or off, region loss
start, k-NN monitor); what is shrunk is only size (widths, crops, heads, batch, steps).
"""

import copy
import os
import tempfile
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from scale.errors import UserError
from scale.methods import has_class_head
from scale.methods.config import MOCO_KINDS
from scale.recipes.check import missing_pieces

SMOKE_DATASET = "photos"  # 12 classes of 64x64 crops of photos shipped by scikit-image / scikit-learn
SMOKE_CLASSES = 12
RANKS = 2
PER_RANK_BATCH = 4  # even: Mixup/CutMix pairs images within a rank's batch
SSL_GLOBAL, SSL_LOCAL = 32, 16
SUPERVISED_SIZE = 64  # DRLoc needs a token grid larger than 1x1 after Swin's four stages
MAX_LOCALS = 2  # per local size: a second local crop still exercises the multi-crop grouping
STEPS_PER_EPOCH, EPOCHS = 2, 2  # two epochs: epoch-gated switches (region loss start, last-layer freeze) flip


def default_data_root() -> Path:
    return Path(os.environ.get("SCALE_SMOKE_DATA", Path(tempfile.gettempdir()) / "scale-smoke-data"))


def ensure_smoke_data(root: Path | None = None) -> Path:
    """Build the embedded smoke data set under root (once) and return its directory (train/ and val/)."""
    from scale.data.embedded import build

    out = (root or default_data_root()) / SMOKE_DATASET
    if not all((out / split / "_info.json").is_file() for split in ("train", "val")):
        build(SMOKE_DATASET, out)
    return out


def tiny_model_name(name: str) -> str:
    for prefix, tiny in (
        ("vit_bn_", "vit_bn_nano"),
        ("vit_", "vit_nano"),
        ("swin_", "swin_nano"),
        ("resnet", "resnet_nano"),
        ("cvt_tiny", "cvt_nano_w"),
        ("cvt_", "cvt_nano"),
        ("t2t_vit_", "t2t_vit_nano"),
        ("vil_", "vil_nano"),
        ("pvt_", "pvt_nano"),
    ):
        if name.startswith(prefix):
            return tiny
    raise UserError(f"model.name '{name}': no tiny model of this family for a smoke run")


def _shrink_model(cfg: DictConfig, size: int) -> None:
    cfg.model.name = tiny_model_name(cfg.model.name)
    cfg.model.patch_size = None  # the tiny family's default (ViT 8, Swin 4): a few tokens at 32 px
    cfg.model.num_heads = None
    cfg.model.img_size = size


def _shrink_views(cfg: DictConfig, supervised: bool) -> int:
    views = cfg.data.views
    size = SUPERVISED_SIZE if supervised else SSL_GLOBAL
    views.global_size = size
    views.local_sizes = [SSL_LOCAL for _ in views.local_sizes]
    views.n_local = [min(int(n), MAX_LOCALS) for n in views.n_local]
    views.eval_crop = size
    views.eval_resize = size + size // 8
    return size


def _shrink_heads(cfg: DictConfig) -> None:
    method = cfg.method
    method.dino.out_dim, method.dino.hidden_dim, method.dino.bottleneck_dim = 64, 32, 16
    for kind in MOCO_KINDS:
        method[kind].dim, method[kind].mlp_dim = 16, 32
    method.swav.prototypes = 16
    method.swav.freeze_prototypes_steps = min(int(method.swav.freeze_prototypes_steps), 1)
    method.drloc.hidden_dim = 32


def _shrink_schedule(cfg: DictConfig) -> None:
    train, optim, dino = cfg.train, cfg.optim, cfg.method.dino
    train.global_batch = PER_RANK_BATCH * RANKS * int(cfg.engine.grad_accum)
    train.samples_per_epoch = STEPS_PER_EPOCH * train.global_batch
    train.epochs = EPOCHS
    train.max_steps = None
    train.log_every = 1
    train.ckpt_every_steps = 0
    train.keep_last = 1
    train.keep_every = 0
    optim.warmup_epochs = min(float(optim.warmup_epochs), 1.0)
    dino.warmup_teacher_temp_epochs = min(int(dino.warmup_teacher_temp_epochs), 1)
    dino.freeze_last_layer = min(int(dino.freeze_last_layer), 1)
    esvit = cfg.method.esvit
    esvit.region_from_epoch = min(int(esvit.region_from_epoch), 1)
    if train.knn_monitor_every:
        train.knn_monitor_every = 1
        cfg.eval.knn_monitor_queue = 32
        cfg.eval.knn_monitor_k = 5


def smoke_overrides(cfg: DictConfig, data_dir: Path | str | None = None) -> DictConfig:
    """A shrunk copy of recipe `cfg` (the input is not changed). data_dir holds the embedded data set's train/ and
    val/ shard directories (default: `default_data_root()/photos`, see `ensure_smoke_data`)."""
    missing = missing_pieces(cfg)
    if missing:
        raise UserError(f"{cfg.meta.name}: cannot smoke-run, needs " + "; ".join(missing))
    out = copy.deepcopy(cfg)  # keeps the typed schema: a mistyped assignment below would fail
    OmegaConf.set_readonly(out, False)  # the copy of a read-only input (a cache's) is ours to change
    supervised = has_class_head(out)
    size = _shrink_views(out, supervised)
    _shrink_model(out, size)
    _shrink_heads(out)
    _shrink_schedule(out)
    data = Path(data_dir) if data_dir is not None else default_data_root() / SMOKE_DATASET
    out.data.train, out.data.val = str(data / "train"), str(data / "val")
    out.data.num_classes = SMOKE_CLASSES
    out.data.workers = 0
    out.data.shuffle_buffer = 16
    if out.engine.precision == "fp16":  # fp16 needs a GPU's loss scaling; bf16 takes the same mixed-precision path
        out.engine.precision = "bf16"
    out.meta.devices = RANKS
    return out


def write_smoke_recipe(recipe: str, work_dir: Path | str, data_dir: Path | str | None = None) -> tuple[Path, Path]:
    """Shrink `recipe` and write it to work_dir/<name>.yaml; returns that file and the run directory its smoke run
    trains in (work_dir/<name>/)."""
    from scale.config import load_recipe, to_yaml

    data = Path(data_dir) if data_dir is not None else ensure_smoke_data()
    cfg = smoke_overrides(load_recipe(recipe), data)
    work = Path(work_dir)
    work.mkdir(parents=True, exist_ok=True)
    stem = cfg.meta.name.replace("/", "__")
    if cfg.train.init_weights:  # fine-tuning rows: start from an exported (here random) backbone of the tiny model
        cfg.train.init_weights = str(_random_backbone(cfg, work / f"{stem}.init.safetensors"))
    shrunk = work / f"{stem}.yaml"
    shrunk.write_text(to_yaml(cfg))
    return shrunk, work / stem


def smoke_run(
    recipe: str, work_dir: Path | str, data_dir: Path | str | None = None, overrides: list[str] | None = None
) -> int:
    """Shrink `recipe` (write_smoke_recipe) and train it on RANKS local gloo processes, with `overrides` (dotted
    key=value) on top; returns the exit status of `scale train`."""
    from scale.loop.train import main

    shrunk, run_dir = write_smoke_recipe(recipe, work_dir, data_dir)
    return main(str(shrunk), list(overrides or []), run_dir=str(run_dir), nproc=RANKS)


def _random_backbone(cfg: DictConfig, path: Path) -> Path:
    """A randomly initialised backbone of the shrunk model, saved as `scale ckpt export` would write it."""
    from safetensors.torch import save_file

    from scale.models import build_backbone

    backbone = build_backbone(cfg.model)
    save_file({k: v.contiguous() for k, v in backbone.state_dict().items()}, str(path))
    return path
