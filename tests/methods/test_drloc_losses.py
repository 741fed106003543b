"""DRLoc sampling, targets and losses (Liu et al. 2021, Eq. 1-8) against direct implementations."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from scale.methods.config import DrlocConfig
from scale.methods.drloc import gather_pairs, lambda_at, localization_loss, pool_grid, sample_positions, targets
from scale.models.heads import DrlocHead


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


# --- the official code (yhlleo/VTs-Drloc), hand-computed -------------------------------------------------------------


def test_official_l1_averages_over_u_and_v():
    """drloc/losses.py: F.l1_loss(deltaxy, predxy), the mean over pairs *and* axes: half of Eq. 2's |.|_1."""
    pred = torch.tensor([[[1.0, 2.0], [0.5, -1.0]]])
    target = torch.tensor([[[0.0, 0.0], [1.0, 1.0]]])
    # errors 1, 2, 0.5, 2: official mean 5.5 / 4; Eq. 2: (3 + 2.5) / 2 pairs
    assert localization_loss(pred, target, 7, "l1", l1_reduction="mean").item() == pytest.approx(1.375)
    assert localization_loss(pred, target, 7, "l1", l1_reduction="sum").item() == pytest.approx(2.75)


def test_official_use_abs_targets_are_raw_absolute_offsets():
    """aux_modules.py with --use_abs: |pxs - pys|, not normalised; ce/cbr classes are these integers."""
    pos1, pos2 = torch.tensor([[[0, 6], [2, 2]]]), torch.tensor([[[5, 1], [4, 2]]])
    assert torch.equal(targets(pos1, pos2, 7, "ce", use_abs=True), torch.tensor([[[5, 5], [2, 0]]]))
    assert torch.equal(targets(pos1, pos2, 7, "l1", normalize=False), torch.tensor([[[5.0, 5.0], [2.0, 0.0]]]))


def _official_cbr(logits_x, logits_y, target_x, target_y, lambda_var=0.001):
    """relative_constraint_cbr + variance_aware_regression of drloc/losses.py, written out in plain Python."""
    total = 0.0
    for logits, target in ((logits_x, target_x), (logits_y, target_y)):
        terms = []
        for row, t in zip(logits, target):
            z = sum(math.exp(v) for v in row)
            beta = [math.exp(v) / z for v in row]
            pred = sum(b * c for c, b in enumerate(beta))
            var = sum(b * (c - pred) ** 2 for c, b in enumerate(beta)) + 1e-8
            log_var = math.log(var)
            terms.append(math.exp(-log_var) * (pred - t) ** 2 + lambda_var * log_var)
        total += sum(terms) / len(terms)
    return total


@pytest.mark.parametrize("use_abs", [True, False])
def test_official_gaussian_variant_weights_log_sigma_squared(use_abs):
    torch.manual_seed(3)
    k, m = 7, 5
    classes = k if use_abs else 2 * k + 1
    logits = torch.randn(1, m, 2, classes)
    index = torch.randint(0, classes, (1, m, 2))
    x, y = index[0, :, 0].tolist(), index[0, :, 1].tolist()
    expected = _official_cbr(logits[0, :, 0].tolist(), logits[0, :, 1].tolist(), x, y)
    ours = localization_loss(logits, index, k, "gaussian", 0.001, gaussian_log="variance", use_abs=use_abs)
    assert ours.item() == pytest.approx(expected, rel=1e-5)
    paper = localization_loss(logits, index, k, "gaussian", 0.001, gaussian_log="sigma", use_abs=use_abs)
    assert paper.item() != pytest.approx(expected, rel=1e-5)


def test_official_lambda_ramp():
    """main.py _weight_decay(0.5, epoch, 20, 300): 0 at epoch 0, 0.5 at 20, then linear towards 0 at 300."""
    ramp = OmegaConf.structured(DrlocConfig(weight=0.5))
    assert [lambda_at(ramp, e) for e in (0, 10, 20)] == pytest.approx([0.0, 0.25, 0.5])
    assert lambda_at(ramp, 100) == pytest.approx(0.5 * (1 - 80 / 280))
    constant = OmegaConf.structured(DrlocConfig(weight=0.5, weight_schedule="constant"))
    assert lambda_at(constant, 0) == lambda_at(constant, 100) == 0.5


def test_official_3x3_stride_2_pooling_of_14x14_grids():
    """T2T/CvT: nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False) takes 14 x 14 to 7 x 7."""
    grid = torch.randn(1, 2, 14, 14)
    pooled = pool_grid(grid, 7, "avg3x3s2")
    assert pooled.shape == (1, 2, 7, 7)
    assert torch.allclose(pooled[0, :, 0, 0], grid[0, :, :2, :2].mean(dim=(-1, -2)))  # padding not counted
    assert torch.allclose(pooled[0, :, 1, 1], grid[0, :, 1:4, 1:4].mean(dim=(-1, -2)))  # windows overlap
    assert torch.equal(pool_grid(grid[..., :7, :7], 7, "avg3x3s2"), grid[..., :7, :7])


def test_official_pooling_runs_on_nchw_memory_whatever_the_token_grid_layout(monkeypatch):
    """token_grid's [B, D, h, w] is a channels-last view; torch 2.11's CUDA avg_pool2d backward is wrong for
    channels-last inputs with padding (pytorch#188344), so the official pooling must see NCHW memory."""
    import torch.nn.functional as F

    from scale.methods.nets import token_grid

    seen, pool = [], F.avg_pool2d
    monkeypatch.setattr(F, "avg_pool2d", lambda x, *a, **kw: seen.append(x.is_contiguous()) or pool(x, *a, **kw))
    tokens = torch.randn(2, 16, 3, requires_grad=True)
    grid = token_grid({"tokens": tokens, "grid": (4, 4)})
    assert grid.is_contiguous(memory_format=torch.channels_last) and not grid.is_contiguous()
    pooled = pool_grid(grid, 2, "avg3x3s2")
    assert seen == [True]
    expected = pool(grid.detach().contiguous(), 3, stride=2, padding=1, count_include_pad=False)
    assert torch.equal(pooled.detach(), expected)


def test_official_class_head_has_a_third_linear():
    """aux_modules.py ce/cbr: Linear(2C,512) ReLU Linear(512,512) ReLU Linear(512,512), then two Linear(512,K)."""

    def linears(head):
        return [(m.in_features, m.out_features) for m in head.modules() if isinstance(m, torch.nn.Linear)]

    assert linears(DrlocHead(16, 512, 7, extra_linear=True)) == [(32, 512), (512, 512), (512, 512), (512, 7), (512, 7)]
    assert linears(DrlocHead(16, 512, 7)) == [(32, 512), (512, 512), (512, 7), (512, 7)]
    assert linears(DrlocHead(16, 512, None, extra_linear=True)) == [(32, 512), (512, 512), (512, 2)]
