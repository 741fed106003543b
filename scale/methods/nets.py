"""The nn.Modules a method hands to the engine as `student` / `teacher`. Their direct children are the parts
(backbone, heads); their forward is the only entry point the methods call (see scale/methods/base.py).

A backbone maps images [B, 3, H, W] to {"pooled": [B, D], "tokens": [B, N, Dt], "grid": (h, w)}.
"""

import torch
from torch import nn


class MultiCropNet(nn.Module):
    """DINO's multi-crop wrapper: the backbone runs once per resolution group, the head once over all views.
    With a `region_head` (EsViT) it also returns the backbone tokens and the region head's logits per group."""

    def __init__(self, backbone: nn.Module, head: nn.Module, region_head: nn.Module | None = None):
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.region_head = region_head

    def forward(self, crops: list[torch.Tensor], region: bool = True) -> dict:
        features = [self.backbone(x) for x in crops]
        out = {"logits": self.head(torch.cat([f["pooled"] for f in features]))}
        if self.region_head is not None and region:
            tokens = [f["tokens"] for f in features]
            flat = self.region_head(torch.cat([t.flatten(0, 1) for t in tokens]))
            chunks = flat.split([t.shape[0] * t.shape[1] for t in tokens])
            out["tokens"] = tokens
            out["region_logits"] = [c.view(t.shape[0], t.shape[1], -1) for c, t in zip(chunks, tokens)]
        return out


class ProjectionNet(nn.Module):
    """Backbone + projector (+ predictor, + SwAV prototypes) for the two-view frameworks of MoCo v3 Table 4.

    `views` > 1 with `per_view_bn` forwards each view separately so BatchNorm statistics never mix the two crops
    of one image (MoCo v3 appendix option (ii), its Alg. 1); otherwise all crops share one batch (option (i))."""

    def __init__(self, backbone: nn.Module, projector: nn.Module, predictor: nn.Module | None = None,
                 prototypes: nn.Module | None = None):
        super().__init__()
        self.backbone = backbone
        self.projector = projector
        self.predictor = predictor
        self.prototypes = prototypes

    def _embed(self, x: torch.Tensor) -> dict:
        z = self.projector(self.backbone(x)["pooled"])
        out = {"z": z}
        if self.predictor is not None:
            out["p"] = self.predictor(z)
        if self.prototypes is not None:
            out["scores"] = self.prototypes(nn.functional.normalize(z, dim=-1))
        return out

    def forward(self, crops: list[torch.Tensor], views_per_group: list[int], per_view_bn: bool = True) -> dict:
        chunks = []
        for x, views in zip(crops, views_per_group):
            chunks += list(x.chunk(views)) if per_view_bn else [x]
        parts = [self._embed(c) for c in chunks]
        return {key: torch.cat([p[key] for p in parts]) for key in parts[0]}


class Prototypes(nn.Module):
    """SwAV's prototype layer: scores are cosine similarities to unit-norm prototypes. The official code
    renormalises the weights in place before each step; normalising inside forward gives the same scores."""

    def __init__(self, dim: int, count: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(count, dim))
        nn.init.kaiming_uniform_(self.weight, a=5 ** 0.5)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z @ nn.functional.normalize(self.weight, dim=1).t()


def token_grid(features: dict) -> torch.Tensor:
    """The backbone's tokens as a feature map [B, Dt, h, w]."""
    tokens, (h, w) = features["tokens"], features["grid"]
    if tokens.shape[1] != h * w:
        raise ValueError(f"backbone returned {tokens.shape[1]} tokens for a {h}x{w} grid")
    return tokens.transpose(1, 2).reshape(tokens.shape[0], tokens.shape[2], h, w)


class ClassifierNet(nn.Module):
    """Backbone + linear classifier, with optional DRLoc localization heads (one on the final grid, or one per
    block for the every-block variant, Eq. 7)."""

    def __init__(self, backbone: nn.Module, classifier: nn.Module, drloc_heads: nn.ModuleList | None = None):
        super().__init__()
        self.backbone = backbone
        self.classifier = classifier
        self.drloc_heads = drloc_heads

    def forward(self, x: torch.Tensor, drloc_sampler=None) -> dict:
        """`drloc_sampler(grids) -> (pair_features, positions)` picks embedding pairs on the grids [B, D, k, k];
        the localization heads run on them here, inside the wrapped forward."""
        features = self.backbone(x)
        out = {"logits": self.classifier(features["pooled"])}
        if self.drloc_heads is not None and drloc_sampler is not None:
            if len(self.drloc_heads) > 1:
                grids = [token_grid(f) for f in features["blocks"]]
            else:
                grids = [token_grid(features)]
            pairs, positions = drloc_sampler(grids)
            out["drloc"] = [head(p) for head, p in zip(self.drloc_heads, pairs)]
            out["drloc_positions"] = positions
        return out


def init_teacher(teacher: nn.Module, student: nn.Module) -> nn.Module:
    """Copy the student's weights into the teacher (whose parameter names must be a subset of the student's) and
    freeze it, as the Method contract requires."""
    student_state = student.state_dict()
    missing = [name for name in teacher.state_dict() if name not in student_state]
    if missing:
        raise ValueError(f"teacher entries absent from the student: {missing[:5]}")
    teacher.load_state_dict({k: v for k, v in student_state.items() if k in teacher.state_dict()})
    teacher.requires_grad_(False)
    return teacher
