"""Every loader declares the loader protocol (scale/data/loader_protocol.py) and defines each of its members itself,
with the protocol's signature: a renamed or re-typed method fails here, not in a training run."""

import inspect

import pytest
from omegaconf import OmegaConf

from scale.data.batch import Batch
from scale.data.factory import build_loader
from scale.data.loader import Loader
from scale.data.loader_protocol import BatchLoader
from scale.data.prefetch import DevicePrefetcher
from scale.data.spec import LoaderSpec
from scale.data.synthetic import SyntheticLoader
from tests.data.helpers import good_shards, tiny_cfg

METHODS = ("__len__", "__iter__", "metrics", "state_dict", "load_state_dict", "counters", "load_counters")


def loader_classes() -> list[type]:
    classes = [Loader, SyntheticLoader, DevicePrefetcher]
    try:
        from scale.data.dali.loader import DaliLoader
    except ImportError:  # the dali extra is not installed
        return classes
    return [*classes, DaliLoader]


def test_the_protocol_names_the_methods_every_loader_shares():
    written = [v for v in vars(BatchLoader).values() if inspect.isfunction(v)]  # not typing's own hooks
    members = {v.__name__ for v in written if v.__qualname__.startswith("BatchLoader.")}
    assert members == set(METHODS) and "steps_per_epoch" in BatchLoader.__annotations__


def parameters(function) -> list[tuple[str, object]]:
    return [(p.name, p.kind) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize("cls", loader_classes(), ids=lambda c: c.__name__)
def test_each_loader_declares_the_protocol_and_defines_its_methods_with_its_signatures(cls):
    assert BatchLoader in cls.__mro__  # declared, not only alike
    for name in METHODS:
        owner = next(c for c in cls.__mro__ if name in vars(c))
        assert owner is not BatchLoader, f"{cls.__name__}.{name} is the protocol's stub, not a definition"
        assert parameters(getattr(cls, name)) == parameters(getattr(BatchLoader, name)), f"{cls.__name__}.{name}"


def test_the_loaders_built_hold_steps_per_epoch_and_count_them(tmp_path):
    good_shards(tmp_path, [8])
    cfg = tiny_cfg(tmp_path)
    loader = build_loader(LoaderSpec(cfg, "train", 4, 0, 1, seed=0))
    run = OmegaConf.create(
        {
            "data": {"views": {"kind": "eval", "eval_crop": 8}, "num_classes": 2},
            "train": {"global_batch": 4, "seed": 0, "samples_per_epoch": 12},
        }
    )
    synthetic = SyntheticLoader(run, 0, 1)
    prefetcher = DevicePrefetcher(synthetic, lambda batch: lambda: batch, lambda batch: None)
    for built in (loader, synthetic, prefetcher):
        assert isinstance(built, BatchLoader)
        assert len(built) == built.steps_per_epoch > 0
    assert [type(b) for b in prefetcher] == [Batch] * 3
