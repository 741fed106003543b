"""EsViT Fig. 8-style pictures: the top matched regions between two views of an image.

The views are those of `scale eval correspondence` (EsViT C.7): view 1 is the image, view 2 its horizontal flip
with colour jitter and random greyscale. Each view-1 token is matched to its most similar view-2 token; the `top`
most confident matches are drawn as lines between the token centres, green where the match is the mirrored
position (correct), red elsewhere.
"""

from pathlib import Path

from scale.extras import require

require("viz", "matplotlib", "a correspondence picture").use("Agg")  # files only: runs on headless nodes
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from scale.eval.correspondence import second_view, top_matches  # noqa: E402
from scale.eval.images import to_display  # noqa: E402
from scale.viz.figures import save_figure  # noqa: E402


def centres(indices: torch.Tensor, grid: tuple[int, int], size: tuple[int, int]) -> np.ndarray:
    """Pixel (x, y) centres of row-major token indices on `grid` over an image of `size` (H, W)."""
    stride_y, stride_x = size[0] / grid[0], size[1] / grid[1]
    rows, cols = indices // grid[1], indices % grid[1]
    return np.stack([(cols.numpy() + 0.5) * stride_x, (rows.numpy() + 0.5) * stride_y], axis=1)


@torch.no_grad()
def matches(backbone, view1: torch.Tensor, view2: torch.Tensor, top: int) -> dict:
    """Token centres of the `top` matches of one image pair ([3, H, W] each) and whether each is the mirror."""
    device = next(backbone.parameters()).device
    out1, out2 = backbone(view1[None].to(device)), backbone(view2[None].to(device))
    conf, chosen, matched = (t[0].cpu() for t in top_matches(out1["tokens"], out2["tokens"], top))
    height, width = out1["grid"]
    mirrored = (chosen // width) * width + (width - 1 - chosen % width)
    size = tuple(view1.shape[1:])
    return {
        "from": centres(chosen, (height, width), size),
        "to": centres(matched, (height, width), size),
        "correct": (matched == mirrored).numpy(),
        "similarity": conf.numpy(),
    }


def correspondence_picture(backbones: dict, image: torch.Tensor, mean, std, top: int, seed: int, title, out: Path):
    """One row per backbone: view 1 and view 2 side by side, the top matches joined by lines."""
    mean_t, std_t = torch.tensor(mean).view(1, 3, 1, 1), torch.tensor(std).view(1, 3, 1, 1)
    raw = (image[None] * std_t + mean_t).clamp(0, 1)
    view2 = ((second_view(raw, torch.Generator().manual_seed(seed)) - mean_t) / std_t)[0]
    left, right = to_display(image, mean, std), to_display(view2, mean, std)
    gap = max(4, image.shape[2] // 20)
    canvas = np.concatenate([left, np.ones((left.shape[0], gap, 3)), right], axis=1)
    fig, axes = plt.subplots(len(backbones), 1, figsize=(6, 3.2 * len(backbones)), squeeze=False)
    for ax, (label, backbone) in zip(axes[:, 0], backbones.items()):
        found = matches(backbone, image, view2, top)
        ax.imshow(canvas)
        for (x1, y1), (x2, y2), ok in zip(found["from"], found["to"], found["correct"]):
            ax.plot([x1, x2 + left.shape[1] + gap], [y1, y2], color="lime" if ok else "red", linewidth=1.2)
            ax.plot([x1, x2 + left.shape[1] + gap], [y1, y2], "o", color="white", markersize=2.5)
        ax.set_title(f"{label}: {int(found['correct'].sum())}/{len(found['correct'])} top matches at the mirror")
        ax.axis("off")
    return save_figure(fig, title, out)
