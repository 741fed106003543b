"""Weighted k-NN and the k-NN monitor against brute-force references written from the formula."""

import pytest
import torch
import torch.nn.functional as F

from scale.errors import UserError
from scale.eval.knn import knn_eval, knn_predict
from scale.loop.knn_monitor import KnnMonitor
from scale.watch.weighted_knn import nearest


def brute_force_votes(train, train_labels, queries, k, temperature, num_classes):
    """Per query: the vote of every class, the sum over the k most similar train rows of exp(cos / T)."""
    train, queries = F.normalize(train, dim=1), F.normalize(queries, dim=1)
    out = []
    for q in queries:
        sims = train @ q
        order = sorted(range(len(sims)), key=lambda i: -float(sims[i]))[:k]
        votes = [0.0] * num_classes
        for i in order:
            votes[int(train_labels[i])] += float(torch.exp(sims[i] / temperature))
        out.append(votes)
    return out


def brute_force_top(train, train_labels, queries, k, temperature, num_classes):
    """Per query: the classes that got votes, best first (classes without votes tie, so their order is free)."""
    return [
        [c for c in sorted(range(num_classes), key=lambda c: -v[c]) if v[c] > 0]
        for v in brute_force_votes(train, train_labels, queries, k, temperature, num_classes)
    ]


def clustered(n, classes, dim, generator, noise=1.0):
    """Noisy points around class centres that depend only on (classes, dim), so train and test share them."""
    centers = torch.randn(classes, dim, generator=torch.Generator().manual_seed(classes * 1000 + dim)) * 2
    labels = torch.randint(0, classes, (n,), generator=generator)
    return centers[labels] + noise * torch.randn(n, dim, generator=generator), labels


def test_nearest_with_small_chunks_equals_full_topk():
    g = torch.Generator().manual_seed(0)
    bank = F.normalize(torch.randn(53, 8, generator=g), dim=1)
    queries = F.normalize(torch.randn(7, 8, generator=g), dim=1)
    sim, idx = nearest(queries, bank, k=12, bank_chunk=5)
    full_sim, full_idx = (queries @ bank.T).topk(12, dim=1)
    assert torch.allclose(sim, full_sim)
    assert torch.equal(idx, full_idx)


@pytest.mark.parametrize("k", [1, 10, 20])
def test_knn_predictions_match_brute_force(k):
    g = torch.Generator().manual_seed(1)
    train, train_labels = clustered(120, 6, 16, g, noise=2.0)
    test, _ = clustered(30, 6, 16, g, noise=2.0)
    preds = knn_predict(train, train_labels, test, [k], 0.07, 6, query_chunk=7, bank_chunk=11)[k]
    reference = brute_force_top(train, train_labels, test, k, 0.07, 6)
    assert preds[:, 0].tolist() == [r[0] for r in reference]
    assert [p[: len(r[:5])] for p, r in zip(preds.tolist(), reference)] == [r[:5] for r in reference]


def test_knn_eval_accuracy_matches_brute_force():
    g = torch.Generator().manual_seed(2)
    train, train_labels = clustered(200, 10, 12, g, noise=2.5)
    test, test_labels = clustered(60, 10, 12, g, noise=2.5)
    result = knn_eval(
        train, train_labels, test, test_labels, [10, 20, 100, 200], 0.07, 10, query_chunk=16, bank_chunk=64
    )
    for k in (10, 20, 100, 200):
        reference = brute_force_top(train, train_labels, test, k, 0.07, 10)
        top1 = 100.0 * sum(r[0] == int(t) for r, t in zip(reference, test_labels)) / len(test_labels)
        votes = brute_force_votes(train, train_labels, test, k, 0.07, 10)
        # a label without votes may fill a top-5 slot among other vote-less classes: bound the count by that
        sure = sum(v[int(t)] > 0 and sum(x > v[int(t)] for x in v) < 5 for v, t in zip(votes, test_labels))
        maybe = sum(v[int(t)] == 0 and sum(x > 0 for x in v) < 5 for v, t in zip(votes, test_labels))
        assert result[k]["top1"] == pytest.approx(top1)
        assert 100.0 * sure / 60 - 1e-9 <= result[k]["top5"] <= 100.0 * (sure + maybe) / 60 + 1e-9
    assert 20.0 < result[20]["top1"] < 100.0  # the data is neither trivial nor hopeless


def test_knn_rejects_unlabelled_and_multilabel():
    feats = torch.randn(4, 3)
    with pytest.raises(UserError, match="unlabelled"):
        knn_eval(feats, torch.tensor([0, 1, -1, 0]), feats, torch.tensor([0, 1, 1, 0]), [2], 0.07, 2)
    with pytest.raises(UserError, match="single-label"):
        knn_eval(feats, torch.zeros(4, 2), feats, torch.tensor([0, 1, 1, 0]), [2], 0.07, 2)


def test_monitor_matches_brute_force_over_a_stream():
    """Each batch is scored against the queue as it was before the batch (the last `size` samples), then enqueued."""
    g = torch.Generator().manual_seed(3)
    size, k, classes = 40, 5, 4
    monitor = KnnMonitor(size, 8, classes, k=k, temperature=0.1)
    history_f, history_l = [], []
    correct = total = 0
    for step in range(9):
        feats, labels = clustered(16, classes, 8, g, noise=1.5)
        labels[0] = -1  # unlabelled rows are ignored
        if history_f:
            bank_f = torch.cat(history_f)[-size:]
            bank_l = torch.cat(history_l)[-size:]
            keep = labels >= 0
            ref = brute_force_top(bank_f, bank_l, feats[keep], k, 0.1, classes)
            correct += sum(r[0] == int(t) for r, t in zip(ref, labels[keep]))
            total += int(keep.sum())
        monitor.update(feats, labels)
        history_f.append(feats[labels >= 0])
        history_l.append(labels[labels >= 0])
        if step in (4, 8):
            assert monitor.accuracy() == pytest.approx(100.0 * correct / total)
            correct = total = 0
    assert monitor.filled == size
    assert monitor.accuracy() is None  # nothing scored since the last call


def test_monitor_keeps_newest_rows_of_an_oversized_batch():
    monitor = KnnMonitor(3, 2, 2, k=1)
    feats = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.1], [0.1, 1.0], [1.0, 0.2]])
    monitor.update(feats, torch.tensor([0, 1, 0, 1, 0]))
    assert monitor.filled == 3
    assert sorted(monitor.labels.tolist()) == [0, 0, 1]


def test_monitor_resumed_from_its_state_reports_what_the_original_does():
    """A checkpoint taken between two accuracy() calls: the queue and the pending counts carry over."""
    g = torch.Generator().manual_seed(4)
    batches = [clustered(12, 3, 8, g, noise=1.5) for _ in range(6)]
    original = KnnMonitor(20, 8, 3, k=5)
    for feats, labels in batches[:3]:
        original.update(feats, labels)
    resumed = KnnMonitor(20, 8, 3, k=5)
    resumed.load_state_dict(original.state_dict())
    for feats, labels in batches[3:]:
        original.update(feats, labels)
        resumed.update(feats, labels)
    accuracy = original.accuracy()
    assert accuracy is not None and resumed.accuracy() == accuracy
    with pytest.raises(UserError, match="knn_monitor_queue"):
        KnnMonitor(30, 8, 3).load_state_dict(original.state_dict())
