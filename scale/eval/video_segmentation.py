"""Video object segmentation by label propagation on DAVIS 2017 (DINO Table 5; DINO eval_video_segmentation.py,
after Jabri et al.'s space-time correspondence protocol). Nothing is trained: the first frame's masks are carried
to each next frame through the frozen patch features of the last block.

For each target frame, every patch looks at the patches of the first frame and of the `n_last_frames` previous
frames (their predicted soft masks), within a `neighbourhood` of patches around its own position; affinities are
exp(cosine / 0.1), only the `topk` largest per target patch are kept and normalised, and the target's soft mask is
their weighted sum of source masks. Masks are upsampled (bilinear) by the patch size, min-max normalised per object,
arg-maxed and resized to the annotation's size; J and F are scored as the DAVIS toolkit does (davis_metrics.py).

Layout read (DAVIS-2017-trainval-480p):
  ROOT/ImageSets/2017/<split>.txt            video names, one per line
  ROOT/JPEGImages/480p/<video>/00000.jpg ... frames, sorted by name
  ROOT/Annotations/480p/<video>/00000.png .. palette PNGs: 0 background, 1..K objects (the first is the seed;
                                             the others are the ground truth J and F are scored against)
"""

import logging
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from scale.errors import UserError
from scale.eval.davis_metrics import score_video
from scale.eval.images import patch_size, read_rgb

log = logging.getLogger(__name__)

TEMPERATURE = 0.1


@dataclass
class Video:
    name: str
    frames: list[Path]
    annotations: list[Path]


def read_davis(root: str | Path, split: str = "val", limit: int | None = None) -> list[Video]:
    root = Path(root)
    listing = root / "ImageSets" / "2017" / f"{split}.txt"
    if not listing.is_file():
        raise UserError(
            f"--davis {root}: missing {listing} (expected the DAVIS 2017 layout, see docs/how-to/evaluate.md)"
        )
    names = [line.strip() for line in listing.read_text().splitlines() if line.strip()][:limit]
    if not names:
        raise UserError(f"{listing}: no video names")
    videos = []
    for name in names:
        frame_dir = root / "JPEGImages" / "480p" / name
        frames = sorted(frame_dir.glob("*.jpg"))
        if not frames:
            raise UserError(f"--davis {root}: no frames {frame_dir}/*.jpg (video listed in {listing})")
        annotations = [root / "Annotations" / "480p" / name / f"{f.stem}.png" for f in frames]
        for path in annotations:
            if not path.is_file():
                raise UserError(f"--davis {root}: missing {path} (the annotation of {frame_dir / path.stem}.jpg)")
        videos.append(Video(name, frames, annotations))
    return videos


def read_labels(path: Path) -> np.ndarray:
    with Image.open(path) as png:
        if png.mode not in ("P", "L"):
            raise UserError(f"{path}: expected a palette (object index) PNG, got mode {png.mode}")
        return np.asarray(png)


def input_size(height: int, width: int, short_side: int) -> tuple[int, int]:
    """DINO's frame size: the shorter side to `short_side`, the longer one scaled and floored to a multiple of 64."""
    if height > width:
        return int(short_side * height / width // 64 * 64), short_side
    return short_side, int(short_side * width / height // 64 * 64)


def frame_tensor(path: Path, size: tuple[int, int], mean, std) -> torch.Tensor:
    image = read_rgb(path).resize((size[1], size[0]), Image.BILINEAR)
    tensor = torch.from_numpy(np.asarray(image, np.float32) / 255.0).permute(2, 0, 1)
    return (tensor - torch.tensor(mean).view(3, 1, 1)) / torch.tensor(std).view(3, 1, 1)


def one_hot(labels: np.ndarray, grid: tuple[int, int], objects: int) -> torch.Tensor:
    """[objects + 1, h, w] one-hot of a label map resized (nearest) to the patch grid; void counts as background."""
    small = np.asarray(Image.fromarray(labels).resize((grid[1], grid[0]), Image.NEAREST)).astype(np.int64)
    small[small > objects] = 0
    return F.one_hot(torch.from_numpy(small), objects + 1).permute(2, 0, 1).float()


def neighbourhood_mask(height: int, width: int, size: int) -> torch.Tensor:
    """[h*w (target), h*w (source)]: 1 where the source patch is within `size` rows and columns of the target."""
    rows, cols = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    rows, cols = rows.flatten(), cols.flatten()
    near = ((rows[:, None] - rows[None, :]).abs() <= size) & ((cols[:, None] - cols[None, :]).abs() <= size)
    return near.float()


def propagate(
    target: torch.Tensor, sources: list[torch.Tensor], masks: list[torch.Tensor], topk: int, near: torch.Tensor | None
) -> torch.Tensor:
    """Soft masks [C, h*w] of the target from source features ([h*w, D] each) and their masks ([C, h*w] each)."""
    target = F.normalize(target, dim=1)
    affinity = torch.stack([(target @ F.normalize(s, dim=1).T / TEMPERATURE).exp() for s in sources])  # [n, t, s]
    if near is not None:
        affinity = affinity * near
    affinity = affinity.permute(1, 0, 2).reshape(target.shape[0], -1)  # [target, n * source]
    kth = affinity.topk(min(topk, affinity.shape[1]), dim=1).values[:, -1:]
    affinity = torch.where(affinity >= kth, affinity, torch.zeros_like(affinity))
    affinity = affinity / affinity.sum(dim=1, keepdim=True)
    return torch.cat(masks, dim=1) @ affinity.T


@torch.no_grad()
def segment_video(backbone, video: Video, cfg: dict, mean, std, device) -> list[np.ndarray]:
    """Predicted label maps of every frame (the first is the given annotation)."""
    first = read_labels(video.annotations[0])
    objects = int(first[first != 255].max(initial=0))
    patch = patch_size(backbone)
    size = input_size(*first.shape, cfg["short_side"])

    def features(path: Path) -> tuple[torch.Tensor, tuple[int, int]]:
        out = backbone(frame_tensor(path, size, mean, std)[None].to(device))
        return out["tokens"][0].float(), out["grid"]

    first_feats, grid = features(video.frames[0])
    first_mask = one_hot(first, grid, objects).flatten(1).to(device)
    near = neighbourhood_mask(*grid, cfg["neighbourhood"]).to(device) if cfg["neighbourhood"] > 0 else None
    previous = deque(maxlen=cfg["n_last_frames"])
    predictions = [first]
    for path in video.frames[1:]:
        feats, _ = features(path)
        context = [(first_feats, first_mask), *previous]
        soft = propagate(feats, [f for f, _ in context], [m for _, m in context], cfg["topk"], near)
        previous.append((feats, soft))
        predictions.append(to_labels(soft.reshape(-1, *grid), patch, first.shape))
    return predictions


def to_labels(soft: torch.Tensor, patch: int, shape: tuple[int, int]) -> np.ndarray:
    """Upsample [C, h, w] by the patch size (bilinear), min-max normalise each object, arg-max, resize (nearest)."""
    up = F.interpolate(soft[None], scale_factor=patch, mode="bilinear", align_corners=False)[0]
    low = up.flatten(1).min(dim=1).values.view(-1, 1, 1)
    high = up.flatten(1).max(dim=1).values.view(-1, 1, 1)
    up = torch.where(high > 0, (up - low) / (high - low).clamp_min(1e-12), up)
    labels = up.argmax(dim=0).to(torch.uint8).cpu().numpy()
    return np.asarray(Image.fromarray(labels).resize((shape[1], shape[0]), Image.NEAREST))


def evaluate(backbone, videos: list[Video], cfg: dict, mean, std, device, out_dir: Path | None = None) -> dict:
    """J&F mean over every object of every video (DINO Table 5), with per-video scores (in %)."""
    per_video, j_all, f_all = {}, [], []
    for index, video in enumerate(videos):
        log.info("[%d/%d] propagating %s (%d frames)", index + 1, len(videos), video.name, len(video.frames))
        pred = segment_video(backbone, video, cfg, mean, std, device)
        if out_dir is not None:
            save_masks(pred, video, out_dir)
        scores = score_video([read_labels(p) for p in video.annotations], pred)
        per_video[video.name] = {k: 100.0 * float(np.mean(v)) for k, v in scores.items()}
        j_all += scores["J"]
        f_all += scores["F"]
    j_mean, f_mean = 100.0 * float(np.nanmean(j_all)), 100.0 * float(np.nanmean(f_all))
    return {
        "jf_mean": (j_mean + f_mean) / 2,
        "j_mean": j_mean,
        "f_mean": f_mean,
        "objects": len(j_all),
        **cfg,
        "videos": per_video,
    }


def save_masks(pred: list[np.ndarray], video: Video, out_dir: Path) -> None:
    """Palette PNGs with the annotation's palette, as the DAVIS toolkit reads results."""
    folder = out_dir / video.name
    folder.mkdir(parents=True, exist_ok=True)
    with Image.open(video.annotations[0]) as first:
        palette = first.getpalette()
    for labels, frame in zip(pred, video.frames):
        png = Image.fromarray(labels.astype(np.uint8), mode="P")
        if palette:
            png.putpalette(palette)
        png.save(folder / f"{frame.stem}.png")
