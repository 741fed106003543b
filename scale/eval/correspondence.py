"""Correspondence learning (EsViT Appendix C.7): do a backbone's tokens find the same region in two views?

View 1 is the center crop (eval view); view 2 is its horizontal flip, then colour jitter and random greyscale, so
the true match of token (r, c) is (r, w - 1 - c). Each view-1 token is matched to the view-2 token of highest
cosine similarity; the `top` most confident matches (10 in the paper) of each image are scored: accuracy = share
matched to the mirrored position, distance error = mean l2 distance in pixels between the matched and the true
token centres (0 for a perfect match). Results are averaged over images.
"""

from collections.abc import Iterable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torchvision.transforms.v2.functional as TF

from scale.data.batch import Batch
from scale.errors import UserError
from scale.eval.features import world


def second_view(
    images: torch.Tensor, generator: torch.Generator, jitter=(0.4, 0.4, 0.2, 0.1), grayscale_p: float = 0.2
) -> torch.Tensor:
    """Horizontal flip, then colour jitter (torchvision ColorJitter: random factors, random order), then greyscale
    with probability grayscale_p; images are [B, 3, H, W] in [0, 1]."""
    out = []
    brightness, contrast, saturation, hue = jitter

    def uniform(low: float, high: float) -> float:
        return float(torch.empty(()).uniform_(low, high, generator=generator))

    for img in TF.horizontal_flip(images):
        ops = {
            0: (TF.adjust_brightness, brightness, 1.0),
            1: (TF.adjust_contrast, contrast, 1.0),
            2: (TF.adjust_saturation, saturation, 1.0),
            3: (TF.adjust_hue, hue, 0.0),
        }
        for op in torch.randperm(4, generator=generator).tolist():
            fn, strength, center = ops[op]
            if strength:
                low = max(0.0, center - strength) if op < 3 else -strength
                img = fn(img, uniform(low, center + strength))
        if float(torch.rand((), generator=generator)) < grayscale_p:
            img = TF.rgb_to_grayscale(img, num_output_channels=3)
        out.append(img)
    return torch.stack(out)


def top_matches(tokens1: torch.Tensor, tokens2: torch.Tensor, top: int) -> tuple[torch.Tensor, ...]:
    """The `top` most confident matches per image ([B, top] each): cosine similarity, view-1 token index and the
    view-2 token it matches best."""
    sim = F.normalize(tokens1.float(), dim=-1) @ F.normalize(tokens2.float(), dim=-1).transpose(1, 2)
    best_sim, match = sim.max(dim=2)  # [B, N]: best view-2 token of each view-1 token
    conf, chosen = best_sim.topk(min(top, tokens1.shape[1]), dim=1)
    return conf, chosen, match.gather(1, chosen)


def match_scores(
    tokens1: torch.Tensor, tokens2: torch.Tensor, grid: tuple[int, int], stride: tuple[float, float], top: int = 10
) -> dict[str, torch.Tensor]:
    """Per image ([B] each): accuracy of the `top` most confident matches, their mean pixel distance to the mirrored
    position, and their mean cosine similarity. Tokens are [B, h*w, D] in row-major grid order."""
    height, width = grid
    if tokens1.shape[1] != height * width or tokens2.shape != tokens1.shape:
        raise ValueError(f"tokens {tuple(tokens1.shape)} / {tuple(tokens2.shape)} do not fit the grid {grid}")
    conf, chosen, matched = top_matches(tokens1, tokens2, top)
    row, col = chosen // width, chosen % width
    true = row * width + (width - 1 - col)
    d_row = (matched // width - row).float() * stride[0]
    d_col = (matched % width - (width - 1 - col)).float() * stride[1]
    return {
        "accuracy": (matched == true).float().mean(1),
        "distance": (d_row**2 + d_col**2).sqrt().mean(1),
        "similarity": conf.mean(1),
    }


@torch.no_grad()
def evaluate(
    backbone: nn.Module,
    batches: Iterable[Batch],
    device: torch.device,
    mean,
    std,
    jitter=(0.4, 0.4, 0.2, 0.1),
    grayscale_p: float = 0.2,
    top: int = 10,
    seed: int = 0,
    max_images: int | None = None,
) -> dict:
    """Mean accuracy (%), distance error (px) and similarity over the images of every rank (at most max_images
    on this rank)."""
    backbone.eval()
    rank, size = world()
    generator = torch.Generator().manual_seed(seed * 1000003 + rank)
    mean_t = torch.tensor(mean).view(1, 3, 1, 1)
    std_t = torch.tensor(std).view(1, 3, 1, 1)
    sums = torch.zeros(4, dtype=torch.float64)  # accuracy, distance, similarity, images
    for batch in batches:
        images = batch.crops[0].cpu().float()
        if max_images is not None:
            images = images[: max(0, max_images - int(sums[3]))]
            if images.shape[0] == 0:
                break
        view2 = (second_view((images * std_t + mean_t).clamp(0, 1), generator, jitter, grayscale_p) - mean_t) / std_t
        out1, out2 = backbone(images.to(device)), backbone(view2.to(device))
        stride = (images.shape[2] / out1["grid"][0], images.shape[3] / out1["grid"][1])
        scores = match_scores(out1["tokens"], out2["tokens"], out1["grid"], stride, top)
        sums += torch.tensor(
            [float(scores[k].sum()) for k in ("accuracy", "distance", "similarity")] + [images.shape[0]],
            dtype=torch.float64,
        )
    if size > 1:
        sums = sums.to(device)
        dist.all_reduce(sums)
        sums = sums.cpu()
    images = float(sums[3])
    if images == 0:
        raise UserError("correspondence: no images to evaluate")
    return {
        "accuracy": 100.0 * float(sums[0]) / images,
        "distance_error_px": float(sums[1]) / images,
        "similarity": float(sums[2]) / images,
        "images": int(images),
        "top": top,
    }


def run(session) -> dict:
    """Correspondence on the center crops of data.val (at most eval.correspondence_images images)."""
    cfg = session.cfg
    limit = cfg.eval.correspondence_images
    per_rank = None if limit is None else -(-int(limit) // session.info.world_size)
    result = evaluate(
        session.backbone,
        session.batches(cfg.data.val),
        session.device,
        cfg.data.views.mean,
        cfg.data.views.std,
        tuple(cfg.eval.correspondence_jitter),
        float(cfg.eval.correspondence_grayscale_p),
        int(cfg.eval.correspondence_top),
        cfg.train.seed,
        per_rank,
    )
    return {
        "eval": "correspondence",
        **session.describe(),
        "val": cfg.data.val,
        "jitter": list(cfg.eval.correspondence_jitter),
        "grayscale_p": float(cfg.eval.correspondence_grayscale_p),
        **result,
    }
