"""The nn.Modules a method hands to the engine as `student` / `teacher`. Their direct children are the parts
(backbone, heads); their forward is the only entry point the methods call (see scale/methods/base.py).

A backbone maps images [B, 3, H, W] to {"pooled": [B, D], "tokens": [B, N, Dt], "grid": (h, w)}.
"""

from collections.abc import Callable

import torch
from torch import nn


class MultiCropNet(nn.Module):
    """DINO's multi-crop wrapper: the backbone runs once per resolution group, the head once over all views.
    With a `region_head` (EsViT) it also returns the backbone tokens per group and the region head's logits on
    every token, flat [sum_g V_g*B*N_g, K]: groups in order, each view-major, each view's rows image-major (kept
    flat so that the loss's gradient reaches the head without a split and concatenation of [tokens, K])."""

    def __init__(self, backbone: nn.Module, head: nn.Module, region_head: nn.Module | None = None):
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.region_head = region_head

    def forward(self, crops: list[torch.Tensor], region: bool = True) -> dict:
        features = [self.backbone(x) for x in crops]
        out = {"logits": self.head(torch.cat([f["pooled"] for f in features])), "pooled": features[0]["pooled"]}
        if self.region_head is not None and region:
            tokens = [f["tokens"] for f in features]
            out["tokens"] = tokens
            out["region_logits"] = self.region_head(torch.cat([t.flatten(0, 1) for t in tokens]))
        return out


class ProjectionNet(nn.Module):
    """Backbone + projector (+ predictor, + SwAV prototypes) for the two-view frameworks of MoCo v3 Table 4.

    `per_view_bn` keeps the two crops of one image out of each other's BatchNorm batch (MoCo v3 appendix option
    (ii), its Alg. 1); otherwise all crops share one batch (option (i)). The backbone runs once per resolution
    group unless it has BatchNorm itself (ResNet, ViT-BN), which then also sees one view at a time."""

    def __init__(
        self,
        backbone: nn.Module,
        projector: nn.Module,
        predictor: nn.Module | None = None,
        prototypes: nn.Module | None = None,
    ):
        super().__init__()
        self.backbone = backbone
        self.projector = projector
        self.predictor = predictor
        self.prototypes = prototypes
        self.backbone_has_bn = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in backbone.modules())

    def _heads(self, pooled: torch.Tensor) -> dict:
        z = self.projector(pooled)
        out = {"z": z}
        if self.predictor is not None:
            out["p"] = self.predictor(z)
        if self.prototypes is not None:
            out["scores"] = self.prototypes(nn.functional.normalize(z, dim=-1))
        return out

    def forward(self, crops: list[torch.Tensor], views_per_group: list[int], per_view_bn: bool = True) -> dict:
        pooled = []  # one entry per BatchNorm batch
        for x, views in zip(crops, views_per_group):
            if per_view_bn and self.backbone_has_bn:
                pooled += [self.backbone(v)["pooled"] for v in x.chunk(views)]
            else:
                features = self.backbone(x)["pooled"]
                pooled += list(features.chunk(views)) if per_view_bn else [features]
        parts = [self._heads(p) for p in pooled]
        return {"pooled": torch.cat(pooled), **{key: torch.cat([p[key] for p in parts]) for key in parts[0]}}


class Prototypes(nn.Module):
    """SwAV's prototype layer: scores are cosine similarities to unit-norm prototypes. The official code
    renormalises the weights in place before each step; normalising inside forward gives the same scores."""

    def __init__(self, dim: int, count: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(count, dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.weight, a=5**0.5)  # nn.Linear's default, as SwAV's prototype layer

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z @ nn.functional.normalize(self.weight, dim=1).t()


def token_grid(features: dict) -> torch.Tensor:
    """The backbone's tokens as a feature map [B, Dt, h, w]."""
    tokens, (h, w) = features["tokens"], features["grid"]
    if tokens.shape[1] != h * w:
        raise ValueError(f"backbone returned {tokens.shape[1]} tokens for a {h}x{w} grid")
    return tokens.transpose(1, 2).reshape(tokens.shape[0], tokens.shape[2], h, w)


def block_grid(output: torch.Tensor, backbone: nn.Module, grid: tuple[int, int]) -> torch.Tensor:
    """A block's output as [B, D, h, w]: Swin blocks give [B, h, w, D]; ViT blocks [B, prefix + h*w, D] on the
    final grid (prefix tokens, e.g. CLS, dropped)."""
    if output.dim() == 4:
        return output.permute(0, 3, 1, 2)
    tokens = output[:, getattr(backbone, "num_prefix_tokens", 0) :]
    return token_grid({"tokens": tokens, "grid": grid})


def block_dims(backbone: nn.Module) -> list[int]:
    """Channel width of each block's output (every block of timm's ViT and Swin has a `norm1`)."""
    return [block.norm1.weight.shape[0] for block in backbone.block_modules()]


class DrlocHeads(nn.Module):
    """One localization MLP per grid, as one part with a forward (FSDP shards the parts of a net separately)."""

    def __init__(self, heads: list[nn.Module]):
        super().__init__()
        self.heads = nn.ModuleList(heads)

    def __len__(self) -> int:
        return len(self.heads)

    def forward(self, pairs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [head(p) for head, p in zip(self.heads, pairs)]


class ClassifierNet(nn.Module):
    """Backbone + linear classifier, with optional DRLoc localization heads: one on the final grid, or
    (`every_block`, Eq. 7) one per block, reading the block outputs through forward hooks."""

    def __init__(
        self,
        backbone: nn.Module,
        classifier: nn.Module,
        drloc_heads: DrlocHeads | None = None,
        every_block: bool = False,
    ):
        super().__init__()
        self.backbone = backbone
        self.classifier = classifier
        self.drloc_heads = drloc_heads
        self.every_block = every_block

    def forward(self, x: torch.Tensor, drloc_sampler=None) -> dict:
        """`drloc_sampler(grids) -> (pair_features, positions)` picks embedding pairs on the grids [B, D, k, k];
        the localization heads run on them here, inside the wrapped forward."""
        use_drloc = self.drloc_heads is not None and drloc_sampler is not None
        outputs: list[torch.Tensor] = []
        hooks = (
            [
                block.register_forward_hook(lambda _m, _i, out: outputs.append(out))
                for block in self.backbone.block_modules()
            ]
            if use_drloc and self.every_block
            else []
        )
        try:
            features = self.backbone(x)
        finally:
            for hook in hooks:
                hook.remove()
        out = {"logits": self.classifier(features["pooled"])}
        if use_drloc:
            if self.every_block:
                grids = [block_grid(o, self.backbone, features["grid"]) for o in outputs]
            else:
                grids = [token_grid(features)]
            pairs, positions = drloc_sampler(grids)
            out["drloc"] = self.drloc_heads(pairs)
            out["drloc_positions"] = positions
        return out


def init_teacher(teacher: nn.Module, student: nn.Module) -> nn.Module:
    """Copy the student's weights into the teacher (whose parameter names must be a subset of the student's) and
    freeze it, as the Method contract requires. On the meta device there is nothing to copy yet: the engine copies
    after materialising both."""
    student_state = student.state_dict()
    missing = [name for name in teacher.state_dict() if name not in student_state]
    if missing:
        raise ValueError(f"teacher entries absent from the student: {missing[:5]}")
    if not any(t.is_meta for t in student_state.values()):
        teacher.load_state_dict({k: v for k, v in student_state.items() if k in teacher.state_dict()})
    teacher.requires_grad_(False)
    return teacher


def momentum_encoder(
    backbone_fn: Callable[..., nn.Module], projector: Callable[[int], nn.Module], student: nn.Module
) -> ProjectionNet:
    """MoCo's and BYOL's momentum encoder: a backbone without stochastic depth and `projector(its width)`, no
    predictor, initialised from the student and frozen (`init_teacher`)."""
    backbone = backbone_fn(drop_path=0.0)
    return init_teacher(ProjectionNet(backbone, projector(backbone.embed_dim)), student)
