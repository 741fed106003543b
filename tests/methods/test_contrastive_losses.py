"""MoCo v3, SimCLR and BYOL losses against loop implementations of their equations."""

import math

import torch
import torch.nn.functional as F

from scale.methods import distributed
from scale.methods.byol import regression
from scale.methods.mocov3 import contrastive
from scale.methods.simclr import nt_xent


def cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def reference_ctr(q, keys, offset, tau):
    """MoCo v3 Alg. 1: CE(q k^T / tau, labels = arange(N) + offset) * 2 tau, one query at a time."""
    total = 0.0
    for i, qi in enumerate(q.tolist()):
        logits = [cos(qi, k) / tau for k in keys.tolist()]
        lse = math.log(sum(math.exp(x) for x in logits))
        total += lse - logits[i + offset]
    return total / len(q) * 2 * tau


def test_moco_contrastive_matches_alg1():
    torch.manual_seed(0)
    q1, q2, k1, k2 = (torch.randn(5, 4) for _ in range(4))
    loss = contrastive(q1, k2, 0.2) + contrastive(q2, k1, 0.2)
    expected = reference_ctr(q1, k2, 0, 0.2) + reference_ctr(q2, k1, 0, 0.2)
    assert abs(loss.item() - expected) < 1e-5


def test_moco_identical_queries_and_keys():
    tau, n = 0.2, 6
    same = torch.ones(n, 4)  # a collapsed encoder: every logit equal, CE = log N
    assert abs(contrastive(same, same, tau).item() - 2 * tau * math.log(n)) < 1e-5
    orthogonal = torch.eye(n)  # q = k, keys orthonormal: the positive logit is 1/tau, the others 0
    expected = 2 * tau * -math.log(math.exp(1 / tau) / (math.exp(1 / tau) + n - 1))
    assert abs(contrastive(orthogonal, orthogonal, tau).item() - expected) < 1e-5


def test_moco_keys_of_all_ranks_with_offset_labels(monkeypatch):
    torch.manual_seed(1)
    q, k, other_rank_keys = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4)
    # this process plays rank 1 of 2: keys are [rank 0 keys, own keys], own positives at offset 3
    monkeypatch.setattr(distributed, "rank", lambda group: 1)
    monkeypatch.setattr(
        distributed, "all_gather_nograd", lambda t, group: torch.cat([F.normalize(other_rank_keys, dim=1), t])
    )
    loss = contrastive(q, k, 0.2)
    expected = reference_ctr(q, torch.cat([other_rank_keys, k]), 3, 0.2)
    assert abs(loss.item() - expected) < 1e-5


def test_simclr_nt_xent_matches_loop():
    torch.manual_seed(2)
    z1, z2, tau = torch.randn(4, 3), torch.randn(4, 3), 0.5
    loss = nt_xent(z1, z2, tau)
    z = torch.cat([z1, z2]).tolist()
    n = len(z1)
    total = 0.0
    for i in range(2 * n):
        positive = (i + n) % (2 * n)
        denominator = sum(math.exp(cos(z[i], z[j]) / tau) for j in range(2 * n) if j != i)
        total += -math.log(math.exp(cos(z[i], z[positive]) / tau) / denominator)
    assert abs(loss.item() - total / (2 * n)) < 1e-5


def test_byol_regression_is_two_minus_two_cosine():
    torch.manual_seed(3)
    p, z = torch.randn(5, 4), torch.randn(5, 4)
    expected = [2 - 2 * cos(a, b) for a, b in zip(p.tolist(), z.tolist())]
    assert torch.allclose(regression(p, z), torch.tensor(expected), atol=1e-6)
    assert torch.allclose(regression(z * 3, z), torch.zeros(5), atol=1e-6)


def test_mocov2_queue_loss_matches_the_formula_and_the_queue_rolls():
    from scale.methods.mocov2 import queue_contrastive

    torch.manual_seed(0)
    q, k, queue = torch.randn(4, 8), torch.randn(4, 8), torch.nn.functional.normalize(torch.randn(16, 8), dim=1)
    loss = queue_contrastive(q, k, queue, 0.2)
    qn, kn = torch.nn.functional.normalize(q, dim=1), torch.nn.functional.normalize(k, dim=1)
    expected = 0.0
    for i in range(4):  # -log( e^{q.k+/t} / (e^{q.k+/t} + sum_queue e^{q.n/t}) )
        pos = torch.exp(qn[i] @ kn[i] / 0.2)
        neg = torch.exp(queue @ qn[i] / 0.2).sum()
        expected += -torch.log(pos / (pos + neg)) / 4
    assert torch.allclose(loss, expected, atol=1e-5)
