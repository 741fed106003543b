"""Copy detection on the Copydays "strong" subset (DINO Table 4; DINO eval_copy_detection.py).

Descriptor: the class token (the pooled output) concatenated with the GeM (p = 4) pool of the output patch tokens,
of images resized to imsize x imsize (bicubic; 224 for ViT-B/16, 320 for ViT-B/8). Whitening as DINO: the mean of
the whitening images' features is subtracted from queries and database, the covariance of those (uncentred, as
DINO's code) is eigen-decomposed and features are multiplied by diag(eigenvalue^-1/2) V^T (eigenvalues below
1e-5 x the largest are raised to it). Every strong image queries the 157 originals plus the distractors by cosine
similarity; its positives are the originals whose name starts with the same 4 characters (DINO's rule); AP over
the `top` results (DINO: 20), mAP over the 229 queries.

The paper learns the whitening on 20k YFCC100M images distinct from the 10k distractors; without --whitening the
distractors serve.

Layout read (https://lear.inrialpes.fr/~jegou/data.php#copydays):
  ROOT/original/*.jpg    the 157 originals (database)
  ROOT/strong/*.jpg      the 229 strong attacks (queries)
  DISTRACTORS/*.jpg|png  distractor images (the paper: 10k random YFCC100M images)
"""

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from scale.errors import UserError
from scale.eval.images import patch_size, read_rgb, to_input
from scale.eval.ranking import average_precision

log = logging.getLogger(__name__)

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"}
GEM_POWER = 4.0


def image_files(folder: Path, what: str, suffixes=IMAGE_SUFFIXES) -> list[Path]:
    if not folder.is_dir():
        raise UserError(f"missing folder {folder} ({what})")
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in suffixes)
    if not files:
        raise UserError(f"{folder}: no images ({what})")
    return files


@dataclass
class CopyDetectionData:
    originals: list[Path]
    queries: list[Path]  # the strong subset
    distractors: list[Path]
    whitening: list[Path]
    whitening_from: str | None


def read_inputs(root: str | Path, distractors: str | None, whitening: str | None) -> CopyDetectionData:
    root = Path(root)
    originals = image_files(root / "original", "Copydays originals", {".jpg"})
    queries = image_files(root / "strong", "Copydays strong subset", {".jpg"})
    distractor_files = image_files(Path(distractors), "distractors") if distractors else []
    if whitening:
        return CopyDetectionData(
            originals, queries, distractor_files, image_files(Path(whitening), "whitening"), whitening
        )
    return CopyDetectionData(
        originals, queries, distractor_files, distractor_files, "distractors" if distractors else None
    )


def positives_of(queries: list[Path], originals: list[Path]) -> list[list[int]]:
    return [[i for i, o in enumerate(originals) if o.name[:4] == q.name[:4]] for q in queries]


@torch.no_grad()
def descriptors(backbone, paths: list[Path], imsize: int, mean, std, device, batch_size: int = 16) -> torch.Tensor:
    """[N, 2D]: pooled output and GeM-pooled patch tokens of each image resized to imsize x imsize."""
    out = []
    for start in range(0, len(paths), batch_size):
        images = torch.stack(
            [
                to_input(read_rgb(p).resize((imsize, imsize), Image.BICUBIC), None, patch_size(backbone), mean, std)
                for p in paths[start : start + batch_size]
            ]
        )
        result = backbone(images.to(device))
        gem = result["tokens"].float().clamp(min=1e-6).pow(GEM_POWER).mean(dim=1).pow(1 / GEM_POWER)
        out.append(torch.cat([result["pooled"].float(), gem], dim=1).cpu())
    return torch.cat(out)


def learn_whitening(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, projection [D, D]) as DINO's PCA(whit=0.5) on the uncentred covariance of `features`."""
    features = features.double()
    covariance = features.T @ features / features.shape[0]
    values, vectors = torch.linalg.eigh(covariance)
    values = values.clamp(min=float(values.max()) * 1e-5)
    order = values.argsort(descending=True)
    projection = torch.diag(values[order] ** -0.5) @ vectors[:, order].T
    return features.mean(dim=0), projection


def whiten(features: torch.Tensor, mean: torch.Tensor, projection: torch.Tensor) -> torch.Tensor:
    return ((features.double() - mean) @ projection.T).float()


def mean_ap(queries: torch.Tensor, database: torch.Tensor, positives: list[list[int]], top: int) -> float:
    """mAP (%) of cosine-similarity search, each query's AP read from its `top` results."""
    similarity = F.normalize(queries, dim=1) @ F.normalize(database, dim=1).T
    ranked = similarity.topk(min(top, database.shape[0]), dim=1).indices.numpy()
    aps = [
        average_precision(np.flatnonzero(np.isin(row, wanted)), len(wanted))
        for row, wanted in zip(ranked, positives)
        if wanted
    ]
    if not aps:
        raise UserError("copy detection: no strong image has an original with the same 4-character name prefix")
    return 100.0 * float(np.mean(aps))


def evaluate(backbone, data: CopyDetectionData, imsize: int, top: int, mean, std, device) -> dict:
    def features(paths):
        return descriptors(backbone, paths, imsize, mean, std, device)

    log.info(
        "features of %d queries, %d originals, %d distractors",
        len(data.queries),
        len(data.originals),
        len(data.distractors),
    )
    queries = features(data.queries)
    database = torch.cat([features(data.originals)] + ([features(data.distractors)] if data.distractors else []))
    if data.whitening:
        mean_feat, projection = learn_whitening(features(data.whitening))
        queries, database = whiten(queries, mean_feat, projection), whiten(database, mean_feat, projection)
    return {
        "strong_map": mean_ap(queries, database, positives_of(data.queries, data.originals), top),
        "queries": len(data.queries),
        "originals": len(data.originals),
        "distractors": len(data.distractors),
        "whitening_images": len(data.whitening),
        "whitening_from": data.whitening_from,
        "descriptor_dim": int(queries.shape[1]),
        "imsize": imsize,
        "top": top,
    }
