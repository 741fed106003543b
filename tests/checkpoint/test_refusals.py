"""A pickle that names code is refused in scale's words at every door that reads a user's file: the file, what it
names, and a safe way on (re-save as safetensors or a plain state dict), never torch's advice to retry with
weights_only=False. hubconf.py's entry point raises one error type of scale's naming the file, for a crafted weights
file and for a config.json that is not one."""

from pathlib import Path

import pytest
import torch

from scale.checkpoint.layouts import read_source
from scale.checkpoint.safe_load import UnsafeCheckpoint, load_torch
from scale.checkpoint.share import ExportUnreadable
from scale.errors import UserError
from scale.eval.features import load as load_features

REPO = Path(__file__).resolve().parents[2]


class Crafted:
    def __reduce__(self):
        return (print, ("ran",))


def assert_in_our_words(message: str, path) -> None:
    assert str(path) in message and "refused to load" in message and "print" in message, message
    assert "safetensors" in message and "weights_only" not in message, message


@pytest.fixture
def crafted(tmp_path):
    path = tmp_path / "evil.pth"
    torch.save({"student": {}, "teacher": {}, "args": Crafted()}, path)
    return path


@pytest.mark.parametrize(
    "door",
    [read_source, load_features, load_torch],
    ids=["weights-and-init", "features", "checkpoint-file"],
)
def test_a_crafted_pickle_is_refused_in_scales_words(crafted, door):
    with pytest.raises((UserError, UnsafeCheckpoint)) as refused:
        door(crafted)
    assert_in_our_words(str(refused.value), crafted)


def hub(folder):
    return torch.hub.load(str(REPO), "backbone", path=str(folder), source="local")


def test_hub_refuses_a_crafted_weights_file_naming_it(tmp_path):
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "config.json").write_text('{"architecture": "resnet10t", "num_classes": 0, "pretrained_cfg": {}}')
    torch.save({"fc.weight": Crafted()}, folder / "pytorch_model.bin")
    with pytest.raises(ExportUnreadable) as refused:
        hub(folder)
    assert_in_our_words(str(refused.value), folder)


@pytest.mark.parametrize("config", [b"{not json", b"[1, 2]", b"\xff\xfe", None], ids=["text", "list", "bytes", "none"])
def test_hub_names_a_config_that_is_not_one(tmp_path, config):
    folder = tmp_path / "export"
    folder.mkdir()
    if config is not None:
        (folder / "config.json").write_bytes(config)
    with pytest.raises(ExportUnreadable, match="config.json"):
        hub(folder)
