"""DINO and EsViT losses against direct loop implementations of the papers' equations."""

import math

import torch

from scale.methods.dino import (cross_entropy_pairs, entropy, mse_pairs, pair_mask, teacher_probs,
                                updated_center)
from scale.methods.esvit import match_tokens, region_cross_entropy, region_loss_pairs, split_views
from scale.methods.sinkhorn import sinkhorn_knopp


def log_softmax_row(row):
    m = max(row)
    lse = m + math.log(sum(math.exp(x - m) for x in row))
    return [x - lse for x in row]


def softmax_row(row):
    return [math.exp(x) for x in log_softmax_row(row)]


def reference_dino(student, teacher, center, ts, tt, n_teacher, n_student):
    """DINO paper Eq. 3 with multi-crop, one image and one pair at a time."""
    batch = teacher.shape[0] // n_teacher
    total, pairs = 0.0, 0
    for iq in range(n_teacher):
        for v in range(n_student):
            if v == iq:
                continue
            loss = 0.0
            for b in range(batch):
                t_row = [(x - c) / tt for x, c in zip(teacher[iq * batch + b].tolist(), center.tolist())]
                pt = softmax_row(t_row)
                ls = log_softmax_row([x / ts for x in student[v * batch + b].tolist()])
                loss += -sum(p * s for p, s in zip(pt, ls))
            total += loss / batch
            pairs += 1
    return total / pairs


def test_dino_cross_entropy_matches_the_equation():
    torch.manual_seed(0)
    n_teacher, n_student, batch, k = 2, 5, 3, 7
    student = torch.randn(n_student * batch, k)
    teacher = torch.randn(n_teacher * batch, k)
    center = torch.randn(k) * 0.1
    targets = teacher_probs(teacher, center, 0.04)
    loss = cross_entropy_pairs(student, targets, 0.1, n_teacher, n_student)
    expected = reference_dino(student, teacher, center, 0.1, 0.04, n_teacher, n_student)
    assert abs(loss.item() - expected) < 1e-4 * max(1, abs(expected))
    assert pair_mask(2, 5).sum() == 2 * 5 - 2  # the official count of loss terms


def test_uniform_teacher_and_student_give_log_k():
    k = 16
    teacher = torch.zeros(4, k)
    targets = teacher_probs(teacher, torch.zeros(k), 0.04)
    loss = cross_entropy_pairs(torch.zeros(6, k), targets, 0.1, 2, 3)
    assert abs(loss.item() - math.log(k)) < 1e-5
    assert abs(entropy(targets).item() - math.log(k)) < 1e-5  # h = log K and KL = 0: DINO Fig. 7's collapse


def test_center_is_an_ema_of_the_teacher_mean():
    center = torch.ones(1, 3)
    teacher = torch.tensor([[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]])
    new = updated_center(center, teacher, 0.9)
    assert torch.allclose(new, 0.9 * center + 0.1 * torch.tensor([[2.0, 3.0, 4.0]]))


def test_mse_variant_matches_loop():
    torch.manual_seed(1)
    student, teacher = torch.randn(6, 5), torch.randn(4, 5)
    targets = teacher_probs(teacher, torch.zeros(5), 0.05)
    loss = mse_pairs(student, targets, 0.1, 2, 3)
    total, pairs = 0.0, 0
    for iq in range(2):
        for v in range(3):
            if v == iq:
                continue
            per_image = [sum((p - q) ** 2 for p, q in zip(targets[iq * 2 + b].tolist(),
                                                           softmax_row((student[v * 2 + b] / 0.1).tolist())))
                         for b in range(2)]
            total += sum(per_image) / 2
            pairs += 1
    assert abs(loss.item() - total / pairs) < 1e-6


def test_sinkhorn_knopp_equipartition_and_reference():
    torch.manual_seed(2)
    scores = torch.randn(12, 4)
    q = sinkhorn_knopp(scores, epsilon=0.5, iterations=3)
    # direct SwAV Algorithm: Q = exp(S/eps)^T, alternate row / column normalisation
    ref = torch.exp(scores.double() / 0.5).t()
    ref /= ref.sum()
    for _ in range(3):
        ref /= ref.sum(dim=1, keepdim=True) * 4
        ref /= ref.sum(dim=0, keepdim=True) * 12
    assert torch.allclose(q.double(), (ref * 12).t(), atol=1e-6)
    assert torch.allclose(q.sum(dim=1), torch.ones(12), atol=1e-5)  # each sample's code is a distribution
    many = sinkhorn_knopp(scores, epsilon=0.5, iterations=200)
    assert torch.allclose(many.sum(dim=0), torch.full((4,), 3.0), atol=1e-3)  # prototypes used equally


def test_sinkhorn_targets_in_dino():
    teacher = torch.randn(8, 6)
    targets = teacher_probs(teacher, None, 0.1, sinkhorn_iters=3)
    assert torch.allclose(targets.sum(-1), torch.ones(8), atol=1e-5)


def test_esvit_matching_picks_the_most_similar_token():
    torch.manual_seed(3)
    teacher = torch.randn(2, 5, 8)
    perm = torch.tensor([[4, 0, 3, 1, 2, 2], [1, 1, 0, 4, 3, 2]])
    # student token j = a positive rescaling of teacher token perm[j] plus small noise: cosine picks perm[j]
    student = torch.stack([teacher[b, perm[b]] for b in range(2)]) * 3.0 + 0.01 * torch.randn(2, 6, 8)
    assert torch.equal(match_tokens(student, teacher), perm)


def test_region_loss_matches_the_equation():
    torch.manual_seed(4)
    batch, ns, nt, k, dim = 2, 3, 4, 5, 6
    s_tokens, t_tokens = torch.randn(batch, ns, dim), torch.randn(batch, nt, dim)
    s_region = torch.randn(batch, ns, k)
    t_probs = torch.softmax(torch.randn(batch, nt, k), -1)
    loss = region_cross_entropy(s_region, t_probs, match_tokens(s_tokens, t_tokens), 0.1)
    total = 0.0
    for b in range(batch):
        for j in range(ns):
            sims = [torch.nn.functional.cosine_similarity(s_tokens[b, j], t_tokens[b, i], dim=0).item()
                    for i in range(nt)]
            best = max(range(nt), key=lambda i: sims[i])
            ls = log_softmax_row((s_region[b, j] / 0.1).tolist())
            total += -sum(p * s for p, s in zip(t_probs[b, best].tolist(), ls))
    assert abs(loss.item() - total / (batch * ns)) < 1e-5


def test_region_loss_over_view_pairs():
    torch.manual_seed(5)
    views = [torch.randn(2, 4, 3) for _ in range(3)]
    region = [torch.randn(2, 4, 5) for _ in range(3)]
    probs = [torch.softmax(torch.randn(2, 4, 5), -1) for _ in range(2)]
    loss = region_loss_pairs(views, views[:2], region, probs, 0.1)
    pairs = [(0, 1), (0, 2), (1, 0), (1, 2)]
    expected = sum(region_cross_entropy(region[v], probs[i], match_tokens(views[v], views[i]), 0.1)
                   for i, v in pairs) / 4
    assert torch.allclose(loss, expected)
    grouped = split_views([torch.arange(12).view(6, 2)], [3])
    assert [g[:, 0].tolist() for g in grouped] == [[0, 2], [4, 6], [8, 10]]
