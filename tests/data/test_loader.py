"""Loader: rank split, equal step counts, exact resume across world sizes, workers, resampled mode."""

import math
from collections import Counter

import pytest
import torch

from scale.data.factory import build_loader
from scale.data.loader import EpochOrder, repeated_slot
from scale.data.spec import LoaderSpec
from scale.errors import UserError
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


# ---------------------------------------------------------------------------------------------------- repeated augmentation


def deit_rasampler(n: int, world: int, rank: int, epoch: int) -> list[int]:
    """DeiT's RASampler.__iter__ (facebookresearch/deit ab57153 samplers.py:29-53), as written there."""
    num_samples = int(math.ceil(n * 3.0 / world))
    total_size = num_samples * world
    num_selected_samples = int(math.floor(n // 256 * 256 / world))
    g = torch.Generator()
    g.manual_seed(epoch)
    indices = torch.randperm(n, generator=g).tolist()
    indices = [ele for ele in indices for i in range(3)]
    indices += indices[: (total_size - len(indices))]
    indices = indices[rank:total_size:world]
    return indices[:num_selected_samples]


def test_repeated_order_gives_deit_rasampler_global_batches():
    """Same permutation in, the same global batches out as DeiT's RASampler (per-rank batch b, drop_last), with the
    copies of an image on different ranks."""
    n, world, local = 1100, 8, 16  # 1100 // 256 * 256 = 1024 samples per epoch: 8 steps of 128
    global_batch = world * local
    for epoch in (0, 1):
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(epoch)).tolist()
        ranks = [deit_rasampler(n, world, r, epoch) for r in range(world)]
        steps = len(ranks[0]) // local
        assert steps == (n // 256 * 256) // global_batch
        for s in range(steps):
            deit = sorted(i for r in ranks for i in r[s * local : (s + 1) * local])
            ours = [
                perm[repeated_slot(p, 3, global_batch) // 3] for p in range(s * global_batch, (s + 1) * global_batch)
            ]
            assert sorted(ours) == deit
            for r in range(world):  # scale's rank slice r holds no two copies of one image
                mine = ours[r * local : (r + 1) * local]
                assert len(set(mine)) == len(mine)


def test_repeated_slot_is_a_permutation_of_each_global_batch():
    for repeats, global_batch in [(3, 12), (3, 10), (2, 7), (3, 1)]:
        for step in range(4):
            slots = [
                repeated_slot(p, repeats, global_batch) for p in range(step * global_batch, (step + 1) * global_batch)
            ]
            assert sorted(slots) == list(range(step * global_batch, (step + 1) * global_batch))


def test_repeated_aug_reads_each_image_three_times_and_resumes_at_any_world_size(tmp_path):
    good_shards(tmp_path, [9, 4, 14, 11])  # 38 samples: 3 steps of 12, 36 positions, 12 images x 3 per epoch
    cfg = tiny_cfg(tmp_path, repeated_aug=3, shuffle_buffer=64)
    full, _ = global_steps(cfg, world=2, epochs=2)
    for epoch in (0, 1):
        keys = Counter(k for e, step in full if e == epoch for k in step)
        assert len(keys) == 12 and set(keys.values()) == {3}
    assert {k for e, s in full if e == 0 for k in s} != {k for e, s in full if e == 1 for k in s}
    head, state = global_steps(cfg, world=2, stop_after=2)
    for new_world in (1, 4):
        rest, _ = global_steps(cfg, world=new_world, state=state, epochs=2)
        assert head + rest[: len(full) - 2] == full


def test_repeated_copies_are_augmented_independently(tmp_path):
    good_shards(tmp_path, [12])
    loader = build_loader(LoaderSpec(tiny_cfg(tmp_path, repeated_aug=3), "train", 12, 0, 1, seed=0))
    batch = next(iter(loader))
    crops = batch.crops[0][: len(batch.keys)]  # the first global view of each sample
    rows = [i for i, k in enumerate(batch.keys) if k == batch.keys[0]]
    assert len(rows) == 3
    assert not torch.equal(crops[rows[0]], crops[rows[1]]) and not torch.equal(crops[rows[1]], crops[rows[2]])


def test_repeated_aug_is_training_only(tmp_path):
    good_shards(tmp_path, [12])
    cfg = tiny_cfg(tmp_path, repeated_aug=3)
    keys = next(iter(build_loader(LoaderSpec(cfg, "val", 12, 0, 1, seed=0)))).keys
    assert len(set(keys)) == 12


def test_repeated_aug_needs_the_epoch_order(tmp_path):
    good_shards(tmp_path, [12])
    cfg = tiny_cfg(tmp_path, repeated_aug=3, mode="resampled")
    with pytest.raises(UserError, match="data.repeated_aug=3 needs data.mode=epochs"):
        build_loader(LoaderSpec(cfg, "train", 12, 0, 1, seed=0))
