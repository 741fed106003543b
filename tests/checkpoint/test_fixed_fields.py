"""Fixed-on-resume is a fact of the schema: every field whose change alters a checkpointed tensor (a parameter's or
buffer's shape, the method's state, the set of trained parameters the optimizer state is keyed by) must be declared
FIXED. The walk perturbs each field of recipe-like configs, builds the method on the meta device, and compares."""

import pytest
import torch
from omegaconf import OmegaConf

from scale.checkpoint.resume import keys_with
from scale.config import load_recipe
from scale.config.fields import FIXED
from scale.config.schema import Recipe
from scale.config.validate import get_key, schema_rules
from scale.errors import UserError
from scale.methods import build_method

# one config per family of checkpointed shapes: methods x backbones
CONFIGS = {
    "dino_vit": ("demo/dino_tiny", []),
    "dino_resnet": ("demo/dino_tiny", ["model.name=resnet_nano"]),
    "esvit_swin": ("demo/esvit_tiny", []),
    "drloc_swin": ("demo/drloc_tiny", []),
    "supervised_vit": ("demo/drloc_tiny", ["method.kind=supervised", "model.name=vit_nano", "model.patch_size=4"]),
    **{
        f"moco_{kind}": ("demo/mocov3_tiny", [f"method.kind={kind}", "method.mocov2.queue_size=64"])
        for kind in ("mocov3", "mocov2", "simclr", "byol", "swav")
    },
}


def signature(cfg) -> dict:
    """What a checkpoint of `cfg`'s method holds, by key: shapes of the student's and teacher's tensors, of the
    method's own state, and which student parameters are trained (the optimizer's state)."""
    method = build_method(cfg, 10, 100, device="meta")
    out = {}
    for part in ("student", "teacher"):
        net = getattr(method, part, None)
        if net is not None:
            out.update({f"{part}.{k}": tuple(v.shape) for k, v in net.state_dict().items()})
    out.update({f"state.{k}": tuple(v.shape) for k, v in vars(method).items() if isinstance(v, torch.Tensor)})
    out["trained"] = tuple(sorted(n for n, p in method.student.named_parameters() if p.requires_grad))
    return out


def perturbed(value, rule) -> list:
    """Other valid values of a field to try: another choice, a flipped bool, a larger number."""
    choices = rule.get("choices")
    if choices is not None:
        options = choices() if callable(choices) else choices
        if OmegaConf.is_list(value):  # a list of choices (train.reset): one other element
            return [[c] for c in options if [c] != list(value)]
        return [c for c in options if c != value]
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [v for v in (value * 2, value + 1) if v != value]
    if value is None and "low" in rule:
        return [8, 2]
    if isinstance(value, list) and value and isinstance(value[0], int) and not isinstance(value[0], bool):
        return [[v * 2 for v in value]]
    return []  # floats, paths and free text shape no tensor


# the sections the method's build reads; engine and optim shape only the optimizer's and engine's own files, and
# declare what does (engine.zero_stage, optim.name; engine.kind is NOTED: DDP and FSDP2 share the DCP format, and
# the load refuses DeepSpeed's files by format) by hand
BUILT_FROM = ("model.", "method.", "data.", "train.")


def shaping_fields(recipe: str, overrides: list[str], sections: tuple[str, ...] = BUILT_FROM) -> set[str]:
    base_cfg = load_recipe(recipe, overrides)
    base = signature(base_cfg)
    fixed = set(keys_with(FIXED))
    found = set()
    for dotted, rule in schema_rules(Recipe):
        if dotted in fixed or not dotted.startswith(sections):
            continue
        for value in perturbed(get_key(base_cfg, dotted), rule):
            cfg = base_cfg.copy()
            OmegaConf.update(cfg, dotted, value, merge=False)
            try:
                changed = signature(cfg) != base
            except (UserError, ValueError, AssertionError, RuntimeError, KeyError, TypeError):
                continue  # not a valid combination with this config's other fields
            if changed:
                found.add(dotted)
            break
    return found


@pytest.mark.slow  # a thousand meta-device builds: over a minute of CPU
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_field_that_shapes_a_checkpoint_is_fixed_on_resume(name):
    recipe, overrides = CONFIGS[name]
    assert shaping_fields(recipe, overrides) == set(), "declare these FIXED on resume in the schema"


def test_the_walk_finds_a_shaping_field_left_free(monkeypatch):
    """The walk is not blind: with model.img_size and data.num_classes declared free it names them."""
    freed = [k for k in keys_with(FIXED) if k not in ("model.img_size", "data.num_classes")]
    monkeypatch.setattr(f"{__name__}.keys_with", lambda resume: freed)
    assert {"model.img_size", "data.num_classes"} <= shaping_fields("demo/drloc_tiny", [], ("model.", "data."))
