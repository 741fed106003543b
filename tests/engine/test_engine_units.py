"""Single-process pieces of the engines: parameter groups and optimizers, eager optimizer state, clipping rules,
activation checkpointing, names through wrappers, meta-device init checks, precision and config errors."""

import copy
import dataclasses

import pytest
import torch
from engine_toy import ToyMethod, context, make_batch, optim_config
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from scale.engine.activation_checkpointing import apply_activation_checkpointing, blocks_to_checkpoint
from scale.engine.clip import clip_gradients
from scale.engine.config import EngineConfig
from scale.engine.factory import build_engine
from scale.engine.materialize import materialize
from scale.engine.parallel import ParallelContext
from scale.engine.params import clean_name
from scale.engine.precision import resolve_precision
from scale.errors import UserError
from scale.models.config import ModelConfig
from scale.models.registry import build_backbone
from scale.optim import apply_schedule, build_optimizer, init_state, keep_settings, param_groups, settings

CPU = torch.device("cpu")


def test_param_groups_follow_dino_rule():
    net = ToyMethod().student
    groups = param_groups(net.named_parameters(), optim_config())
    by_name = {id(p): n for n, p in net.named_parameters()}
    decay = {by_name[id(p)] for p in groups[0]["params"]}
    no_decay = {by_name[id(p)] for p in groups[1]["params"]}
    assert [g["group"] for g in groups] == ["decay", "no_decay"]
    assert "backbone.token" in decay and "head.last_layer.weight" in decay  # 2-D parameters are decayed
    assert {"backbone.embed.bias", "backbone.bn.weight", "backbone.norm.weight"} <= no_decay
    assert decay | no_decay == set(by_name.values()) and not decay & no_decay
    apply_schedule(groups, lr=0.3, weight_decay=0.05)
    assert [(g["lr"], g["weight_decay"]) for g in groups] == [(0.3, 0.05), (0.3, 0.0)]
    single = param_groups(net.named_parameters(), optim_config(wd_exclude_1d=False))
    assert len(single) == 1 and len(single[0]["params"]) == len(by_name)


def test_frozen_parameters_are_left_out_of_the_groups():
    net = ToyMethod().student
    net.backbone.embed.requires_grad_(False)
    groups = param_groups(net.named_parameters(), optim_config())
    assert all(p is not net.backbone.embed.weight for g in groups for p in g["params"])


@pytest.mark.parametrize("name", ["adamw", "sgd", "lars", "lamb"])
def test_eager_state_then_step_equals_lazy_first_step(name):
    """init_state must leave the optimizer exactly where a lazily initialised one starts."""
    cfg = optim_config(name=name, weight_decay=0.1)
    nets = [ToyMethod().student for _ in range(2)]
    nets[1].load_state_dict(nets[0].state_dict())
    opts = [build_optimizer(param_groups(n.named_parameters(), cfg), cfg, CPU) for n in nets]
    init_state(opts[1])
    assert len(opts[1].state) == len(list(nets[1].parameters())) or name == "sgd"
    for net in nets:  # parameters unchanged by init_state
        torch.testing.assert_close(net.state_dict(), nets[0].state_dict(), rtol=0, atol=0)
    for step in range(2):
        for net, opt in zip(nets, opts):
            torch.manual_seed(step)
            for p in net.parameters():
                p.grad = torch.randn_like(p)
            opt.step()
    torch.testing.assert_close(nets[1].state_dict(), nets[0].state_dict(), rtol=0, atol=0)


def test_a_checkpoint_from_a_cpu_puts_its_steps_where_fused_adamw_runs():
    """Saved where AdamW is not fused (a CPU), loaded where it is (a GPU: here the meta device stands in, as no
    second device is at hand): torch's load keeps `step` on the CPU by the saved groups' flags; keep_settings puts
    it on the parameters' device, as fused AdamW needs (its CUDA kernel refused a CPU step on the H200)."""
    param = nn.Parameter(torch.zeros(3, device="meta"))
    optimizer = torch.optim.AdamW([param])  # fused AdamW cannot be built on the meta device: the recipe says fused
    recipe = [dict(settings(optimizer)[0], fused=True)]
    optimizer.state[param] = {"step": torch.tensor(4.0), "exp_avg": torch.zeros(3, device="meta")}
    keep_settings(optimizer, recipe)
    step = optimizer.state[param]["step"]
    assert step.device.type == "meta" and step.dtype == torch.float32
    # DeepSpeed ZeRO-3 lists a flat partition in its group only during its own step: the groups' flag
    optimizer.param_groups[0]["params"] = []
    optimizer.state[param]["step"] = torch.tensor(4.0)
    keep_settings(optimizer, recipe)
    assert optimizer.state[param]["step"].device.type == "meta"
    optimizer.param_groups[0]["params"] = [param]  # not fused: torch's rule leaves a CPU step where it is
    optimizer.state[param]["step"] = torch.tensor(4.0)
    keep_settings(optimizer, [dict(recipe[0], fused=False)])
    assert optimizer.state[param]["step"].device.type == "cpu"


@pytest.mark.parametrize("name", ["adamw", "sgd", "lars", "lamb"])
def test_a_loaded_optimizer_keeps_the_recipes_settings_and_the_saved_counts(name):
    """keep_settings after load_state_dict: the resumed recipe's betas, eps, momentum; the checkpoint's group step
    count (timm's LAMB keeps it in the group) and the optimizer's own parameters."""
    nets = [ToyMethod().student for _ in range(2)]
    saved_cfg, new_cfg = optim_config(name=name), optim_config(name=name, betas=[0.8, 0.99], eps=1e-6, momentum=0.5)
    saved, resumed = (
        build_optimizer(param_groups(net.named_parameters(), cfg), cfg, CPU)
        for net, cfg in zip(nets, (saved_cfg, new_cfg))
    )
    for p in nets[0].parameters():
        p.grad = torch.ones_like(p)
    saved.step()
    recipe = settings(resumed)
    resumed.load_state_dict(saved.state_dict())
    assert settings(resumed) != recipe  # what the load copied from the checkpoint
    keep_settings(resumed, recipe)
    assert settings(resumed) == recipe
    assert {id(p) for g in resumed.param_groups for p in g["params"]} == {id(p) for p in nets[1].parameters()}
    assert [g.get("step") for g in resumed.param_groups] == [g.get("step") for g in saved.param_groups]


def test_lamb_does_not_clip_on_its_own():
    cfg = optim_config(name="lamb")
    opt = build_optimizer(param_groups(ToyMethod().student.named_parameters(), cfg), cfg, CPU)
    assert opt.defaults["max_grad_norm"] is None


def test_every_listed_optimizer_builds_its_own_class():
    """OPTIMIZERS is the list the recipe check accepts (optim.name, tests/config/test_config.py)."""
    from timm.optim import Lamb, Lars

    from scale.optim import OPTIMIZERS

    expected = {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD, "lars": Lars, "lamb": Lamb}
    assert set(OPTIMIZERS) == set(expected)
    for name in OPTIMIZERS:
        built = build_optimizer([{"params": [nn.Parameter(torch.ones(2))]}], optim_config(name=name), CPU)
        assert type(built) is expected[name]


def grads_of(shapes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=gen) * scale for s, scale in zip(shapes, SCALES)]


SHAPES, SCALES = [(4, 3), (5,), (2, 2, 2), (1,)], [1.0, 0.1, 3.0, 0.5]  # norms about 3.5, 0.2, 8.5, 0.4


def test_per_param_clipping_is_dinos_rule():
    grads, expected = grads_of(SHAPES), grads_of(SHAPES)
    for g in expected:  # DINO's utils.clip_gradients
        coef = 2.0 / (g.norm(2) + 1e-6)
        if coef < 1:
            g.mul_(coef)
    total = clip_gradients(grads, 2.0, "per_param")
    assert total == pytest.approx(float(torch.stack([g.norm() for g in grads_of(SHAPES)]).norm()), rel=1e-6)
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g, e)
    assert any(torch.equal(g, e) for g, e in zip(grads, grads_of(SHAPES)))  # small ones untouched
    assert not all(torch.equal(g, e) for g, e in zip(grads, grads_of(SHAPES)))


def test_global_clipping_is_torchs_rule():
    params = [nn.Parameter(torch.zeros(s)) for s in SHAPES]
    for p, g in zip(params, grads_of(SHAPES)):
        p.grad = g
    expected_total = torch.nn.utils.clip_grad_norm_(params, 2.0)
    grads = grads_of(SHAPES)
    assert clip_gradients(grads, 2.0, "global") == pytest.approx(float(expected_total), rel=1e-6)
    for g, p in zip(grads, params):
        torch.testing.assert_close(g, p.grad)


def test_clip_zero_only_measures():
    grads = grads_of(SHAPES)
    clip_gradients(grads, 0.0, "global")
    assert all(torch.equal(g, e) for g, e in zip(grads, grads_of(SHAPES)))


def test_checkpointed_blocks():
    net = ToyMethod(depth=5).student
    blocks = list(net.backbone.blocks)
    assert blocks_to_checkpoint(net, "full", 2) == blocks
    assert blocks_to_checkpoint(net, "every_n", 2) == [blocks[0], blocks[2], blocks[4]]
    assert blocks_to_checkpoint(net, "none", 2) == []
    with pytest.raises(UserError, match="needs a backbone with block_modules"):
        blocks_to_checkpoint(nn.Sequential(nn.Linear(2, 2)), "full", 1)


def saved_tensor_count_and_grads(net: nn.Module):
    count = [0]

    def pack(t):
        count[0] += 1
        return t

    batch = make_batch(0)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = net(batch.crops[0]).sum() + net(batch.crops[1]).sum()  # two forwards, as multi-crop does
    out.backward()
    return count[0], {n: p.grad.clone() for n, p in net.named_parameters()}


def test_activation_checkpointing_saves_less_and_gives_the_same_gradients():
    plain = ToyMethod(depth=4).student
    checkpointed = copy.deepcopy(plain)
    assert apply_activation_checkpointing(checkpointed, "full", 1) == 4
    names = [n for n, _ in plain.named_parameters()]
    assert [n for n, _ in checkpointed.named_parameters()] == names  # composable: names unchanged
    saved_plain, grads_plain = saved_tensor_count_and_grads(plain)
    saved_ckpt, grads_ckpt = saved_tensor_count_and_grads(checkpointed)
    assert saved_ckpt < saved_plain
    for name in names:
        torch.testing.assert_close(grads_ckpt[name], grads_plain[name], rtol=0, atol=1e-7)


def test_clean_name_strips_wrappers():
    assert clean_name("module.head.last_layer.weight_v") == "head.last_layer.weight_v"
    assert (
        clean_name("backbone.blocks.0._checkpoint_wrapped_module.attn.qkv.weight")
        == "backbone.blocks.0.attn.qkv.weight"
    )
    assert clean_name("_orig_mod.module.backbone.cls_token") == "backbone.cls_token"


class Uninitialised(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 2)
        self.cls_token = nn.Parameter(torch.zeros(1, 2))  # no reset_parameters covers it


def test_meta_init_names_what_the_initialiser_missed():
    with torch.device("meta"):
        module = Uninitialised()
    with pytest.raises(RuntimeError, match="'cls_token' of Uninitialised uninitialised"):
        materialize(module, CPU)


def test_meta_init_prefers_the_models_init_weights():
    class WithInit(Uninitialised):
        def init_weights(self):
            nn.init.ones_(self.cls_token)

    with torch.device("meta"):
        module = WithInit()
    materialize(module, CPU)
    assert torch.equal(module.cls_token, torch.ones(1, 2))


def test_precision_rules():
    assert resolve_precision("bf16", CPU).dtype == torch.bfloat16
    assert not resolve_precision("fp32", CPU).mixed
    with pytest.raises(UserError, match="fp16 needs a GPU"):
        resolve_precision("fp16", CPU)


def test_toy_method_contract():
    method = ToyMethod()
    student_names = {n for n, _ in method.student.named_parameters()}
    assert {n for n, _ in method.teacher.named_parameters()} < student_names
    assert not any(p.requires_grad for p in method.teacher.parameters())
    loss, _ = method.loss(make_batch(0), context(0))
    assert loss.ndim == 0 and dataclasses.is_dataclass(optim_config())


def test_gradient_accumulation_counts_backward_calls():
    """The Engine base's guard, shared by DDP, FSDP2 and DeepSpeed: grad_accum backward calls, then one step."""
    info = ParallelContext(0, 1, 0, "127.0.0.1", 0, "single")
    engine = build_engine(EngineConfig(kind="ddp", grad_accum=2), optim_config(), info, CPU)
    with pytest.raises(RuntimeError, match=r"step\(\) after 0 backward calls; engine.grad_accum=2"):
        engine.check_accumulated()
    with pytest.raises(ValueError), engine.micro_batch():
        raise ValueError("a failed backward is not counted")
    for _ in range(2):
        with engine.micro_batch():
            pass
    with pytest.raises(RuntimeError, match=r"backward called 3 times before step\(\) with engine.grad_accum=2"):
        with engine.micro_batch():
            pass
    engine.check_accumulated()
    assert engine.micro_step == 2


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def recomputed_in_backward(net: nn.Module) -> dict[str, int]:
    """Forward ops that run again during backward (the toy's blocks: LayerNorm, Linear)."""
    out = net(make_batch(0).crops[0]).sum()
    with OpCounter() as counter:
        out.backward()
    return {op: counter.counts.get(op, 0) for op in ("native_layer_norm", "addmm")}


def test_selective_checkpointing_keeps_matmuls_recomputes_the_rest():
    plain = ToyMethod(depth=4).student
    full, selective = copy.deepcopy(plain), copy.deepcopy(plain)
    apply_activation_checkpointing(full, "full", 1)
    assert apply_activation_checkpointing(selective, "selective", 1) == 4
    assert recomputed_in_backward(copy.deepcopy(plain)) == {"native_layer_norm": 0, "addmm": 0}
    assert recomputed_in_backward(copy.deepcopy(full)) == {"native_layer_norm": 4, "addmm": 4}
    assert recomputed_in_backward(copy.deepcopy(selective)) == {"native_layer_norm": 4, "addmm": 0}
    _, grads_plain = saved_tensor_count_and_grads(plain)
    _, grads_selective = saved_tensor_count_and_grads(selective)
    for name, grad in grads_plain.items():
        torch.testing.assert_close(grads_selective[name], grad, rtol=0, atol=1e-7)


class MatmulWidths(TorchDispatchMode):
    """The output widths of the addmm calls (the Linear layers' forwards; their gradients use mm)."""

    def __init__(self):
        super().__init__()
        self.widths: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten.addmm.default:
            self.widths.append(out.shape[-1])
        return out


def test_selective_checkpointing_recomputes_the_widening_matmuls_of_a_vit_block():
    """ViT-nano (D=64, 3 blocks): qkv (3D) and MLP fc1 (4D) run again in backward; the attention projection and fc2
    (D), whose outputs are kept, do not."""
    torch.manual_seed(0)
    vit = build_backbone(ModelConfig(name="vit_nano", patch_size=8, img_size=32, drop_path=0.1))
    plain = nn.ModuleDict({"backbone": vit})
    images = torch.randn(2, 3, 32, 32)
    recomputed, grads = {}, {}
    for mode in ("none", "selective", "full"):
        net = copy.deepcopy(plain)
        apply_activation_checkpointing(net, mode, 1) if mode != "none" else None
        torch.manual_seed(1)  # the same drop-path masks
        out = net["backbone"](images)["pooled"].square().sum()
        with MatmulWidths() as counter:
            out.backward()
        recomputed[mode] = sorted(counter.widths)
        grads[mode] = {n: p.grad for n, p in net.named_parameters()}
    assert recomputed["none"] == [] and recomputed["selective"] == [192] * 3 + [256] * 3
    assert set(recomputed["full"]) == {64, 192, 256}  # full checkpointing runs the narrow ones again too
    for name, grad in grads["none"].items():
        torch.testing.assert_close(grads["selective"][name], grad, rtol=0, atol=1e-6, msg=name)


def test_selective_checkpointing_under_bf16_autocast_with_a_block_called_per_crop_resolution():
    """DINO's step calls each block once per crop resolution in one autocast region. Autocast caches its cast of a
    weight: the second call's forward skips the cast that its recompute then makes, and selective checkpointing,
    which counts every op, refused the backward (pytorch/pytorch#193338). Gradients as without checkpointing, to
    bf16 rounding (uncached, each call's weight gradient is cast back to fp32 before the two are summed)."""
    torch.manual_seed(0)
    vit = build_backbone(ModelConfig(name="vit_nano", patch_size=8, img_size=32, drop_path=0.0))
    plain = nn.ModuleDict({"backbone": vit})
    crops = [torch.randn(2, 3, 32, 32), torch.randn(4, 3, 16, 16)]
    grads = {}
    for mode in ("none", "selective"):
        net = copy.deepcopy(plain)
        apply_activation_checkpointing(net, mode, 1) if mode != "none" else None
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = torch.cat([net["backbone"](x)["pooled"] for x in crops])
        out.float().square().sum().backward()
        grads[mode] = {n: p.grad for n, p in net.named_parameters()}
    for name, grad in grads["none"].items():
        torch.testing.assert_close(grads["selective"][name], grad, rtol=2e-2, atol=1e-2, msg=name)
