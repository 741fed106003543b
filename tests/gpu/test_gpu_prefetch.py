"""The CUDA side of scale.data.prefetch: pinned batches, copied ahead on a side stream, arrive on the device equal to
the loader's, and the prefetcher's position counts only the batches it yielded."""

import pytest
import torch
from gpu_env import require_cuda

from scale.data.factory import build_loader
from scale.data.prefetch import DevicePrefetcher, prefetch_to_device
from scale.data.spec import LoaderSpec
from tests.data.helpers import good_shards, tiny_cfg

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def loaders(tmp_path, photometric_on: str):
    """The same shards, seed and draws: a loader for reference, a pinned one for the prefetcher, and the first
    batch of another pinned one (iterating the prefetcher's own would move its position)."""
    good_shards(tmp_path, [7, 11])
    cfg = tiny_cfg(tmp_path, **{"views.photometric_on": photometric_on})
    reference, pinned, other = (
        build_loader(LoaderSpec(cfg, "train", 4, 0, 1, seed=5, pin_memory=pin)) for pin in (False, True, True)
    )
    return reference, pinned, next(iter(other))


def test_prefetched_batches_arrive_on_the_device_equal_to_the_loaders(tmp_path):
    require_cuda("a side-stream copy from pinned memory")
    reference, pinned, first = loaders(tmp_path, "cpu")
    assert first.crops[0].is_pinned()
    prefetcher = prefetch_to_device(pinned, CUDA, True, lambda batch: None)
    assert isinstance(prefetcher, DevicePrefetcher)
    for consumed, (expected, got) in enumerate(zip(reference, prefetcher, strict=True), start=1):
        assert prefetcher.state_dict()["position"] == 4 * consumed
        assert all(c.is_cuda for c in got.crops) and got.labels.is_cuda and got.keys == expected.keys
        host = got.to(torch.device("cpu"), non_blocking=False)
        assert torch.equal(host.labels, expected.labels) and all(map(torch.equal, host.crops, expected.crops))


def test_the_photometric_ops_run_on_the_device_as_on_the_cpu(tmp_path):
    """photometric_on=device: uint8 crops and their parameters travel pinned, the ops run on CUDA after the copy,
    and give what the same ops give on the CPU (float rounding apart: the blur's convolution)."""
    require_cuda("the photometric ops on CUDA")
    reference, pinned, first = loaders(tmp_path, "device")
    assert first.crops[0].is_pinned() and first.crops[0].dtype == torch.uint8
    for expected, got in zip(reference, prefetch_to_device(pinned, CUDA, True, lambda batch: None), strict=True):
        assert all(c.is_cuda and c.dtype == torch.float32 for c in got.crops)
        on_cpu = expected.to(torch.device("cpu"), non_blocking=False)
        for want, have in zip(on_cpu.crops, got.crops, strict=True):
            torch.testing.assert_close(have.cpu(), want, atol=1e-4, rtol=0)
