"""DINO and EsViT losses against direct loop implementations of the papers' equations."""

import math

import torch

from scale.methods import esvit
from scale.methods.dino import cross_entropy_pairs, entropy, mse_pairs, pair_mask, teacher_probs, updated_center
from scale.methods.esvit import CenteredSoftmaxRows, match_tokens, region_loss_pairs, split_views
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
            per_image = [
                sum(
                    (p - q) ** 2
                    for p, q in zip(targets[iq * 2 + b].tolist(), softmax_row((student[v * 2 + b] / 0.1).tolist()))
                )
                for b in range(2)
            ]
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


def flat(per_view):
    return torch.cat([t.flatten(0, 1) for t in per_view])


def test_region_loss_matches_the_equation():
    """Mean over pairs (teacher view i, student view v != i) of the mean over images and student tokens j of
    -sum_k P_t^i[j*]_k log P_s^v[j]_k, j* the teacher token of highest cosine similarity; views of 3 and 2 tokens."""
    torch.manual_seed(4)
    batch, k, dim = 2, 5, 6
    s_tokens = [torch.randn(batch, n, dim) for n in (3, 3, 2)]
    t_tokens = [torch.randn(batch, 4, dim) for _ in range(2)]
    s_region = [torch.randn(batch, n, k) for n in (3, 3, 2)]
    t_probs = [torch.softmax(torch.randn(batch, 4, k), -1) for _ in range(2)]
    loss = region_loss_pairs(s_tokens, t_tokens, flat(s_region), flat(t_probs), 0.1)
    pairs = []
    for i in range(2):
        for v in range(3):
            if v == i:
                continue
            total, ns = 0.0, s_tokens[v].shape[1]
            for b in range(batch):
                for j in range(ns):
                    sims = [
                        torch.nn.functional.cosine_similarity(s_tokens[v][b, j], t_tokens[i][b, t], dim=0).item()
                        for t in range(4)
                    ]
                    best = max(range(4), key=lambda t: sims[t])
                    ls = log_softmax_row((s_region[v][b, j] / 0.1).tolist())
                    total += -sum(p * s for p, s in zip(t_probs[i][b, best].tolist(), ls))
            pairs.append(total / (batch * ns))
    assert abs(loss.item() - sum(pairs) / len(pairs)) < 1e-5


def test_split_views():
    grouped = split_views([torch.arange(12).view(6, 2)], [3])
    assert [g[:, 0].tolist() for g in grouped] == [[0, 2], [4, 6], [8, 10]]


def autograd_region_loss(tokens, teacher_tokens, region, probs, temp):
    """The region loss written directly with autograd: one gather and one log-softmax per (teacher, student) pair."""
    terms = []
    for i, v in pair_mask(len(teacher_tokens), len(tokens)).nonzero().tolist():
        match = match_tokens(tokens[v], teacher_tokens[i])
        targets = probs[i].gather(1, match.unsqueeze(-1).expand(-1, -1, probs[i].shape[-1]))
        log_ps = torch.log_softmax(region[v].float() / temp, dim=-1)
        terms.append(-(targets * log_ps).sum(-1).mean())
    return torch.stack(terms).mean()


def region_inputs(dtype):
    """2 global views of 4 tokens and 3 local views of 2 tokens, batch 2, 7 classes."""
    torch.manual_seed(6)
    tokens = [torch.randn(2, n, 3) for n in (4, 4, 2, 2, 2)]
    region = [torch.randn(2, n, 7).to(dtype).requires_grad_() for n in (4, 4, 2, 2, 2)]
    probs = [torch.softmax(torch.randn(2, 4, 7), -1) for _ in range(2)]
    return tokens, region, probs


def test_region_loss_and_gradient_match_autograd(monkeypatch):
    monkeypatch.setattr(esvit, "chunk_rows", lambda classes: 3)  # chunks that cut across images and views
    # weighted by 2.5 in the total: a gradient formed for another weight (1.0) or for that one (2.5)
    for dtype, tol, grad_weight in (
        (torch.float32, 1e-6, 1.0),
        (torch.float32, 1e-6, 2.5),
        (torch.bfloat16, 1e-2, 2.5),
    ):
        tokens, region, probs = region_inputs(dtype)
        loss = region_loss_pairs(tokens, tokens[:2], flat(region), flat(probs), 0.1, grad_weight=grad_weight)
        grads = torch.autograd.grad(2.5 * loss, region)
        expected = autograd_region_loss(tokens, tokens[:2], region, probs, 0.1)
        expected_grads = torch.autograd.grad(2.5 * expected, region)
        assert torch.allclose(loss, expected, atol=1e-6)
        for g, e in zip(grads, expected_grads):
            assert g.dtype == dtype and torch.allclose(g.float(), e.float(), atol=tol, rtol=tol)


def test_region_loss_keeps_its_gradient_in_the_logits_storage():
    tokens, region, probs = region_inputs(torch.bfloat16)
    logits, saved = flat(region), []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        region_loss_pairs(tokens, tokens[:2], logits, flat(probs), 0.1)
    assert len(saved) == 1 and saved[0].data_ptr() == logits.data_ptr()  # nothing else kept, nothing allocated


def test_centered_softmax_rows_are_the_teacher_targets(monkeypatch):
    monkeypatch.setattr(esvit, "chunk_rows", lambda classes: 4)  # the normalisers computed over 3 chunks
    torch.manual_seed(7)
    logits, center = torch.randn(10, 7).to(torch.bfloat16), torch.randn(1, 7)
    targets = CenteredSoftmaxRows(logits, center, 0.04)
    index = torch.tensor([9, 0, 4, 4])
    rows = targets(index, torch.empty(4, 7))
    assert torch.allclose(rows, teacher_probs(logits, center, 0.04)[index], atol=1e-6)
    assert torch.allclose(targets.logit_sum, logits.float().sum(0, keepdim=True), atol=1e-5)
