"""Projection heads of the four papers: DINO (and EsViT's region head), MoCo v3 projector/predictor (also used by
SimCLR, BYOL and SwAV), DRLoc's localization MLP, and a linear classifier."""

import torch
import torch.nn.functional as F
from torch import nn


def _trunc_normal_init(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.trunc_normal_(module.weight, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


class WeightNormLinear(nn.Module):
    """Bias-free linear layer with weight normalisation, w = g * v / ||v|| per output row [Salimans & Kingma].

    Parameter names `weight_g` / `weight_v` match the official DINO checkpoints. With `fix_norm` (DINO's
    norm_last_layer) g is filled with 1 and not trained, so every output row is a unit vector. The weight comes
    from torch's fused weight-norm kernel, as with the official head's `nn.utils.weight_norm`: one kernel each for
    forward and backward, about 4x faster on a CPU than g * normalize(v) through autograd for a [65536, 256] weight
    (EsViT recomputes two such weights per net and step)."""

    def __init__(self, in_dim: int, out_dim: int, fix_norm: bool = True):
        super().__init__()
        self.weight_v = nn.Parameter(torch.empty(out_dim, in_dim))
        self.weight_g = nn.Parameter(torch.empty(out_dim, 1), requires_grad=not fix_norm)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight_v, a=5**0.5)  # nn.Linear's default init, as in the official head
        self.weight_g.fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, torch._weight_norm(self.weight_v, self.weight_g, dim=0))


class DinoHead(nn.Module):
    """Linear(in, hidden) [BN] GELU ... Linear(hidden, bottleneck), L2 normalisation, weight-normalised
    Linear(bottleneck, out_dim). `predictor` adds a 2-layer MLP on the bottleneck (DINO Table 7, row 6); the
    teacher is built without it so its parameter names stay a subset of the student's."""

    def __init__(
        self,
        in_dim: int,
        out_dim: int = 65536,
        hidden_dim: int = 2048,
        bottleneck_dim: int = 256,
        nlayers: int = 3,
        use_bn: bool = False,
        norm_last_layer: bool = True,
        predictor: bool = False,
    ):
        super().__init__()
        if nlayers < 1:
            raise ValueError(f"DINO head needs at least 1 layer, got {nlayers}")
        if nlayers == 1:
            self.mlp = nn.Linear(in_dim, bottleneck_dim)
        else:
            layers: list[nn.Module] = []
            dims = [in_dim] + [hidden_dim] * (nlayers - 1)
            for d_in, d_out in zip(dims[:-1], dims[1:]):
                layers += [nn.Linear(d_in, d_out)] + ([nn.BatchNorm1d(d_out)] if use_bn else []) + [nn.GELU()]
            layers.append(nn.Linear(hidden_dim, bottleneck_dim))
            self.mlp = nn.Sequential(*layers)
        self.predictor = (
            nn.Sequential(nn.Linear(bottleneck_dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, bottleneck_dim))
            if predictor
            else None
        )
        self.last_layer = WeightNormLinear(bottleneck_dim, out_dim, fix_norm=norm_last_layer)
        self.init_weights()

    def init_weights(self) -> None:
        """The official init (trunc-normal 0.02 MLP, default last layer with g = 1); also after `to_empty`."""
        self.apply(_trunc_normal_init)
        self.last_layer.reset_parameters()

    def bottleneck(self, x: torch.Tensor) -> torch.Tensor:
        x = self.mlp(x)
        if self.predictor is not None:
            x = self.predictor(x)
        return F.normalize(x, dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.last_layer(self.bottleneck(x))


def moco_mlp(
    num_layers: int, in_dim: int, mlp_dim: int, out_dim: int, bn: bool = True, last_bn: bool = True
) -> nn.Sequential:
    """MoCo v3's `_build_mlp`: bias-free Linear, BN, ReLU for hidden layers; the last Linear is followed by a
    BatchNorm without affine parameters when `last_bn`. Without `bn` (SwAV, or the paper's BN-free heads) the
    layers get biases instead. As in the official code, every Linear of a BN head is bias-free, even a last layer
    without BN (the ResNet-50 predictor)."""
    layers: list[nn.Module] = []
    for i in range(num_layers):
        d_in = in_dim if i == 0 else mlp_dim
        d_out = out_dim if i == num_layers - 1 else mlp_dim
        last = i == num_layers - 1
        use_bn = bn and (last_bn if last else True)
        layers.append(nn.Linear(d_in, d_out, bias=not bn))
        if use_bn:
            layers.append(nn.BatchNorm1d(d_out, affine=not last))
        if not last:
            layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


def moco_projector(
    in_dim: int,
    resnet: bool,
    dim: int = 256,
    mlp_dim: int = 4096,
    bn: bool = True,
    last_bn: bool = True,
    num_layers: int | None = None,
) -> nn.Sequential:
    """ViT: 3 layers D -> 4096 -> 4096 -> 256; ResNet-50: 2 layers 2048 -> 4096 -> 256 (official_code_facts 2.3)."""
    layers = num_layers if num_layers is not None else (2 if resnet else 3)
    return moco_mlp(layers, in_dim, mlp_dim, dim, bn=bn, last_bn=last_bn)


def moco_predictor(
    resnet: bool, dim: int = 256, mlp_dim: int = 4096, bn: bool = True, last_bn: bool | None = None, num_layers: int = 2
) -> nn.Sequential:
    """2 layers 256 -> 4096 -> 256; the last BN is used for ViT and not for ResNet-50 (official code)."""
    use_last_bn = (not resnet) if last_bn is None else last_bn
    return moco_mlp(num_layers, dim, mlp_dim, dim, bn=bn, last_bn=use_last_bn)


class LinearClassifier(nn.Linear):
    """The supervised classifier, trunc-normal(0.02) weights and zero bias (DeiT), also when re-initialised."""

    def reset_parameters(self) -> None:
        _trunc_normal_init(self)


class DrlocHead(nn.Module):
    """DRLoc's localization MLP f on a concatenated pair [e_ij, e_ph]: Linear(2D, 512) ReLU Linear(512, 512) ReLU,
    then 2 outputs (regression, Eq. 2/3/7/8) or two branches of `num_classes` = 2k+1 logits, one per axis
    (classification Eq. 5 and Gaussian-prior regression Eq. 6)."""

    def __init__(self, in_dim: int, hidden_dim: int = 512, num_classes: int | None = None, extra_linear: bool = False):
        super().__init__()
        layers = [nn.Linear(2 * in_dim, hidden_dim), nn.ReLU(inplace=True), nn.Linear(hidden_dim, hidden_dim)]
        layers.append(nn.ReLU(inplace=True))
        if num_classes is not None and extra_linear:  # the official ce/cbr trunk: a third Linear, no ReLU after it
            layers.append(nn.Linear(hidden_dim, hidden_dim))
        self.trunk = nn.Sequential(*layers)
        self.num_classes = num_classes
        if num_classes is None:
            self.out = nn.Linear(hidden_dim, 2)
        else:
            self.out_u = nn.Linear(hidden_dim, num_classes)
            self.out_v = nn.Linear(hidden_dim, num_classes)

    def forward(self, pair: torch.Tensor) -> torch.Tensor:
        """pair [..., 2D] -> [..., 2] offsets, or [..., 2, num_classes] logits (u then v)."""
        h = self.trunk(pair)
        if self.num_classes is None:
            return self.out(h)
        return torch.stack([self.out_u(h), self.out_v(h)], dim=-2)
