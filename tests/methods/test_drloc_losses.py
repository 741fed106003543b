"""DRLoc sampling, targets and losses (Liu et al. 2021, Eq. 1-8) against direct implementations."""

import math

import torch

from scale.methods.drloc import gather_pairs, localization_loss, pool_grid, sample_positions, targets


def test_targets_for_known_pairs():
    pos1 = torch.tensor([[[0, 0], [6, 2], [3, 3]]])
    pos2 = torch.tensor([[[6, 6], [1, 5], [3, 3]]])
    k = 7
    # Eq. 1: (|i-p|/k, |j-h|/k)
    assert torch.allclose(targets(pos1, pos2, k, "l1"), torch.tensor([[[6 / 7, 6 / 7], [5 / 7, 3 / 7], [0, 0]]]))
    # the official code's raw offsets
    assert torch.equal(
        targets(pos1, pos2, k, "l1", normalize=False), torch.tensor([[[6.0, 6.0], [5.0, 3.0], [0.0, 0.0]]])
    )
    # Eq. 3: signed, in [-1, 1]
    assert torch.allclose(targets(pos1, pos2, k, "signed"), torch.tensor([[[-6 / 7, -6 / 7], [5 / 7, -3 / 7], [0, 0]]]))
    # Eq. 4: classes c + k in [0, 2k]
    assert torch.equal(targets(pos1, pos2, k, "ce"), torch.tensor([[[1, 1], [12, 4], [7, 7]]]))


def test_sampling_and_gathering():
    grid = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).view(2, 3, 4, 4)
    pos1, pos2 = sample_positions(2, 4, 10, exhaustive=False)
    assert pos1.shape == (2, 10, 2) and 0 <= int(pos1.min()) and int(pos1.max()) < 4
    pairs = gather_pairs(grid, pos1, pos2)
    assert pairs.shape == (2, 10, 6)
    for b in range(2):
        for n in range(10):
            (i, j), (p, h) = pos1[b, n].tolist(), pos2[b, n].tolist()
            assert torch.equal(pairs[b, n], torch.cat([grid[b, :, i, j], grid[b, :, p, h]]))
    ex1, ex2 = sample_positions(3, 4, 64, exhaustive=True)  # Eq. 8: every cell once, m = k^2
    assert ex1.shape == (3, 16, 2) and ex2.shape == (3, 16, 2)
    assert sorted(map(tuple, ex1[0].tolist())) == [(i, j) for i in range(4) for j in range(4)]


def test_pooling_14_to_7():
    grid = torch.randn(1, 2, 14, 14)
    pooled = pool_grid(grid, 7)
    assert pooled.shape == (1, 2, 7, 7)
    assert torch.allclose(pooled[0, :, 0, 0], grid[0, :, :2, :2].mean(dim=(-1, -2)))
    assert pool_grid(torch.randn(1, 2, 7, 7), 7).shape == (1, 2, 7, 7)


def test_l1_loss_matches_eq2():
    torch.manual_seed(0)
    pred, target = torch.randn(2, 3, 2), torch.rand(2, 3, 2)
    expected = (
        sum(
            abs(pred[b, n, 0] - target[b, n, 0]) + abs(pred[b, n, 1] - target[b, n, 1])
            for b in range(2)
            for n in range(3)
        )
        / 6
    )
    assert torch.allclose(localization_loss(pred, target, 7, "l1"), expected)


def test_ce_loss_matches_eq5():
    torch.manual_seed(1)
    k = 3
    logits = torch.randn(2, 4, 2, 2 * k + 1)
    cls = torch.randint(0, 2 * k + 1, (2, 4, 2))
    total = 0.0
    for b in range(2):
        for n in range(4):
            for axis in range(2):
                row = logits[b, n, axis].tolist()
                lse = math.log(sum(math.exp(x) for x in row))
                total += -(row[cls[b, n, axis]] - lse)
    assert abs(localization_loss(logits, cls, k, "ce").item() - total / 8) < 1e-5


def test_gaussian_loss_matches_eq6():
    torch.manual_seed(2)
    k, alpha = 2, 0.5
    logits = torch.randn(1, 3, 2, 2 * k + 1)
    cls = torch.randint(0, 2 * k + 1, (1, 3, 2))
    total = 0.0
    for n in range(3):
        for axis in range(2):
            row = logits[0, n, axis].tolist()
            z = sum(math.exp(x) for x in row)
            p = [math.exp(x) / z for x in row]
            values = list(range(-k, k + 1))
            mu = sum(pc * c for pc, c in zip(p, values))
            var = sum(pc * (c - mu) ** 2 for pc, c in zip(p, values))
            c = cls[0, n, axis].item() - k
            total += (c - mu) ** 2 / var + alpha * math.log(math.sqrt(var))
    assert abs(localization_loss(logits, cls, k, "gaussian", alpha).item() - total / 3) < 1e-4
