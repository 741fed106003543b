"""Two gloo ranks give the numbers of one process: the k-NN monitor and the linear probe's lr grid."""

import pytest
import torch
import torch.distributed as dist

from scale.eval.linear import LinearHeads, run_probe
from scale.loop.knn_monitor import KnnMonitor
from tests.engine.engine_toy import spawn

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out


def stream(seed, steps, batch, classes=4, dim=8):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(classes, dim, generator=torch.Generator().manual_seed(99)) * 2
    out = []
    for step in range(steps):
        labels = torch.randint(0, classes, (batch,), generator=g)
        keys = [f"{step * batch + i:09d}" for i in range(batch)]
        out.append((centers[labels] + 1.5 * torch.randn(batch, dim, generator=g), labels, keys))
    return out


def halves(batches, rank, world):
    """This rank's slice of every global batch, as the training loader splits it."""
    size = batches[0][0].shape[0] // world
    return [
        (f[rank * size : (rank + 1) * size], l[rank * size : (rank + 1) * size], k[rank * size : (rank + 1) * size])
        for f, l, k in batches
    ]


def monitor_run(batches, group=None):
    monitor = KnnMonitor(24, 8, 4, k=5, group=group)
    accuracies = []
    for step, (feats, labels, _) in enumerate(batches):
        monitor.update(feats, labels)
        if step % 2 == 1:
            accuracies.append(monitor.accuracy())
    return accuracies, monitor


def probe_run(train, test):
    heads = LinearHeads(8, 4, 2, seed=1)
    result = run_probe(heads, [0.05, 0.5], 3, lambda epoch: train, lambda: train, lambda: test, val_fraction=0.25)
    return result, heads


def two_rank_job(data) -> dict:
    rank = dist.get_rank()
    accuracies, monitor = monitor_run(halves(data["monitor"], rank, 2), dist.group.WORLD)
    result, heads = probe_run(halves(data["train"], rank, 2), halves(data["test"], rank, 2))
    return {"acc": accuracies, "queue": monitor.features, "probe": result, "weight": heads.heads[1].weight.detach()}


def test_two_ranks_equal_one_process(tmp_path):
    data = {"monitor": stream(0, 6, 10), "train": stream(1, 8, 16), "test": stream(2, 3, 10)}
    accuracies, monitor = monitor_run(data["monitor"])
    result, heads = probe_run(data["train"], data["test"])
    two = spawn(two_rank_job, data, tmp_path=tmp_path)
    # each rank scores its half against the shared queue; both halves are enqueued in rank order
    assert two["acc"] == pytest.approx(accuracies)
    assert torch.allclose(two["queue"], monitor.features)
    # gradients summed over ranks, loss normalised by the global row count: the same heads as one process
    assert torch.allclose(two["weight"], heads.heads[1].weight, atol=1e-5)
    for key in ("val_top1", "test_top1_all", "train_loss"):
        assert two["probe"][key] == pytest.approx(result[key], abs=1e-4)
    assert two["probe"]["val_samples"] == result["val_samples"]
