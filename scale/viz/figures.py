"""Matplotlib figures of attention maps and masks, one row pair per backbone (DINO Fig. 1/3/4 style)."""

from pathlib import Path

from scale.extras import require

require("viz", "matplotlib", "an attention figure").use("Agg")  # files only: runs on headless nodes
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from scale.eval.images import to_display  # noqa: E402
from scale.viz import attention as attn  # noqa: E402

MASK_COLOUR = np.array([1.0, 0.25, 0.1])


def save_figure(fig, title: str, out: Path) -> Path:
    """Title, lay out, write `out` (its folder made) and free the figure."""
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def attention_figure(
    image: np.ndarray, rows: dict[str, tuple[np.ndarray, np.ndarray]], keep: float, title: str, out: Path
) -> Path:
    """`image` [H, W, 3] in [0, 1]; rows: label -> (maps [heads, H, W], masks [heads, H, W] bool). Per backbone,
    one row of per-head heat maps and one of the masks laid over the image."""
    heads = max(maps.shape[0] for maps, _ in rows.values())
    fig, axes = plt.subplots(2 * len(rows), heads + 1, figsize=(1.6 * (heads + 1), 1.7 * 2 * len(rows)), squeeze=False)
    for index, (label, (maps, masks)) in enumerate(rows.items()):
        top, bottom = axes[2 * index], axes[2 * index + 1]
        top[0].imshow(image)
        top[0].set_title(label, fontsize=8)
        bottom[0].imshow(image)
        bottom[0].set_title(f"masks: {keep:.0%} of the mass" if index == 0 else "", fontsize=7)
        for head in range(maps.shape[0]):
            top[head + 1].imshow(maps[head], cmap="inferno")
            top[head + 1].set_title(f"head {head}", fontsize=7)
            overlay = image * 0.35 + masks[head][..., None] * MASK_COLOUR * 0.65 + image * masks[head][..., None] * 0.35
            bottom[head + 1].imshow(overlay.clip(0, 1))
    for ax in axes.flat:
        ax.axis("off")
    return save_figure(fig, title, out)


def attention_picture(backbones: dict, image: torch.Tensor, mean, std, keep: float, title: str, out: Path) -> Path:
    """The picture of one normalised image [3, H, W] under every backbone (label -> ViT)."""
    size = tuple(image.shape[1:])
    rows = {}
    for label, backbone in backbones.items():
        maps = attn.attention_maps(backbone, image[None])[0]
        masks = attn.upsample(attn.mass_mask(maps, keep), size).bool().numpy()
        rows[label] = (attn.upsample(maps, size).numpy(), masks)
    query = attn.query_kind(next(iter(backbones.values())))
    return attention_figure(to_display(image, mean, std), rows, keep, f"{title}\nquery: {query}", out)
