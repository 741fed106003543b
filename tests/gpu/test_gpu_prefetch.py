"""The CUDA side of scale.data.prefetch: pinned batches, copied ahead on a side stream, arrive on the device equal to
the loader's, and the prefetcher's position counts only the batches it yielded."""

import pytest
import torch
from gpu_env import require_cuda

from scale.data.factory import build_loader
from scale.data.prefetch import DevicePrefetcher, prefetch_to_device
from tests.data.helpers import good_shards, tiny_cfg

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def test_prefetched_batches_arrive_on_the_device_equal_to_the_loaders(tmp_path):
    require_cuda("a side-stream copy from pinned memory")
    good_shards(tmp_path, [7, 11])

    def loader(pin: bool):
        return build_loader(tiny_cfg(tmp_path), "train", 4, 0, 1, seed=5, pin_memory=pin)

    reference = list(loader(False))
    pinned = loader(True)
    assert next(iter(loader(True))).crops[0].is_pinned()
    prefetcher = prefetch_to_device(pinned, CUDA, True, lambda batch: None)
    assert isinstance(prefetcher, DevicePrefetcher)
    for consumed, (expected, got) in enumerate(zip(reference, prefetcher, strict=True), start=1):
        assert prefetcher.state_dict()["position"] == 4 * consumed
        assert all(c.is_cuda for c in got.crops) and got.labels.is_cuda and got.keys == expected.keys
        host = got.to(torch.device("cpu"), non_blocking=False)
        assert torch.equal(host.labels, expected.labels) and all(map(torch.equal, host.crops, expected.crops))
