import torch
from torch import nn

from scale.models.heads import DinoHead, DrlocHead, WeightNormLinear, moco_predictor, moco_projector


def test_dino_head_shapes_bottleneck_and_weight_norm():
    torch.manual_seed(0)
    head = DinoHead(32, out_dim=100, hidden_dim=48, bottleneck_dim=16)
    x = torch.randn(5, 32)
    assert head(x).shape == (5, 100)
    assert torch.allclose(head.bottleneck(x).norm(dim=-1), torch.ones(5), atol=1e-5)
    linears = [m for m in head.mlp if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(32, 48), (48, 48), (48, 16)]
    assert any(isinstance(m, nn.GELU) for m in head.mlp)
    # norm_last_layer: g fixed to 1 and not trained, so each row of the effective weight is a unit vector
    assert not head.last_layer.weight_g.requires_grad
    assert torch.all(head.last_layer.weight_g == 1)
    head(x).sum().backward()
    assert head.last_layer.weight_g.grad is None and head.last_layer.weight_v.grad is not None
    z = head.bottleneck(x)
    rows = head.last_layer(torch.eye(16)).t()  # [out, in]: the effective weight
    assert torch.allclose(rows.norm(dim=1), torch.ones(100), atol=1e-5)
    assert torch.allclose(head(x), z @ rows.t(), atol=1e-5)


def test_dino_head_options():
    head = DinoHead(8, out_dim=10, hidden_dim=12, bottleneck_dim=6, use_bn=True, norm_last_layer=False, predictor=True)
    assert head.last_layer.weight_g.requires_grad
    assert sum(isinstance(m, nn.BatchNorm1d) for m in head.mlp) == 2
    assert head.predictor is not None and head(torch.randn(4, 8)).shape == (4, 10)
    one = DinoHead(8, out_dim=10, nlayers=1, bottleneck_dim=6)
    assert isinstance(one.mlp, nn.Linear) and one(torch.randn(2, 8)).shape == (2, 10)
    names = {n for n, _ in WeightNormLinear(4, 3).named_parameters()}
    assert names == {"weight_g", "weight_v"}  # the official checkpoints' names


def test_weight_norm_linear_output_and_gradients_follow_the_formula():
    torch.manual_seed(1)
    layer = WeightNormLinear(6, 9, fix_norm=False)
    with torch.no_grad():
        layer.weight_g.uniform_(0.5, 2.0)
    x = torch.randn(4, 6)
    out = layer(x)
    v, g = layer.weight_v.detach().clone().requires_grad_(), layer.weight_g.detach().clone().requires_grad_()
    expected = x @ (g * v / v.norm(dim=1, keepdim=True)).t()  # w = g * v / ||v|| per output row
    assert torch.allclose(out, expected, atol=1e-6)
    upstream = torch.randn(4, 9)
    (out * upstream).sum().backward()
    (expected * upstream).sum().backward()
    assert torch.allclose(layer.weight_v.grad, v.grad, atol=1e-6)
    assert torch.allclose(layer.weight_g.grad, g.grad, atol=1e-6)


def test_moco_vit_projector_and_predictor():
    proj = moco_projector(24, resnet=False, dim=8, mlp_dim=32)
    linears = [m for m in proj if isinstance(m, nn.Linear)]
    bns = [m for m in proj if isinstance(m, nn.BatchNorm1d)]
    assert [(m.in_features, m.out_features) for m in linears] == [(24, 32), (32, 32), (32, 8)]
    assert all(m.bias is None for m in linears)
    assert len(bns) == 3 and bns[-1].affine is False and bns[0].affine
    assert isinstance(proj[-1], nn.BatchNorm1d)
    pred = moco_predictor(resnet=False, dim=8, mlp_dim=32)
    assert [(m.in_features, m.out_features) for m in pred if isinstance(m, nn.Linear)] == [(8, 32), (32, 8)]
    assert isinstance(pred[-1], nn.BatchNorm1d) and not pred[-1].affine
    assert proj(torch.randn(6, 24)).shape == (6, 8)


def test_moco_resnet_heads():
    proj = moco_projector(40, resnet=True, dim=8, mlp_dim=16)
    assert [(m.in_features, m.out_features) for m in proj if isinstance(m, nn.Linear)] == [(40, 16), (16, 8)]
    assert isinstance(proj[-1], nn.BatchNorm1d) and not proj[-1].affine
    pred = moco_predictor(resnet=True, dim=8, mlp_dim=16)
    assert isinstance(pred[-1], nn.Linear)  # no last BN for ResNet-50's predictor
    no_bn = moco_projector(40, resnet=False, dim=8, mlp_dim=16, bn=False)
    assert not any(isinstance(m, nn.BatchNorm1d) for m in no_bn)
    assert all(m.bias is not None for m in no_bn if isinstance(m, nn.Linear))


def test_drloc_head():
    reg = DrlocHead(16)
    dims = [(m.in_features, m.out_features) for m in reg.modules() if isinstance(m, nn.Linear)]
    assert dims == [(32, 512), (512, 512), (512, 2)]
    assert reg(torch.randn(3, 7, 32)).shape == (3, 7, 2)
    cls = DrlocHead(16, hidden_dim=64, num_classes=15)
    assert cls(torch.randn(3, 7, 32)).shape == (3, 7, 2, 15)
