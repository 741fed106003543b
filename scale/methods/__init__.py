"""Methods: DINO, EsViT, MoCo v3, MoCo v2, SimCLR, BYOL, SwAV (MoCo v3 Table 4, DINO Table 7), DRLoc, supervised.

`build_method(cfg, steps_per_epoch, total_steps)` builds the class that `cfg.method.kind` names in the registry
(scale/methods/registry.py: each class declares its kind); each kind reads its own section of `method`,
`method.<kind>` (scale/methods/config.py).
Imports are local so that importing `scale.methods.base` (the contract) and `scale.methods.config` (the recipe
schema, which `scale --help` imports) stays light: no torch here at module level.
"""

from scale.errors import UserError
from scale.methods.registry import kind, method_class


def has_class_head(cfg) -> bool:
    """Whether recipe `cfg`'s method ends in a class head (the training loop validates it on data.val)."""
    return kind(cfg.method.kind).classifies


def build_method(
    cfg,
    steps_per_epoch: int,
    total_steps: int,
    device=None,
    backbone_fn=None,
    dp_group=None,
):
    """The Method of recipe `cfg`, its modules built on `device` ("meta": the engine allocates and initialises them
    after sharding; it also converts BatchNorm to SyncBN on GPUs). `backbone_fn(drop_path=None) -> nn.Module`
    defaults to the model registry's `build_backbone(cfg.model, ...)`; teachers get drop_path=0. `dp_group`: the
    data-parallel group of the parallel context, over which the losses' collectives run (None: one process).
    `device`: a torch.device or its name."""
    if steps_per_epoch <= 0 or total_steps <= 0:
        raise UserError(f"steps_per_epoch ({steps_per_epoch}) and total_steps ({total_steps}) must be positive")
    cls = method_class(cfg.method.kind)
    if backbone_fn is None:
        from scale.models import build_backbone

        def backbone_fn(drop_path=None):
            return build_backbone(cfg.model, drop_path=drop_path)

    from scale.models.registry import building_on

    with building_on(device):  # heads too, not only backbones
        method = cls(cfg, steps_per_epoch, total_steps, backbone_fn)
    method.dp_group = dp_group
    return method
