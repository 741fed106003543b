"""What may change between a run and its continuation: data paths, logging, budgets, yes; shapes and method, no."""

from omegaconf import DictConfig, OmegaConf

from scale.checkpoint.store import CheckpointStore
from scale.config.load import from_dict
from scale.errors import ConfigError
from scale.rundir import RunDir

# dotted prefixes whose change makes a checkpoint unloadable or its meaning different
FIXED = [
    "model.name",
    "model.patch_size",
    "model.num_heads",
    "model.pos_embed",
    "model.pos_embed_trainable",
    "model.pooling",
    "model.final_norm",
    "model.bn_mlp",
    "model.window_size",
    "model.frozen_patch_embed",
    "method.kind",
    "method.dino.out_dim",
    "method.dino.hidden_dim",
    "method.dino.bottleneck_dim",
    "method.dino.head_layers",
    "method.dino.use_bn_in_head",
    "method.dino.predictor",
    "method.moco.variant",
    "method.moco.dim",
    "method.moco.mlp_dim",
    "method.moco.proj_layers",
    "method.moco.pred_layers",
    "method.drloc.mode",
    "optim.name",
    "engine.kind",
    "train.global_batch",
    "train.seed",
]


def _flat(cfg: DictConfig) -> dict:
    out = {}

    def walk(node, prefix):
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                out[f"{prefix}{key}"] = value

    walk(OmegaConf.to_container(cfg, resolve=True), "")
    return out


def check_compatible(saved: DictConfig, new: DictConfig, where: str) -> None:
    """Fail naming every fixed key that differs between the saved config and the new one."""
    old_flat, new_flat = _flat(saved), _flat(new)
    changed = [
        f"{k}: {old_flat.get(k)!r} -> {new_flat.get(k)!r}"
        for k in sorted(set(old_flat) | set(new_flat))
        if any(k == p or k.startswith(p + ".") for p in FIXED) and old_flat.get(k) != new_flat.get(k)
    ]
    if changed:
        raise ConfigError(
            f"{where} cannot be resumed with this recipe; these settings changed: "
            + "; ".join(changed)
            + ". Use a new --run-dir, or restore these values."
        )


def check_resumable(run: RunDir, cfg: DictConfig) -> None:
    """A run directory with a checkpoint continues only with a compatible recipe; one without (a start that failed
    before its first checkpoint) takes any recipe."""
    if run.config.exists() and CheckpointStore(run.checkpoints).step_dirs():
        check_compatible(from_dict(run.read_config(), str(run.config)), cfg, str(run.root))
