"""Checksums and failed loads: bytes overwritten in place (same size) are found by the checksums recorded at seal
time, on resume (the ranks fall back to the previous checkpoint, naming the file) and by `scale ckpt info --verify`;
a checkpoint whose load fails half-way leaves none of its tensors in the model."""

import json
import shutil

import pytest
from torch.distributed.checkpoint import FileSystemReader

from scale.checkpoint.checksum import checksums
from scale.checkpoint.store import META, file_sizes, resolve
from scale.cli import main as cli
from tests.checkpoint.runs import OVERRIDES, assert_same_state, final_state
from tests.helpers_run import run_train

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out

TENSORS = "dcp/__0_0.distcp"  # rank 0's tensors, no pickled item (those are in __1_0)


def zero_one_tensor(folder) -> None:
    """Zero the last values of the largest tensor inside a .distcp file (each item is a torch file whose data comes
    last): the same size, still a loadable file, other weights."""
    path = folder / TENSORS
    metadata = FileSystemReader(str(path.parent)).read_metadata()
    info = max(
        (s for i, s in metadata.storage_data.items() if s.relative_path == path.name),
        key=lambda s: s.length,
    )
    data = bytearray(path.read_bytes())
    end = info.offset + info.length
    assert any(data[end - 16 : end])
    data[end - 16 : end] = bytes(16)
    path.write_bytes(bytes(data))


def reseal_all(folder) -> None:
    """New sizes and checksums in meta.json: damage that only a failed load shows."""
    meta = json.loads((folder / META).read_text())
    meta["files"] = file_sizes(folder)
    meta["checksums"] = checksums(folder, meta["files"])
    (folder / META).write_text(json.dumps(meta))


def test_ckpt_info_verify(reference, tmp_path, capsys):
    shutil.copytree(reference, tmp_path, dirs_exist_ok=True)
    folder = resolve(tmp_path)
    assert cli(["ckpt", "info", str(folder), "--verify"]) == 0
    assert "checksums" in capsys.readouterr().out
    zero_one_tensor(folder)
    assert cli(["ckpt", "info", str(folder)]) == 0  # without --verify: the bytes are not read
    capsys.readouterr()
    assert cli(["ckpt", "info", str(folder), "--verify"]) == 2
    err = capsys.readouterr().err
    assert err.count("scale: error:") == 1 and "__0_0.distcp does not match its checksum" in err, err


def test_zeroed_tensor_is_damage_and_every_rank_resumes_the_previous_checkpoint(embedded_data, reference, tmp_path):
    shutil.copytree(reference, tmp_path, dirs_exist_ok=True)
    folder = resolve(tmp_path)
    zero_one_tensor(folder)
    out = run_train(embedded_data, tmp_path, OVERRIDES)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "step_000000004 at step 4" in out.stderr, out.stderr[-3000:]
    assert f"skipping checkpoint {folder}: file {TENSORS} does not match its checksum" in out.stderr
    assert "Traceback" not in out.stderr
    assert_same_state(final_state(reference), final_state(tmp_path))


def test_load_failing_half_way_leaves_none_of_its_tensors(embedded_data, reference, tmp_path):
    """The only checkpoint has a truncated tensor file (meta.json resealed to match): its load fails after some
    tensors were read; the run starts again at step 0 from the initial weights and ends where the reference did."""
    shutil.copytree(reference, tmp_path, dirs_exist_ok=True)
    folder = resolve(tmp_path)
    for older in folder.parent.glob("step_*"):
        if older != folder:
            shutil.rmtree(older)
    path = folder / TENSORS
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    reseal_all(folder)
    out = run_train(embedded_data, tmp_path, OVERRIDES)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"skipping checkpoint {folder}" in out.stderr and "steps 0..6" in out.stderr, out.stderr[-3000:]
    assert_same_state(final_state(reference), final_state(tmp_path))
