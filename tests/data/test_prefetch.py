"""scale.data.prefetch: skipped off CUDA; the prefetcher's position bookkeeping (its copy replaced by the identity)
resumes exactly where a plain loader does; pinned batches on CUDA only."""

import torch
from omegaconf import OmegaConf
from torch.utils.data._utils.pin_memory import pin_memory as dataloader_pin

import scale.data.loader as loader_module
from scale.data.batch import Batch
from scale.data.factory import build_loader
from scale.data.prefetch import DevicePrefetcher, prefetch_to_device
from scale.data.spec import LoaderSpec
from scale.engine.parallel import ParallelContext
from scale.loop.train import train_loader
from tests.data.helpers import good_shards, tiny_cfg

GLOBAL_BATCH = 4  # 18 samples: 4 steps per epoch


def loader(tmp_path):
    if not (tmp_path / "_info.json").exists():
        good_shards(tmp_path, [7, 11])
    return build_loader(LoaderSpec(tiny_cfg(tmp_path), "train", GLOBAL_BATCH, 0, 1, seed=5))


def identity(batch: Batch):
    return lambda: batch


def same(a: Batch, b: Batch) -> bool:
    return a.keys == b.keys and torch.equal(a.labels, b.labels) and all(map(torch.equal, a.crops, b.crops))


def test_the_path_is_skipped_off_cuda_when_switched_off_and_for_loaders_that_read_ahead(tmp_path):
    plain = loader(tmp_path)
    assert prefetch_to_device(plain, torch.device("cpu"), True, lambda b: None) is plain
    assert prefetch_to_device(plain, torch.device("cuda"), False, lambda b: None) is plain
    plain.reads_ahead = True  # as DALI's loader
    assert prefetch_to_device(plain, torch.device("cuda"), True, lambda b: None) is plain


def test_prefetched_batches_count_as_consumed_only_once_yielded(tmp_path):
    plain = loader(tmp_path)
    reference = [b for _ in range(2) for b in plain]  # two epochs, no prefetch
    inner, checked = loader(tmp_path), []
    prefetcher = DevicePrefetcher(inner, identity, checked.append)
    batches = (b for _ in range(2) for b in prefetcher)
    for consumed in range(1, 7):  # through the epoch boundary (4 steps per epoch)
        assert same(next(batches), reference[consumed - 1])
        ahead = consumed % 4 != 0  # the last batch of an epoch has none ahead
        assert len(checked) == consumed + ahead  # the next batch was taken (and checked) before this one came
        assert inner.position == (consumed + ahead) * GLOBAL_BATCH
        assert prefetcher.state_dict()["position"] == consumed * GLOBAL_BATCH
        assert prefetcher.counters()["samples"] == consumed * GLOBAL_BATCH
        assert prefetcher.metrics()["data/samples"] == consumed * GLOBAL_BATCH
        resumed = loader(tmp_path)  # a checkpoint written now, resumed without prefetch
        resumed.load_state_dict(prefetcher.state_dict())
        resumed.load_counters(prefetcher.counters())
        assert same(next(b for _ in range(2) for b in resumed), reference[consumed])
        assert resumed.counters()["samples"] == (consumed + 1) * GLOBAL_BATCH


def test_an_iteration_stopped_with_a_batch_ahead_gives_it_back(tmp_path):
    reference = list(loader(tmp_path))
    prefetcher = DevicePrefetcher(loader(tmp_path), identity, lambda b: None)
    first = iter(prefetcher)
    next(first)  # batch 1 is ahead
    assert same(next(iter(prefetcher)), reference[1])
    assert prefetcher.state_dict()["position"] == 2 * GLOBAL_BATCH


def test_train_loader_pins_its_batches_for_cuda_only(tmp_path, monkeypatch):
    good_shards(tmp_path, [7, 11])
    cfg = {"data": tiny_cfg(tmp_path), "train": {"global_batch": GLOBAL_BATCH, "seed": 5, "samples_per_epoch": None}}
    cfg, info = OmegaConf.create(cfg), ParallelContext(0, 1, 0, "127.0.0.1", 0, "single")
    pinned = []
    monkeypatch.setattr(loader_module, "DataLoader", lambda *a, **kw: pinned.append(kw["pin_memory"]) or [])
    for device in ("cpu", "cuda"):
        list(train_loader(cfg, info, torch.device(device)))
    assert pinned == [False, True]


def test_the_dataloader_pins_every_tensor_of_a_batch(tmp_path, monkeypatch):
    batch = next(iter(loader(tmp_path)))
    pinned = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda t, *a, **kw: pinned.append(t) or t.clone())
    out, errors = dataloader_pin((batch, []))  # what DataLoader(pin_memory=True) runs on each (batch, errors)
    assert isinstance(out, Batch) and same(out, batch) and errors == []
    assert {id(t) for t in pinned} == {id(t) for t in (*batch.crops, batch.labels)}
