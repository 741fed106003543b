"""The logistic-regression transfer protocol: lambda search, metrics, suite bookkeeping."""

import json

import numpy as np
import pytest

from scale.errors import UserError
from scale.eval.logreg import (
    average_precision_11point,
    compare,
    evaluate_dataset,
    parse_dataset_arg,
    read_reference,
    score,
    search_strength,
)


@pytest.mark.parametrize("optimum", [-6.0, -2.625, 0.0, 1.375, 3.875, 6.0])
def test_search_finds_the_peak_of_the_96_step_grid(optimum):
    calls = []

    def val_score(strength):
        calls.append(strength)
        return -((np.log10(strength) - optimum) ** 2)

    best, tried = search_strength(val_score)
    assert np.log10(best) == pytest.approx(optimum)
    assert len(calls) == len(set(calls)) <= 7 + 2 * 4  # 7 starting values, then 2 per halving (4 halvings)
    assert all(-6 <= x <= 6 for x in tried)
    assert {-6.0, -4.0, -2.0, 0.0, 2.0, 4.0, 6.0} <= set(tried)


def test_search_breaks_ties_towards_stronger_regularisation():
    best, _ = search_strength(lambda strength: 1.0 if strength >= 1 else 0.0)
    assert best == pytest.approx(1e6)


def test_11_point_average_precision_by_hand():
    target = np.array([1, 0, 1, 0, 0, 1])
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
    # ranked hits 1,0,1,0,0,1: precision 1, .5, .667, .5, .4, .5; recall 1/3, 1/3, 2/3, 2/3, 2/3, 1
    # recall >= 0, .1, .2, .3 -> max precision 1; .4 .. .6 -> 2/3; .7 .. 1.0 -> 1/2
    expected = (4 * 1.0 + 3 * (2 / 3) + 4 * 0.5) / 11
    assert average_precision_11point(target, scores) == pytest.approx(expected)


def test_metrics():
    labels = np.array([0, 0, 0, 1, 2, 2])
    proba = np.eye(3)[[0, 0, 1, 1, 2, 0]]
    assert score("accuracy", labels, proba) == pytest.approx(100 * 4 / 6)
    assert score("mean_per_class", labels, proba) == pytest.approx(100 * (2 / 3 + 1 + 1 / 2) / 3)
    binary = np.array([0, 1, 1, 0])
    assert score("roc_auc", binary, np.array([[0.9, 0.1], [0.2, 0.8], [0.4, 0.6], [0.3, 0.7]])) == pytest.approx(75.0)
    with pytest.raises(UserError, match="unknown metric"):
        score("f1", labels, proba)


def synthetic(n, generator, dim=40, informative=3):
    """Three classes separated in a few dimensions, buried in many noise dimensions."""
    labels = generator.integers(0, 3, n)
    feats = generator.normal(size=(n, dim))
    feats[:, :informative] += 1.2 * np.eye(3)[labels][:, :informative]
    return feats, labels


def test_evaluate_dataset_picks_an_inner_lambda_and_fits_on_train_plus_val():
    rng = np.random.default_rng(0)
    train, val, test = synthetic(60, rng), synthetic(200, rng), synthetic(300, rng)
    result = evaluate_dataset(train, val, test, "accuracy", 3)
    assert result["samples"] == {"train": 60, "val": 200, "test": 300}
    assert -6 < result["best_log10_lambda"] < 6  # 60 samples in 40-d: neither no nor infinite regularisation
    val_scores = {float(k): v for k, v in result["val_scores"].items()}
    assert val_scores[result["best_log10_lambda"]] == max(val_scores.values())
    assert val_scores[-6.0] < max(val_scores.values()) and val_scores[6.0] < max(val_scores.values())
    assert result["score"] > 55.0  # chance is 33%


def test_reference_and_wins(tmp_path):
    ours = {"a": 80.0, "b": 50.0, "c": 70.0}
    ref_file = tmp_path / "ref.json"
    ref_file.write_text(json.dumps({"datasets": {"a": {"score": 75.0}, "b": {"score": 60.0}}}))
    result = compare(ours, read_reference(ref_file))
    assert result["wins"] == 1 and result["compared"] == 2
    assert result["reference_average"] == pytest.approx(67.5)
    assert result["missing_in_reference"] == ["c"]
    ref_file.write_text(json.dumps({"a": "high"}))
    with pytest.raises(UserError, match="expected"):
        read_reference(ref_file)


def test_dataset_argument_rules(tmp_path):
    for split in ("train", "val"):
        (tmp_path / "pets" / split).mkdir(parents=True)
    entry = parse_dataset_arg(f"pets={tmp_path / 'pets'}:mean_per_class")
    assert entry["name"] == "pets" and entry["metric"] == "mean_per_class"
    assert entry["splits"] == {
        "train": str(tmp_path / "pets" / "train"),
        "test": str(tmp_path / "pets" / "val"),
        "val": None,
    }  # val is the test split; validation is carved from train
    (tmp_path / "pets" / "test").mkdir()
    assert parse_dataset_arg(str(tmp_path / "pets"))["splits"]["val"] == str(tmp_path / "pets" / "val")
    with pytest.raises(UserError, match="train/"):
        parse_dataset_arg(str(tmp_path / "nothing"))


def test_suite_file(tmp_path):
    from scale.eval.logreg import read_suite

    for split in ("train", "test"):
        (tmp_path / "voc" / split).mkdir(parents=True)
    suite = tmp_path / "suite.yaml"
    suite.write_text("datasets:\n  - {name: voc2007, root: voc, metric: map_11point}\n")
    [entry] = read_suite(suite)
    assert entry["name"] == "voc2007" and entry["metric"] == "map_11point"
    assert entry["splits"]["test"] == str(tmp_path / "voc" / "test") and entry["splits"]["val"] is None
    suite.write_text("datasets:\n  - {root: voc, metric: top1}\n")
    with pytest.raises(UserError, match="unknown metric 'top1'"):
        read_suite(suite)
