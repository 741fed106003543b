"""Loader: rank split, equal step counts, exact resume across world sizes, workers, resampled mode."""

import torch

from scale.data.factory import build_loader
from scale.data.loader import EpochOrder
from scale.data.spec import LoaderSpec
from tests.data.helpers import good_shards, tiny_cfg


def global_steps(cfg, world: int, state=None, epochs: int = 1, stop_after=None):
    """[(epoch, sorted keys of each global step)] over all ranks of a simulated world, and the final state."""
    loaders = [build_loader(LoaderSpec(cfg, "train", 12, r, world, seed=3)) for r in range(world)]
    if state:
        for ld in loaders:
            ld.load_state_dict(state)
    steps = []
    for _ in range(epochs):
        epoch = loaders[0].epoch
        per_rank = [
            [(epoch, b.keys) for b in ld]
            if stop_after is None
            else [(epoch, b.keys) for _, b in zip(range(stop_after), ld)]
            for ld in loaders
        ]
        for step in zip(*per_rank):
            steps.append((step[0][0], sorted(k for _, keys in step for k in keys)))
        if stop_after is not None:
            break
    assert len({ld.position for ld in loaders}) == 1
    return steps, loaders[0].state_dict()


def test_every_rank_runs_the_same_steps_on_uneven_shards(tmp_path):
    good_shards(tmp_path, [7, 2, 13, 1, 5])  # 28 samples
    cfg = tiny_cfg(tmp_path)
    loaders = [build_loader(LoaderSpec(cfg, "train", 8, r, 4, seed=0)) for r in range(4)]
    counts = [sum(1 for _ in ld) for ld in loaders]
    assert counts == [28 // 8] * 4
    assert all(ld.position == 24 for ld in loaders)


def test_epoch_visits_each_sample_at_most_once_and_rank_slices_partition(tmp_path):
    good_shards(tmp_path, [10, 3, 17, 6])  # 36 samples, 3 steps of 12
    steps, _ = global_steps(tiny_cfg(tmp_path), world=2, epochs=2)
    for epoch in (0, 1):
        keys = [k for e, step in steps if e == epoch for k in step]
        assert len(keys) == 36 and len(set(keys)) == 36
    assert [s for e, s in steps if e == 0] != [s for e, s in steps if e == 1]  # reshuffled per epoch


def test_resume_changes_world_size_without_repeat_or_skip(tmp_path):
    good_shards(tmp_path, [9, 4, 14, 11])  # 38 samples: 3 steps of 12, 2 dropped per epoch
    cfg = tiny_cfg(tmp_path)
    full, _ = global_steps(cfg, world=2, epochs=2)
    head, state = global_steps(cfg, world=2, stop_after=2)
    assert state["position"] == 24
    for new_world in (1, 4):
        rest, _ = global_steps(cfg, world=new_world, state=state, epochs=2)
        assert head + rest[: len(full) - 2] == full


def test_resumed_batches_are_identical_and_independent_of_workers(tmp_path):
    good_shards(tmp_path, [12, 12])
    cfg = tiny_cfg(tmp_path)
    ref = list(build_loader(LoaderSpec(cfg, "train", 6, 0, 1, seed=1)))
    resumed = build_loader(LoaderSpec(tiny_cfg(tmp_path, workers=2), "train", 6, 0, 1, seed=1))
    resumed.load_state_dict({"position": 12, "global_batch": 6})
    for a, b in zip(ref[2:], resumed):
        assert a.keys == b.keys
        assert all(torch.equal(x, y) for x, y in zip(a.crops, b.crops))
    assert len(ref) == 4


def test_batch_layout_is_view_major_grouped_by_resolution(tmp_path):
    good_shards(tmp_path, [8])
    cfg = tiny_cfg(tmp_path)
    cfg.views.local_sizes, cfg.views.n_local = [8, 12], [3, 1]
    batch = next(iter(build_loader(LoaderSpec(cfg, "train", 4, 0, 1, seed=0))))
    assert batch.views_per_group == [2, 3, 1]
    assert [tuple(c.shape) for c in batch.crops] == [(8, 3, 16, 16), (12, 3, 8, 8), (4, 3, 12, 12)]
    assert batch.crops[0].dtype == torch.float32 and batch.labels.tolist() == [int(k) % 2 for k in batch.keys]


def test_epoch_order_is_a_permutation(tmp_path):
    order = EpochOrder([5, 0, 7, 3], seed=0, epoch=2, window=4)
    assert sorted(order[p] for p in range(15)) == sorted((s, i) for s, n in enumerate([5, 0, 7, 3]) for i in range(n))


def test_resampled_mode_yields_steps_per_epoch_batches(tmp_path):
    good_shards(tmp_path, [5, 9])
    cfg = tiny_cfg(tmp_path, mode="resampled", workers=2)
    ld = build_loader(LoaderSpec(cfg, "train", 4, 1, 2, seed=0, samples_per_epoch=20))
    batches = list(ld)
    assert len(batches) == 5 and ld.position == 20
    assert all(b.batch_size == 2 for b in batches)
