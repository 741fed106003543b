"""Image retrieval on revisited Oxford and Paris (DINO Table 3; DINO eval_image_retrieval.py): the pooled output
(ViT: class token) of every database image and query, L2-normalised, ranked by cosine similarity; mAP under the
Medium and Hard protocols (ranking.py).

Images are shrunk so that the longer side is at most `imsize` (PIL thumbnail, as DINO; Oxford 224, Paris 512 in
DINO's README); `multiscale` averages the features at scales 1, 1/sqrt(2) and 1/2 (DINO's multi_scale: Paris on,
Oxford off). DINO's code feeds the whole query image; the revisited protocol crops each query to its `bbx`
(`query_crop`, off by default: the table was measured without it).

Layout read (github.com/filipradenovic/revisitop):
  ROOT/<dataset>/gnd_<dataset>.pkl   {imlist, qimlist, gnd: [{bbx, easy, hard, junk}]} (read with a restricted
                                     unpickler: plain data only)
  ROOT/<dataset>/jpg/<name>.jpg      every name of imlist and qimlist
with <dataset> roxford5k or rparis6k.
"""

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from scale.errors import UserError
from scale.eval import safe_pickle
from scale.eval.images import fit_to_patches, patch_size, read_rgb, to_input
from scale.eval.ranking import revisited_map

log = logging.getLogger(__name__)

DATASETS = ("roxford5k", "rparis6k")
SCALES = (1.0, 1 / math.sqrt(2), 0.5)


@dataclass
class Revisited:
    name: str
    images: list[Path]
    queries: list[Path]
    gnd: list[dict]


def read_revisited(root: str | Path, dataset: str) -> Revisited:
    if dataset not in DATASETS:
        raise UserError(f"--dataset must be one of {', '.join(DATASETS)}, got '{dataset}'")
    folder = Path(root) / dataset
    gnd_file = folder / f"gnd_{dataset}.pkl"
    cfg = safe_pickle.load(gnd_file)
    if not isinstance(cfg, dict) or not {"imlist", "qimlist", "gnd"} <= cfg.keys():
        raise UserError(f"{gnd_file}: expected a dict with imlist, qimlist and gnd")
    if len(cfg["gnd"]) != len(cfg["qimlist"]):
        raise UserError(f"{gnd_file}: {len(cfg['gnd'])} gnd entries for {len(cfg['qimlist'])} queries")
    for index, truth in enumerate(cfg["gnd"]):
        missing = {"bbx", "easy", "hard"} - set(truth)
        if missing:
            raise UserError(f"{gnd_file}: gnd[{index}] lacks {sorted(missing)}")
    images = [folder / "jpg" / f"{name}.jpg" for name in cfg["imlist"]]
    queries = [folder / "jpg" / f"{name}.jpg" for name in cfg["qimlist"]]
    for path in images + queries:
        if not path.is_file():
            raise UserError(f"missing {path} (listed in {gnd_file})")
    return Revisited(dataset, images, queries, list(cfg["gnd"]))


def shrunk(path: Path, imsize: int, box=None) -> Image.Image:
    image = read_rgb(path)
    if box is not None:
        image = image.crop(tuple(float(v) for v in box))
    image.thumbnail((imsize, imsize), Image.LANCZOS)
    return image


@torch.no_grad()
def descriptor(backbone, image: torch.Tensor, multiscale: bool, device) -> torch.Tensor:
    """The L2-normalised pooled feature [D] of a normalised image [3, H, W] (mean over scales with multiscale)."""
    multiple = patch_size(backbone)
    total = 0.0
    for scale in SCALES if multiscale else SCALES[:1]:
        batch = image[None]
        if scale != 1.0:
            batch = F.interpolate(batch, scale_factor=scale, mode="bilinear", align_corners=False)
        total = total + backbone(fit_to_patches(batch, multiple).to(device))["pooled"].float()
    return F.normalize(total, dim=-1)[0].cpu()


def evaluate(backbone, data: Revisited, imsize: int, multiscale: bool, query_crop: bool, mean, std, device) -> dict:
    def features(paths, boxes) -> torch.Tensor:
        return torch.stack(
            [
                descriptor(backbone, to_input(shrunk(p, imsize, b), None, 1, mean, std), multiscale, device)
                for p, b in zip(paths, boxes)
            ]
        )

    log.info("features of %d database images and %d queries", len(data.images), len(data.queries))
    database = features(data.images, [None] * len(data.images))
    boxes = [truth["bbx"] for truth in data.gnd] if query_crop else [None] * len(data.queries)
    queries = features(data.queries, boxes)
    ranks = torch.argsort(database @ queries.T, dim=0, descending=True).numpy()
    return {
        "dataset": data.name,
        "medium_map": revisited_map(ranks, data.gnd, "medium"),
        "hard_map": revisited_map(ranks, data.gnd, "hard"),
        "images": len(data.images),
        "queries": len(data.queries),
        "imsize": imsize,
        "multiscale": multiscale,
        "query_crop": query_crop,
        "ranks_top10": np.asarray(ranks[:10].T).tolist(),
    }
