"""Faults in a checkpoint: when one rank's part of the newest checkpoint is damaged every rank resumes from the same
older one; garbage DCP metadata is skipped with a warning naming it; a crafted pickle in any file a checkpoint holds
runs no code and is refused with exit 2 and one message (`scale ckpt info`, `scale ckpt export`, resume)."""

import io
import json
import pickle
import shutil

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import BytesStorageMetadata

from scale.checkpoint.store import META, file_sizes, resolve
from scale.cli import main as cli
from tests.checkpoint.runs import OVERRIDES, assert_same_state, final_state
from tests.helpers_run import TINY, run_train

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out


class Marker:
    """Unpickling it creates the marker file: what a crafted checkpoint would do instead."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def reseal(folder) -> None:
    """Record the files' new sizes in meta.json, as whoever crafts a checkpoint would."""
    meta = json.loads((folder / META).read_text())
    meta["files"] = file_sizes(folder)
    (folder / META).write_text(json.dumps(meta))


def garble(path) -> None:
    """Overwrite a file with garbage of the same size (damage that the sizes in meta.json do not show)."""
    path.write_bytes(b"\x00garbage" * (path.stat().st_size // 8) + b"\x00" * (path.stat().st_size % 8))


def crafted_item(marker, length: int) -> bytes:
    buf = io.BytesIO()
    torch.save(Marker(marker), buf, _use_new_zipfile_serialization=False)
    raw = buf.getvalue()
    assert len(raw) <= length
    return raw + b"\x00" * (length - len(raw))


def craft(folder, name: str, marker) -> None:
    """Replace one file of a step directory (or, for a .distcp file, one of its pickled items) by a crafted pickle."""
    path = folder / name
    if name.endswith(".metadata"):
        path.write_bytes(pickle.dumps(Marker(marker)))
    elif name.endswith(".distcp"):
        metadata = FileSystemReader(str(path.parent)).read_metadata()
        index, info = next(
            (i, s)
            for i, s in metadata.storage_data.items()
            if s.relative_path == path.name and isinstance(metadata.state_dict_metadata[i.fqn], BytesStorageMetadata)
        )
        data = bytearray(path.read_bytes())
        data[info.offset : info.offset + info.length] = crafted_item(marker, info.length)
        path.write_bytes(bytes(data))
    else:
        torch.save({"state": Marker(marker)}, path)
    reseal(folder)


def copy_run(reference, tmp_path):
    shutil.copytree(reference, tmp_path, dirs_exist_ok=True)
    return resolve(tmp_path)


# __1_0.distcp holds the pickled (non-tensor) items; tensor items are read by torch itself with weights_only
FILES = ["dcp/.metadata", "dcp/__1_0.distcp", "rng/rank0.pt", "rng/rank1.pt", "monitors.pt"]


@pytest.mark.parametrize("name", FILES)
def test_crafted_file_runs_no_code_in_ckpt_commands(reference, tmp_path, capsys, name):
    folder = copy_run(reference, tmp_path / "run")
    marker = tmp_path / "marker"
    craft(folder, name, marker)
    for argv in (["info", str(folder)], ["export", str(folder), "--out", str(tmp_path / "out.safetensors")]):
        assert cli(["ckpt", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("scale: error:") == 1 and "refused to load" in err and name.split("/")[-1] in err, err
        assert "Traceback" not in err
    assert not marker.exists()


@pytest.mark.parametrize("name", ["dcp/.metadata", "dcp/__1_0.distcp", "rng/rank1.pt"])
def test_crafted_file_runs_no_code_on_resume(embedded_data, reference, tmp_path, name):
    folder = copy_run(reference, tmp_path / "run")
    marker = tmp_path / "marker"
    craft(folder, name, marker)
    out = run_train(embedded_data, tmp_path / "run", OVERRIDES)
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.count("refused to load") == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert not marker.exists()


@pytest.mark.parametrize("name", ["rng/rank1.pt", "dcp/.metadata"])
def test_one_damaged_file_makes_every_rank_resume_the_previous_checkpoint(
    embedded_data,
    reference,
    tmp_path,
    name,
):
    """The newest checkpoint (step 6) has one damaged file: both ranks load step 4 and train to the reference."""
    folder = copy_run(reference, tmp_path)
    garble(folder / name)
    out = run_train(embedded_data, tmp_path, OVERRIDES)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "step_000000004 at step 4" in out.stderr, out.stderr[-3000:]
    assert f"skipping checkpoint {folder}" in out.stderr and name.split("/")[-1] in out.stderr
    assert "Traceback" not in out.stderr
    assert_same_state(final_state(reference), final_state(tmp_path))


DS = ["engine.kind=deepspeed", "engine.zero_stage=2", "train.ckpt_every_steps=2", "train.keep_last=10"]
DS_STEPS = 4
OPTIM_RANK1 = "engine/state/zero_pp_rank_1_mp_rank_00_optim_states.pt"


@pytest.fixture(scope="module")
def ds_reference(embedded_data, tmp_path_factory):
    pytest.importorskip("deepspeed")
    run_dir = tmp_path_factory.mktemp("ds_reference")
    out = run_train(embedded_data, run_dir, TINY + DS + [f"train.max_steps={DS_STEPS}"])
    assert out.returncode == 0, out.stderr[-3000:]
    return run_dir


def test_deepspeed_rank_with_a_damaged_optimizer_file_resumes_with_the_others(
    embedded_data,
    ds_reference,
    tmp_path,
):
    """Rank 1's optimizer states in the newest checkpoint are garbage: both ranks resume from step 2 (DeepSpeed
    used to hang there) and steps 3 and 4 repeat the reference's losses."""
    folder = copy_run(ds_reference, tmp_path)
    garble(folder / OPTIM_RANK1)
    out = run_train(embedded_data, tmp_path, TINY + DS + [f"train.max_steps={DS_STEPS}"])
    assert out.returncode == 0, out.stderr[-3000:]
    assert "step_000000002 at step 2" in out.stderr and "zero_pp_rank_1" in out.stderr, out.stderr[-3000:]
    rows = [(r["step"], r["loss"]) for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())]
    ref = {r["step"]: r["loss"] for r in map(json.loads, (ds_reference / "metrics.jsonl").read_text().splitlines())}
    assert rows[-2:] == [(3, ref[3]), (4, ref[4])]


def test_deepspeed_crafted_optimizer_file_runs_no_code(embedded_data, ds_reference, tmp_path):
    folder = copy_run(ds_reference, tmp_path / "run")
    marker = tmp_path / "marker"
    craft(folder, OPTIM_RANK1, marker)
    out = run_train(embedded_data, tmp_path / "run", TINY + DS + [f"train.max_steps={DS_STEPS}"])
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.count("refused to load") == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert not marker.exists()
