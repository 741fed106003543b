"""Logistic-regression transfer suite (EsViT Appendix C.5, following CLIP's linear-probe protocol).

Per data set: frozen last-layer features; scikit-learn L-BFGS logistic regression (max 1000 iterations); the L2
strength lambda (sklearn C = 1 / lambda) searched over 1e-6..1e6 on a validation split by a parametric binary
search: start at lambda = 1e-6, 1e-4, ..., 1e6, then repeatedly halve the step around the best value until it is
1/8 decade (the resolution of the 96-step grid); the final classifier is fit on train + validation with the best
lambda and scored on the test split with the data set's metric.

Validation split rules: a data set that ships a val split besides its test split searches on it; otherwise the
validation rows are carved from train (a stable hash of the sample key). The score is in percent.
"""

import json
import logging
import math
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np

from scale.data.evaluation import dataset_info
from scale.errors import UserError
from scale.eval.linear import in_val_split
from scale.extras import require

log = logging.getLogger(__name__)

METRICS = ("accuracy", "mean_per_class", "map_11point", "roc_auc")
LOG_LAMBDA_RANGE = (-6.0, 6.0)
START_STEP = 2.0  # decades between the 7 initial values
FINEST_STEP = 1.0 / 8.0  # 8 steps per decade


# ------------------------------------------------------------------------------------------------------- metrics


def one_hot(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """[N] class indices -> [N, C] 0/1; [N, C] multi-label targets pass through."""
    if labels.ndim == 2:
        return labels.astype(np.int64)
    out = np.zeros((labels.shape[0], num_classes), dtype=np.int64)
    out[np.arange(labels.shape[0]), labels] = 1
    return out


def average_precision_11point(target: np.ndarray, scores: np.ndarray) -> float:
    """VOC2007 AP of one class: mean over recall r in {0, 0.1, ..., 1} of the best precision at recall >= r."""
    positives = target.sum()
    if positives == 0:
        return float("nan")
    order = np.argsort(-scores, kind="stable")
    hits = target[order]
    true_pos = np.cumsum(hits)
    precision = true_pos / np.arange(1, len(hits) + 1)
    recall = true_pos / positives
    points = [precision[recall >= r].max() if (recall >= r).any() else 0.0 for r in np.linspace(0, 1, 11)]
    return float(np.mean(points))


def score(metric: str, labels: np.ndarray, proba: np.ndarray) -> float:
    """The data set's metric in percent; `proba` is [N, C] over all classes, labels [N] or [N, C] multi-label."""
    require("eval", "sklearn", "the linear-probe metrics")
    from sklearn.metrics import balanced_accuracy_score, roc_auc_score

    num_classes = proba.shape[1]
    if metric == "accuracy":
        if labels.ndim != 1:
            raise UserError("metric accuracy needs single-label data; use map_11point or roc_auc")
        return 100.0 * float((proba.argmax(1) == labels).mean())
    if metric == "mean_per_class":
        if labels.ndim != 1:
            raise UserError("metric mean_per_class needs single-label data")
        return 100.0 * float(balanced_accuracy_score(labels, proba.argmax(1)))
    if metric == "map_11point":
        target = one_hot(labels, num_classes)
        aps = [average_precision_11point(target[:, c], proba[:, c]) for c in range(num_classes)]
        return 100.0 * float(np.nanmean(aps))
    if metric == "roc_auc":
        if labels.ndim == 1 and num_classes == 2:
            return 100.0 * float(roc_auc_score(labels, proba[:, 1]))
        target = one_hot(labels, num_classes)
        present = [c for c in range(num_classes) if 0 < target[:, c].sum() < len(target)]
        return 100.0 * float(roc_auc_score(target[:, present], proba[:, present], average="macro"))
    raise UserError(f"unknown metric '{metric}'; one of {', '.join(METRICS)}")


# ------------------------------------------------------------------------------------------------------- fitting


def fit_predict(
    train_x: np.ndarray,
    train_y: np.ndarray,
    test_x: np.ndarray,
    strength: float,
    num_classes: int,
    max_iter: int = 1000,
    seed: int = 0,
) -> np.ndarray:
    """Probabilities [N_test, num_classes] of an L-BFGS logistic regression with L2 strength lambda (C = 1/lambda).

    Multi-label targets ([N, C]) get one binary classifier per class (one-vs-rest)."""
    require("eval", "sklearn", "the logistic-regression probe")
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.linear_model import LogisticRegression
    from sklearn.multiclass import OneVsRestClassifier

    model = LogisticRegression(C=1.0 / strength, max_iter=max_iter, solver="lbfgs", random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # max_iter is part of the protocol
        if train_y.ndim == 2:
            clf = OneVsRestClassifier(model).fit(train_x, train_y.astype(np.int64))
            return clf.predict_proba(test_x)
        if len(np.unique(train_y)) < 2:
            raise UserError("logistic regression needs at least 2 classes in the training split")
        clf = model.fit(train_x, train_y)
        proba = np.zeros((test_x.shape[0], num_classes))
        proba[:, clf.classes_] = clf.predict_proba(test_x)  # classes absent from train keep probability 0
        return proba


def search_strength(
    evaluate: Callable[[float], float],
    log_range: tuple = LOG_LAMBDA_RANGE,
    start_step: float = START_STEP,
    finest_step: float = FINEST_STEP,
) -> tuple[float, dict]:
    """The parametric binary search over log10(lambda): the best lambda and every {log10 lambda: score} tried.

    Ties go to the larger lambda (the stronger regularisation)."""
    low, high = log_range
    tried: dict[float, float] = {}

    def visit(x: float) -> None:
        if low <= x <= high and x not in tried:
            tried[x] = float(evaluate(10.0**x))

    def peak() -> float:
        return max(tried, key=lambda x: (tried[x], x))

    for i in range(int(round((high - low) / start_step)) + 1):
        visit(low + i * start_step)
    step = start_step
    while step > finest_step:
        step /= 2
        center = peak()
        visit(center - step)
        visit(center + step)
    return 10.0 ** peak(), tried


def evaluate_dataset(
    train: tuple, val: tuple, test: tuple, metric: str, num_classes: int, max_iter: int = 1000, seed: int = 0
) -> dict:
    """Search lambda on (train -> val), fit on train + val, score on test. Each split is (features, labels)."""
    if metric not in METRICS:
        raise UserError(f"unknown metric '{metric}'; one of {', '.join(METRICS)}")
    for name, (x, _) in (("train", train), ("val", val), ("test", test)):
        if len(x) == 0:
            raise UserError(f"logistic regression: the {name} split is empty")

    def val_score(strength: float) -> float:
        proba = fit_predict(train[0], train[1], val[0], strength, num_classes, max_iter, seed)
        return score(metric, val[1], proba)

    best, tried = search_strength(val_score)
    all_x = np.concatenate([train[0], val[0]])
    all_y = np.concatenate([train[1], val[1]])
    test_score = score(metric, test[1], fit_predict(all_x, all_y, test[0], best, num_classes, max_iter, seed))
    return {
        "metric": metric,
        "score": test_score,
        "best_lambda": best,
        "best_log10_lambda": math.log10(best),
        "val_scores": {f"{x:g}": s for x, s in sorted(tried.items())},
        "samples": {"train": len(train[0]), "val": len(val[0]), "test": len(test[0])},
    }


# ------------------------------------------------------------------------------------------------------- suites


def read_reference(path: str | Path) -> dict[str, float]:
    """Per-dataset scores of a reference model: a JSON written by `scale eval logreg` or a {name: score} map."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--reference: file not found: {path}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise UserError(f"--reference {path}: not valid JSON: {err}") from None
    if isinstance(data, dict) and isinstance(data.get("datasets"), dict):
        data = {name: entry.get("score") for name, entry in data["datasets"].items()}
    if not isinstance(data, dict) or not all(isinstance(v, (int, float)) for v in data.values()):
        raise UserError(f"--reference {path}: expected a `scale eval logreg` result or a JSON map name -> score")
    return {name: float(v) for name, v in data.items()}


def compare(scores: dict[str, float], reference: dict[str, float]) -> dict:
    """Wins (strictly better), the reference's average on the shared data sets, and what it lacks."""
    shared = [name for name in scores if name in reference]
    return {
        "wins": sum(scores[n] > reference[n] for n in shared),
        "compared": len(shared),
        "reference_average": float(np.mean([reference[n] for n in shared])) if shared else None,
        "average_on_shared": float(np.mean([scores[n] for n in shared])) if shared else None,
        "missing_in_reference": [n for n in scores if n not in reference],
        "per_dataset": {n: {"ours": scores[n], "reference": reference[n]} for n in shared},
    }


def read_suite(path: str | Path) -> list[dict]:
    """A suite file: YAML `datasets: [{name, root, metric}]`; root holds train/, test/ and optionally val/ shard
    directories (train/ and val/ alone: val is the test split)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise UserError(f"--suite: file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise UserError(f"--suite {path}: not valid YAML: {err}") from None
    entries = data.get("datasets") if isinstance(data, dict) else None
    if not isinstance(entries, list) or not entries:
        raise UserError(f"--suite {path}: expected a non-empty list under 'datasets'")
    suite = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or "root" not in entry:
            raise UserError(f"--suite {path}: datasets[{i}] needs at least 'root' (and 'name', 'metric')")
        root = Path(entry["root"])
        root = root if root.is_absolute() else path.parent / root
        suite.append(
            dataset_entry(
                entry.get("name") or root.name,
                str(root),
                entry.get("metric", "accuracy"),
                f"--suite {path}: datasets[{i}]",
            )
        )
    return suite


def parse_dataset_arg(text: str) -> dict:
    """`--dataset [NAME=]ROOT[:METRIC]`."""
    name, _, rest = text.rpartition("=") if "=" in text else ("", "", text)
    root, metric = rest, "accuracy"
    if ":" in rest and rest.rsplit(":", 1)[1] in METRICS:
        root, metric = rest.rsplit(":", 1)
    return dataset_entry(name or Path(root).name, root, metric, f"--dataset {text}")


def dataset_entry(name: str, root: str, metric: str, where: str) -> dict:
    if metric not in METRICS:
        raise UserError(f"{where}: unknown metric '{metric}'; one of {', '.join(METRICS)}")
    root_path = Path(root)
    has = {split: (root_path / split).is_dir() for split in ("train", "val", "test")}
    if not has["train"] or not (has["val"] or has["test"]):
        raise UserError(f"{where}: {root} must hold a train/ shard directory and a test/ (or val/) one")
    if has["test"]:
        splits = {
            "train": str(root_path / "train"),
            "test": str(root_path / "test"),
            "val": str(root_path / "val") if has["val"] else None,
        }
    else:  # no separate test split: the shipped val split is the test split
        splits = {"train": str(root_path / "train"), "test": str(root_path / "val"), "val": None}
    return {"name": name, "root": root, "metric": metric, "splits": splits}


def run(session, suite: list[dict], reference: str | None = None) -> dict:
    """Every data set of the suite: features on all ranks, the search and fits on rank 0 (others get {})."""
    cfg = session.cfg
    per_dataset = {}
    for entry in suite:
        splits = entry["splits"]
        num_classes = len(dataset_info(splits["train"])["classes"])
        train, test = session.features(splits["train"]), session.features(splits["test"])
        val = session.features(splits["val"]) if splits["val"] else None
        if not session.is_main:
            continue
        if val is None:  # no separate validation split: carve it from train by key
            held = np.array([in_val_split(k, float(cfg.eval.logreg_val_fraction), cfg.train.seed) for k in train.keys])
            rows = np.flatnonzero(~held), np.flatnonzero(held)
            val_rule = f"carved from train ({cfg.eval.logreg_val_fraction:g})"
            train_xy = (train.features.numpy()[rows[0]], train.labels.numpy()[rows[0]])
            val_xy = (train.features.numpy()[rows[1]], train.labels.numpy()[rows[1]])
        else:
            val_rule = "provided"
            train_xy = (train.features.numpy(), train.labels.numpy())
            val_xy = (val.features.numpy(), val.labels.numpy())
        log.info("logistic regression on %s (%d classes, %s)", entry["name"], num_classes, entry["metric"])
        result = evaluate_dataset(
            train_xy,
            val_xy,
            (test.features.numpy(), test.labels.numpy()),
            entry["metric"],
            num_classes,
            int(cfg.eval.logreg_max_iter),
            cfg.train.seed,
        )
        per_dataset[entry["name"]] = {
            **result,
            "root": entry["root"],
            "validation": val_rule,
            "num_classes": num_classes,
        }
    if not session.is_main:
        return {}
    scores = {name: r["score"] for name, r in per_dataset.items()}
    out = {
        "eval": "logreg",
        **session.describe(),
        "datasets": per_dataset,
        "average": float(np.mean(list(scores.values()))),
    }
    if reference:
        out["reference"] = {"file": str(reference), **compare(scores, read_reference(reference))}
    return out
