"""Weighted k-NN classification on frozen features (Wu et al. 2018, as in DINO's eval_knn.py).

Features are L2-normalised; each of the k nearest training samples votes for its class with weight exp(sim / T).
Similarities are computed block by block (queries x bank chunks) with a running top-k, so memory stays at
query_chunk x bank_chunk whatever the size of the bank.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from scale.data.evaluation import dataset_info
from scale.errors import UserError
from scale.eval import features as feats
from scale.watch.weighted_knn import nearest, vote


def check_labels(labels: torch.Tensor, what: str) -> None:
    if labels.ndim != 1:
        raise UserError(f"k-NN needs single-label data; the {what} labels have shape {tuple(labels.shape)}")
    if (labels < 0).any():
        raise UserError(f"k-NN needs labelled data; the {what} set has unlabelled samples (label -1)")


@torch.no_grad()
def knn_predict(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    queries: torch.Tensor,
    ks: list[int],
    temperature: float,
    num_classes: int,
    query_chunk: int = 1024,
    bank_chunk: int = 65536,
) -> dict[int, torch.Tensor]:
    """For every k: the top-5 predicted classes of each query ([Q, min(5, C)], best first)."""
    bank = F.normalize(train_features.float(), dim=1)
    queries = F.normalize(queries.float(), dim=1)
    train_labels = train_labels.to(queries.device)
    out: dict[int, list] = {k: [] for k in ks}
    for start in range(0, queries.shape[0], query_chunk):
        sim, idx = nearest(queries[start : start + query_chunk], bank, max(ks), bank_chunk)
        labels = train_labels[idx]
        for k in ks:
            scores = vote(sim[:, :k], labels[:, :k], num_classes, temperature)
            out[k].append(scores.topk(min(5, num_classes), dim=1).indices)
    empty = torch.zeros(0, min(5, num_classes), dtype=torch.long, device=queries.device)
    return {k: torch.cat(v) if v else empty for k, v in out.items()}


@torch.no_grad()
def knn_eval(
    train_features: torch.Tensor,
    train_labels: torch.Tensor,
    test_features: torch.Tensor,
    test_labels: torch.Tensor,
    ks: list[int],
    temperature: float,
    num_classes: int,
    device: torch.device | None = None,
    query_chunk: int = 1024,
    bank_chunk: int = 65536,
) -> dict:
    """Top-1/top-5 accuracy (%) for every k: {k: {"top1", "top5"}}.

    Every rank holds all features (after a gather); under torch.distributed each rank classifies its slice of the
    test set and the correct counts are summed, so the work is split and every rank returns the same numbers.
    """
    check_labels(train_labels, "train")
    check_labels(test_labels, "test")
    if train_features.shape[0] == 0 or test_features.shape[0] == 0:
        raise UserError("k-NN needs a non-empty train and test set")
    device = device or test_features.device
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    mine = slice(rank * test_features.shape[0] // world, (rank + 1) * test_features.shape[0] // world)
    preds = knn_predict(
        train_features.to(device),
        train_labels,
        test_features[mine].to(device),
        ks,
        temperature,
        num_classes,
        query_chunk,
        bank_chunk,
    )
    target = test_labels[mine].to(device)[:, None]
    counts = torch.tensor(
        [[(p[:, :1] == target).sum(), (p == target).sum()] for p in (preds[k] for k in ks)],
        dtype=torch.float64,
        device=device,
    ).reshape(len(ks), 2)
    if world > 1:
        dist.all_reduce(counts)
    total = test_features.shape[0]
    return {k: {"top1": 100.0 * float(c[0]) / total, "top5": 100.0 * float(c[1]) / total} for k, c in zip(ks, counts)}


def run(session, save_features: str | None = None, load_features: str | None = None) -> dict:
    """k-NN of data.val against data.train with the recipe's eval settings (or with features saved earlier)."""
    cfg = session.cfg
    source = {**session.describe(), "train": cfg.data.train, "val": cfg.data.val}
    if load_features:
        splits, meta = feats.load(load_features)
        train, test, num_classes = splits["train"], splits["test"], int(meta["num_classes"])
        source = {**source, **{k: meta[k] for k in ("model", "weights", "random_init", "train", "val") if k in meta}}
    else:
        num_classes = len(dataset_info(cfg.data.train)["classes"])
        train, test = session.features(cfg.data.train), session.features(cfg.data.val)
        if save_features and session.is_main:
            feats.save(save_features, {"train": train, "test": test}, {**source, "num_classes": num_classes})
    ks = [int(k) for k in cfg.eval.knn_k]
    per_k = knn_eval(
        train.features,
        train.labels,
        test.features,
        test.labels,
        ks,
        float(cfg.eval.knn_temperature),
        num_classes,
        session.device,
    )
    report_k = 20 if 20 in per_k else ks[0]  # DINO reports 20-NN ("usually working the best")
    return {
        "eval": "knn",
        **source,
        "features": load_features,
        "temperature": float(cfg.eval.knn_temperature),
        "train_samples": len(train),
        "test_samples": len(test),
        "feature_dim": int(train.features.shape[1]),
        "per_k": {str(k): v for k, v in per_k.items()},
        "k": report_k,
        "top1": per_k[report_k]["top1"],
        "top5": per_k[report_k]["top5"],
    }
