"""engine.compile as scale applies it (scale.engine.compile): every backbone's blocks trace into one graph each
(`fullgraph=True`, activation checkpointing inside), the checkpoint's recomputation is in the compiled backward,
names and checkpoints do not change, and inductor (the default backend) gives eager's numbers."""

import copy
from types import SimpleNamespace

import pytest
import torch
from functorch.compile import make_boxed_func
from torch import nn
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend
from torch._dynamo.utils import counters

from scale.engine.activation_checkpointing import Checkpointed, apply_activation_checkpointing
from scale.engine.compile import apply_compile, compile_forward, compile_net
from scale.methods.nets import MultiCropNet
from scale.models import build_backbone
from scale.models.config import ModelConfig
from scale.models.heads import DinoHead

# name, model img_size, input size: every family that exposes block_modules(); ViT in the fast tier
BACKBONES = [
    ("vit_nano", 32, 32),
    *[
        pytest.param(name, img, size, marks=pytest.mark.slow)
        for name, img, size in [
            ("swin_nano", 224, 64),
            ("vit_bn_nano", 32, 32),
            ("cvt_nano", 64, 64),
            ("cvt_nano_w", 64, 64),
            ("pvt_nano", 64, 64),
            ("vil_nano", 64, 64),
            ("t2t_vit_nano", 64, 64),
            ("resnet_nano", 64, 64),
        ]
    ],
]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def net_of(name: str, img_size: int, drop_path: float = 0.1) -> nn.ModuleList:
    """A backbone as the one part of a net, as the engines see a method's student."""
    torch.manual_seed(0)
    return nn.ModuleList([build_backbone(ModelConfig(name=name, img_size=img_size), drop_path=drop_path)])


def seeded(backbone: nn.Module, x: torch.Tensor) -> dict:
    torch.manual_seed(1)
    return backbone(x)


BATCHNORM_FAMILIES = ("vit_bn_nano", "resnet_nano", "cvt_nano", "cvt_nano_w")  # blocks holding BatchNorm: see below


@pytest.mark.parametrize("name,img_size,size", BACKBONES)
def test_every_block_compiles_into_one_graph_checkpoint_included(name, img_size, size):
    plain = net_of(name, img_size)
    net = copy.deepcopy(plain)
    apply_activation_checkpointing(net, "none" if name in BATCHNORM_FAMILIES else "full", 1)
    # fullgraph=True fails on any graph break; aot_eager also traces the backward and runs the graphs on eager ops
    backend = CompileCounterWithBackend("aot_eager")
    blocks = compile_net(net, backend)
    assert blocks == len(net[0].block_modules())
    x = torch.randn(2, 3, size, size)
    out, ref = (seeded(model[0], x) for model in (net, plain))  # the same drop-path draws
    torch.testing.assert_close(out["tokens"], ref["tokens"])
    assert 1 <= backend.frame_count <= blocks and not counters["graph_break"]
    out["tokens"].sum().backward()
    assert [k for k, _ in net.named_parameters()] == [k for k, _ in plain.named_parameters()]


def test_a_checkpointed_block_holding_batchnorm_runs_eagerly_and_trains_over_two_crops():
    """Compiled with its checkpoint inside, a BatchNorm block's running statistics, updated by each crop's forward,
    were tensors its compiled backward had saved: MoCo v3's ViT-BN on DDP with engine.compile and full
    checkpointing failed in backward ("modified by an inplace operation"). Such blocks run eagerly."""
    net = net_of("vit_bn_nano", 32)
    apply_activation_checkpointing(net, "full", 1)
    backend = CompileCounterWithBackend("aot_eager")
    assert compile_net(net, backend) == 0  # every block of ViT-BN holds a BatchNorm, and no head here
    x = torch.randn(2, 3, 32, 32)
    loss = net[0](x)["tokens"].sum() + net[0](x.flip(-1))["tokens"].sum()  # two crops, one backward
    loss.backward()
    assert all(p.grad is not None for p in net.parameters() if p.requires_grad)


class GraphRecorder:
    """An aot_eager-like backend that keeps the backward graphs it compiles."""

    def __init__(self):
        self.backward: list[torch.fx.GraphModule] = []
        self.backend = aot_autograd(fw_compiler=lambda gm, _: make_boxed_func(gm), bw_compiler=self.record)

    def record(self, gm, _):
        self.backward.append(gm)
        return make_boxed_func(gm)

    def count(self, op) -> int:
        return sum(node.target == op for gm in self.backward for node in gm.graph.nodes)


@pytest.mark.parametrize(
    "mode,norms,linears", [("none", False, (0, 0)), ("full", True, (5, 8)), ("selective", True, (4, 4))]
)
def test_checkpointing_is_recomputed_inside_the_compiled_backward(mode, norms, linears):
    """In compiled ViT blocks, the checkpoint policy decides what the backward graphs recompute: full reruns the
    LayerNorms and the linear layers (4 a block, less any whose recomputed output backward does not read), selective
    the LayerNorms and the 2 widening ones of each block graph (qkv, MLP fc1; it keeps the attention projection's
    and fc2's outputs), none nothing. Two graphs: block 0's and the one blocks 1-2 share."""
    plain = net_of("vit_nano", 32)
    net = copy.deepcopy(plain)
    apply_activation_checkpointing(net, mode, 1)
    recorder = GraphRecorder()
    compile_net(net, recorder.backend)
    x = torch.randn(2, 3, 32, 32)
    for model in (net, plain):
        seeded(model[0], x)["pooled"].square().sum().backward()
    # block 0 (rate 0: no drop path) and one graph for blocks 1-2: their drop-path masks are inputs, not constants
    assert len(recorder.backward) == 2
    aten = torch.ops.aten
    assert (recorder.count(aten.native_layer_norm.default) > 0) == norms
    assert linears[0] <= recorder.count(aten.addmm.default) <= linears[1]
    for (key, p), q in zip(net.named_parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=key)


def test_compile_keeps_state_dict_keys_and_loads_either_way():
    """Checkpoints load whether engine.compile is on or off: compiling replaces forwards, not modules."""
    plain = nn.ModuleDict({"backbone": net_of("vit_nano", 32, drop_path=0.0)[0], "head": DinoHead(64, 32, 16, 8)})
    compiled = copy.deepcopy(plain)
    for p in plain.parameters():
        p.data.normal_()  # different weights, to see them load
    assert apply_compile(SimpleNamespace(student=compiled, teacher=None), True, CompileCounter()) == 4  # 3 blocks, head
    assert apply_compile(SimpleNamespace(student=plain, teacher=None), False, "inductor") == 0
    assert list(compiled.state_dict()) == list(plain.state_dict())
    assert not counters["graph_break"]
    compiled.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(
        compiled["head"](compiled["backbone"](x)["pooled"]), plain["head"](plain["backbone"](x)["pooled"])
    )
    plain.load_state_dict(compiled.state_dict())


@pytest.mark.slow  # inductor compiles C++ kernels: about a minute on 2 cores without its on-disk cache
def test_inductor_block_matches_eager_with_checkpointing_and_drop_path():
    """The default backend on one tiny block with selective checkpointing and stochastic depth: outputs and
    gradients as eager's to float rounding, so the recomputation in the compiled backward uses the forward's
    drop-path mask (fallback_random: inductor draws from eager's generator, as it does on the CPU anyway)."""
    block = net_of("vit_nano", 32)[0].blocks[2]
    block.drop_path1.drop_prob = block.drop_path2.drop_prob = 0.5  # about half of the 8 images' branches dropped
    compiled = copy.deepcopy(block)
    compiled.forward = Checkpointed(compiled.forward, selective=True)
    compile_forward(compiled, "inductor", fullgraph=True)
    x = torch.randn(8, 17, 64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    with torch._inductor.config.patch(fallback_random=True):
        out, ref = seeded(compiled, x), seeded(block, x_ref)
        out.square().sum().backward()
    ref.square().sum().backward()
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-5, rtol=1e-5)
    for (key, p), q in zip(compiled.named_parameters(), block.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-5, msg=key)


def test_compile_mode_reaches_torch_compile_and_the_block_still_equals_eager(monkeypatch):
    """engine.compile_mode goes to torch.compile for inductor, and no mode for the default (the other backends take
    none). reduce-overhead's CUDA graphs leave CPU tensors out, so here inductor's kernels run and equal eager."""
    modes, real = [], torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: modes.append(kw.get("mode")) or real(fn, **kw))
    block, plain = nn.Sequential(nn.Linear(8, 8), nn.GELU()), nn.Linear(2, 2)
    x = torch.randn(4, 8)
    expected = block(x)
    compile_forward(block, "inductor", fullgraph=True, mode="reduce-overhead")
    compile_forward(plain, "aot_eager", fullgraph=True)
    assert modes == ["reduce-overhead", None]
    torch.testing.assert_close(block(x), expected)


def test_net_scope_compiles_each_nets_whole_forward_into_one_graph_per_call_shape():
    """engine.compile_scope=net: the net's forward is compiled, not its blocks; one call over two crop groups is one
    graph (no break between blocks, groups and head), a second call of the same shapes reuses it, and outputs and
    gradients equal eager's."""
    torch.manual_seed(0)
    backbone = build_backbone(ModelConfig(name="vit_nano", img_size=32), drop_path=0.0)
    plain = MultiCropNet(backbone, DinoHead(64, 32, 16, 8))
    net = copy.deepcopy(plain)
    counter = CompileCounter()
    assert apply_compile(SimpleNamespace(student=net, teacher=None), True, counter, scope="net") == 1
    assert all("forward" not in vars(block) for block in net.backbone.block_modules())  # the blocks are as built
    crops = [torch.randn(4, 3, 32, 32), torch.randn(8, 3, 16, 16)]
    for _ in range(2):
        out, ref = net(crops), plain(crops)
        out["logits"].square().mean().backward()
        ref["logits"].square().mean().backward()
    assert counter.frame_count == 1 and not counters["graph_break"]
    torch.testing.assert_close(out["logits"], ref["logits"])
    for (key, p), q in zip(net.named_parameters(), plain.parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=key)
