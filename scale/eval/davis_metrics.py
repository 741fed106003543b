"""DAVIS region similarity J and boundary accuracy F, as the DAVIS 2017 toolkit defines them
(davisvideochallenge/davis2017-evaluation, davis2017/metrics.py): J is the IoU of the object's mask, F the
F-measure of boundary pixels matched within ceil(0.008 x image diagonal) pixels; void pixels (255) count for
neither; an empty prediction of an empty object scores 1 on both."""

import math

import cv2
import numpy as np

from scale.extras import require

disk = require("eval", "skimage.morphology", "the DAVIS J&F score").disk

BOUNDARY_THRESHOLD = 0.008  # share of the image diagonal


def region_similarity(truth: np.ndarray, pred: np.ndarray, void: np.ndarray | None = None) -> float:
    """J: |pred ∩ truth| / |pred ∪ truth| outside void; 1 when the union is empty."""
    valid = np.ones(truth.shape, bool) if void is None else ~np.asarray(void, bool)
    truth, pred = np.asarray(truth, bool), np.asarray(pred, bool)
    union = ((truth | pred) & valid).sum()
    return 1.0 if union == 0 else float(((truth & pred) & valid).sum() / union)


def boundary_map(mask: np.ndarray) -> np.ndarray:
    """One-pixel boundaries: a pixel differs from its east, south or south-east neighbour (seg2bmap)."""
    seg = np.asarray(mask, bool)
    east, south, south_east = np.zeros_like(seg), np.zeros_like(seg), np.zeros_like(seg)
    east[:, :-1] = seg[:, 1:]
    south[:-1, :] = seg[1:, :]
    south_east[:-1, :-1] = seg[1:, 1:]
    boundary = (seg ^ east) | (seg ^ south) | (seg ^ south_east)
    boundary[-1, :] = seg[-1, :] ^ east[-1, :]
    boundary[:, -1] = seg[:, -1] ^ south[:, -1]
    boundary[-1, -1] = False
    return boundary


def boundary_f_measure(truth: np.ndarray, pred: np.ndarray, void: np.ndarray | None = None) -> float:
    """F: harmonic mean of boundary precision and recall, a boundary pixel matching within the tolerance."""
    valid = np.ones(truth.shape, bool) if void is None else ~np.asarray(void, bool)
    radius = math.ceil(BOUNDARY_THRESHOLD * math.hypot(*truth.shape))
    pred_boundary = boundary_map(np.asarray(pred, bool) & valid)
    truth_boundary = boundary_map(np.asarray(truth, bool) & valid)
    kernel = disk(radius).astype(np.uint8)
    pred_dilated = cv2.dilate(pred_boundary.astype(np.uint8), kernel).astype(bool)
    truth_dilated = cv2.dilate(truth_boundary.astype(np.uint8), kernel).astype(bool)
    n_pred, n_truth = pred_boundary.sum(), truth_boundary.sum()
    if n_pred == 0 or n_truth == 0:
        precision, recall = (1.0, 0.0) if n_truth else (0.0, 1.0) if n_pred else (1.0, 1.0)
    else:
        precision = (pred_boundary & truth_dilated).sum() / n_pred
        recall = (truth_boundary & pred_dilated).sum() / n_truth
    return 0.0 if precision + recall == 0 else float(2 * precision * recall / (precision + recall))


def score_video(truth: list[np.ndarray], pred: list[np.ndarray]) -> dict[str, list[float]]:
    """Per object (ids 1..max of the first annotation), the mean J and F over the frames between the first and
    the last (the toolkit leaves both out). `truth`, `pred`: label maps per frame, 255 void in truth."""
    first = truth[0][truth[0] != 255]
    objects = range(1, int(first.max()) + 1 if first.size else 1)
    scored = list(zip(truth, pred))[1:-1]
    result = {"J": [], "F": []}
    for obj in objects:
        j = [region_similarity(t == obj, p == obj, t == 255) for t, p in scored]
        f = [boundary_f_measure(t == obj, p == obj, t == 255) for t, p in scored]
        result["J"].append(float(np.mean(j)) if j else float("nan"))
        result["F"].append(float(np.mean(f)) if f else float("nan"))
    return result
