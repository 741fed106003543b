"""Start a fresh run from published or exported weights (`train.init_weights`, `train.init_what`): fine-tuning,
transfer rows and continued pre-training. The file's layout is detected (scale/checkpoint/layouts.py); what it
loads is strict: every tensor of a part it fills (the backbone always) must be in the file with its shape, and
every tensor the file gives must have a place. Each load says what was loaded, from where, and what started fresh
and why."""

import logging

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

from scale.checkpoint.layouts import Source, backbone_of, net_of, read_source
from scale.errors import ConfigError, UserError

log = logging.getLogger(__name__)


def _clean(key: str) -> str:
    """A name without activation-checkpoint wrapper segments (the checkpoint helpers strip them too)."""
    return key.replace("_checkpoint_wrapped_module.", "")


def _part(key: str) -> str:
    return key.split(".")[0]


LAYER_SCALE = (".ls1.gamma", ".ls2.gamma")  # DINOv2's and timm's LayerScale parameters (blocks.N.ls1.gamma)


def first_unmatched(expected: dict[str, tuple], weights: dict[str, torch.Tensor]) -> str | None:
    """The first key (sorted) that only one side has or whose shapes differ, described; None when they match."""
    for key in sorted(set(expected) | set(weights)):
        if key not in weights:
            return f"{key} {list(expected[key])} is not in the file"
        if key not in expected:
            hint = (
                " (LayerScale: set model.layer_scale, e.g. 1e-5, for a ViT that has it)"
                if key.endswith(LAYER_SCALE)
                else ""
            )
            return f"the file's {key} {list(weights[key].shape)} has no place in the recipe's net{hint}"
        if tuple(weights[key].shape) != expected[key]:
            return f"{key} is {list(weights[key].shape)} in the file, {list(expected[key])} in the recipe"
    return None


def plan(source: Source, what: str, targets: dict[str, dict[str, tuple]]) -> tuple[dict[str, dict], list[str]]:
    """For each target net (student/teacher -> {name: shape}): the tensors to load, and one line each saying what
    is loaded from where and what starts fresh and why. Raises UserError naming the first unmatched key."""
    loads, notes = {}, []
    for target, expected in targets.items():
        if what == "backbone":
            whose, backbone = backbone_of(source)
            weights = {f"backbone.{k}": v for k, v in backbone.items()}
            origin = f"{whose} backbone"
        else:
            whose = target if what == "all" else what
            weights, origin = net_of(source, whose), f"the {whose} net"
        given = {_part(k) for k in weights}
        fresh = sorted({_part(k) for k in expected} - given)
        if "backbone" in fresh:
            raise UserError(f"the file ({source.layout}) has no backbone for the {target}")
        problem = first_unmatched({k: s for k, s in expected.items() if _part(k) in given}, weights)
        if problem:
            raise UserError(f"the file ({source.layout}, {origin}) does not fit the recipe's {target}: {problem}")
        loads[target] = weights
        why = "--what backbone" if what == "backbone" else "the file has none"
        notes.append(
            f"{target}: loaded {', '.join(sorted(given))} ({len(weights)} tensors) from {origin} of a {source.layout}"
            + (f"; fresh: {', '.join(fresh)} ({why})" if fresh else "")
        )
    notes += [f"not loaded: {part} ({why})" for part, why in source.dropped.items()]
    return loads, notes


def _targets(nets: dict[str, nn.Module]) -> dict[str, dict[str, tuple]]:
    return {name: {_clean(k): tuple(v.shape) for k, v in net.state_dict().items()} for name, net in nets.items()}


def check_init_weights(cfg) -> None:
    """Before any rank starts: `train.init_weights` reads and fits the recipe's nets (built on the meta device) for
    `train.init_what`. An error here comes once, before a process group exists; found on the ranks after it, the
    first rank to leave could tear down a collective that a slower peer has not finished."""
    from scale.methods import build_method

    method = build_method(cfg, 1, 1, device="meta")
    nets = {n: m for n, m in (("student", method.student), ("teacher", method.teacher)) if m is not None}
    try:
        plan(read_source(cfg.train.init_weights), cfg.train.init_what, _targets(nets))
    except UserError as err:
        raise ConfigError(f"train.init_weights={cfg.train.init_weights}: {err}") from None


def load_init_weights(nets: dict[str, nn.Module], path: str, what: str, sharded: bool) -> None:
    """Load `path` into the student and teacher nets. `sharded`: the nets are already FSDP2-sharded (meta-device
    builds), so full tensors are scattered to the local shards."""
    nets = {name: net for name, net in nets.items() if net is not None}
    try:
        loads, notes = plan(read_source(path), what, _targets(nets))
    except UserError as err:
        raise UserError(f"train.init_weights={path}: {err}") from None
    for name, net in nets.items():
        if sharded:
            set_model_state_dict(net, loads[name], options=StateDictOptions(full_state_dict=True, strict=False))
        else:
            with torch.no_grad():
                net.load_state_dict(loads[name], strict=False)  # strict over what it fills: checked by plan()
    for note in notes:
        log.info("train.init_weights %s: %s", path, note)
