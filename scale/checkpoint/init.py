"""Start a fresh run from exported backbone weights (`train.init_weights`): fine-tuning and transfer rows."""

import logging

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from scale.errors import UserError
from scale.eval.weights import read_state_dict

log = logging.getLogger(__name__)


def _backbone_keys(module: nn.Module) -> set[str]:
    return {k for k in module.state_dict() if k.startswith("backbone.")}


def load_backbone_weights(modules: list[nn.Module], path: str, sharded: bool) -> None:
    """Load the backbone of every module (student, teacher) from `path`, strictly: every backbone key must be
    in the file and nothing else. `sharded`: the modules are already FSDP2-sharded (meta-device builds), so full
    tensors are scattered to the local shards."""
    weights = read_state_dict(path)
    for module in modules:
        wanted = {k.removeprefix("backbone.") for k in _clean(_backbone_keys(module))}
        missing, unexpected = sorted(wanted - weights.keys()), sorted(weights.keys() - wanted)
        if missing or unexpected:
            raise UserError(
                f"train.init_weights {path} does not match the recipe's backbone: missing "
                f"{missing[:5]}, unexpected {unexpected[:5]}"
            )
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
