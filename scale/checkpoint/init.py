"""Start a fresh run from exported backbone weights (`train.init_weights`): fine-tuning and transfer rows."""

import logging

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from scale.errors import ConfigError, UserError
from scale.eval.weights import mismatch, read_state_dict

log = logging.getLogger(__name__)


def _backbone_keys(module: nn.Module) -> set[str]:
    return {k for k in module.state_dict() if k.startswith("backbone.")}


def check_init_weights(model_cfg, path: str) -> None:
    """Before any rank starts: `path` is a readable state dict with the names and shapes of the recipe's backbone
    (built on the meta device). An error here comes once, before a process group exists; found on the ranks after
    it, the first rank to leave could tear down a collective that a slower peer has not finished."""
    from scale.models import build_backbone

    expected = {k: tuple(v.shape) for k, v in build_backbone(model_cfg, device="meta").state_dict().items()}
    try:
        weights = read_state_dict(path)
    except UserError as err:
        raise ConfigError(f"train.init_weights: {err}") from None
    problem = mismatch(expected.keys(), weights.keys())
    wrong_shapes = [
        f"{k} {tuple(weights[k].shape)} != {shape}"
        for k, shape in expected.items()
        if k in weights and tuple(weights[k].shape) != shape
    ]
    if problem or wrong_shapes:
        raise ConfigError(
            f"train.init_weights {path} does not match the recipe's backbone: {problem or 'shapes ' + ', '.join(wrong_shapes[:5])}"
        )


def load_backbone_weights(modules: list[nn.Module], path: str, sharded: bool) -> None:
    """Load the backbone of every module (student, teacher) from `path`, strictly: every backbone key must be
    in the file and nothing else. `sharded`: the modules are already FSDP2-sharded (meta-device builds), so full
    tensors are scattered to the local shards."""
    weights = read_state_dict(path)
    for module in modules:
        problem = mismatch({k.removeprefix("backbone.") for k in _clean(_backbone_keys(module))}, weights.keys())
        if problem:
            raise UserError(f"train.init_weights {path} does not match the recipe's backbone: {problem}")
        prefixed = {f"backbone.{k}": v for k, v in weights.items()}
        if sharded:
            set_model_state_dict(module, prefixed, options=StateDictOptions(full_state_dict=True, strict=False))
        else:
            with torch.no_grad():
                module.get_submodule("backbone").load_state_dict(weights, strict=True)
    log.info("initialised the backbone from %s (%d tensors)", path, len(weights))


def _clean(keys: set[str]) -> set[str]:
    """Names without activation-checkpoint wrapper segments (the checkpoint helpers strip them too)."""
    return {k.replace("_checkpoint_wrapped_module.", "") for k in keys}
