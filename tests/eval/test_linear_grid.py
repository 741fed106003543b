"""The linear probe's lr grid: each head trains exactly as a probe run alone with its lr and seed."""

import pytest
import torch

from scale.errors import UserError
from scale.eval.linear import LinearHeads, in_val_split, run_probe


def make_split(n, generator, offset=0):
    centers = torch.randn(5, 12, generator=torch.Generator().manual_seed(7)) * 1.5
    labels = torch.randint(0, 5, (n,), generator=generator)
    feats = centers[labels] + torch.randn(n, 12, generator=generator) * 1.5
    keys = [f"{offset + i:09d}" for i in range(n)]
    return feats, labels, keys


def batches_of(split, size, epoch=0):
    feats, labels, keys = split
    order = torch.randperm(len(keys), generator=torch.Generator().manual_seed(epoch))  # differs per epoch
    for start in range(0, len(keys) - size + 1, size):  # drops the tail, as the training loader does
        rows = order[start : start + size]
        yield feats[rows], labels[rows], [keys[i] for i in rows]


def probe(lrs, train, test, epochs=4, seed=3):
    heads = LinearHeads(12, 5, len(lrs), seed=seed)
    result = run_probe(
        heads,
        lrs,
        epochs,
        lambda e: batches_of(train, 32, e),
        lambda: batches_of(train, 50),
        lambda: batches_of(test, 20),
        val_fraction=0.2,
        seed=seed,
    )
    return heads, result


def test_grid_heads_equal_separate_runs():
    g = torch.Generator().manual_seed(0)
    train, test = make_split(400, g), make_split(100, g, offset=400)
    lrs = [0.001, 0.03, 1.0]
    heads, grid = probe(lrs, train, test)
    for i, lr in enumerate(lrs):
        alone_heads, alone = probe([lr], train, test)
        assert torch.allclose(heads.heads[i].weight, alone_heads.heads[0].weight, atol=1e-6)
        assert torch.allclose(heads.heads[i].bias, alone_heads.heads[0].bias, atol=1e-6)
        assert grid["val_top1"][i] == pytest.approx(alone["val_top1"][0])
        assert grid["test_top1_all"][i] == pytest.approx(alone["top1"])
    best = max(range(len(lrs)), key=lambda i: grid["val_top1"][i])
    assert grid["best_lr"] == lrs[best]
    assert grid["top1"] == grid["test_top1_all"][best]
    assert grid["val_top1"][0] < grid["val_top1"][best]  # lr 1e-3 barely moves in 4 epochs: the grid matters
    assert grid["top1"] > 60.0


def test_validation_rows_never_train_and_are_the_only_ones_scored():
    g = torch.Generator().manual_seed(1)
    train, test = make_split(300, g), make_split(50, g, offset=300)
    _, result = probe([0.1], train, test, epochs=1)
    expected_val = sum(in_val_split(k, 0.2, 3) for k in train[2][:300])
    assert result["val_samples"] == expected_val
    assert 0 < expected_val < 300
    assert result["test_samples"] == 40  # 2 full batches of 20 from 50 test rows


def test_training_ignores_the_validation_rows():
    """Changing the labels of validation rows leaves the trained heads unchanged."""
    g = torch.Generator().manual_seed(2)
    train, test = make_split(200, g), make_split(40, g, offset=200)
    heads_a, _ = probe([0.1], train, test, epochs=2)
    feats, labels, keys = train
    scrambled = labels.clone()
    for i, key in enumerate(keys):
        if in_val_split(key, 0.2, 3):
            scrambled[i] = (labels[i] + 1) % 5
    heads_b, _ = probe([0.1], (feats, scrambled, keys), test, epochs=2)
    assert torch.allclose(heads_a.heads[0].weight, heads_b.heads[0].weight)


def test_bad_grid_and_split_are_user_errors():
    g = torch.Generator().manual_seed(3)
    train = make_split(40, g)
    with pytest.raises(UserError, match="linear_lrs"):
        run_probe(LinearHeads(12, 5, 1), [-1.0], 1, lambda e: [], lambda: [], lambda: [], 0.2)
    with pytest.raises(UserError, match="val_fraction"):
        run_probe(LinearHeads(12, 5, 1), [0.1], 1, lambda e: batches_of(train, 8), lambda: [], lambda: [], 0.0)
