"""A symbolic link inside a checkpoint is refused before any loader opens it: to a file or a folder, absolute or
relative, where DCP, DeepSpeed or scale read (`dcp/`, `engine/state/`, `engine/universal` whose link skipped the
universal conversion and fed DeepSpeed a crafted fp32.pt), before and after a tar round trip. In process: the check
is the same for every engine (the resume, `scale ckpt info --verify` and `export` all go through it)."""

import json
import os
import subprocess

import pytest
import torch

from scale.checkpoint.checksum import checksums
from scale.checkpoint.safe_load import UnsafeCheckpoint, check_files
from scale.checkpoint.store import META, file_sizes, step_name
from scale.cli import main as cli
from tests.checkpoint.test_faults import Marker

FILES = ["dcp/.metadata", "engine/state/mp_rank_00_model_states.pt", "rng/rank0.pt"]


def sealed_step(run: "os.PathLike") -> "os.PathLike":
    """A sealed step directory of plain tensor files (what the check reads does not depend on the engine)."""
    folder = run / "checkpoints" / step_name(4)
    for name in FILES[1:]:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        torch.save({"w": torch.zeros(2)}, folder / name)
    files = file_sizes(folder)
    meta = {"complete": True, "step": 4, "engine": "deepspeed", "world_size": 2, "files": files}
    (folder / META).write_text(json.dumps({**meta, "checksums": checksums(folder, files)}))
    (run / "checkpoints" / "latest").write_text(folder.name + "\n")
    return folder


def crafted_elsewhere(tmp_path, marker) -> "os.PathLike":
    """A folder outside the checkpoint holding a pickle that runs code (DeepSpeed's universal fp32.pt shape)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    torch.save({"param": Marker(marker)}, outside / "fp32.pt")
    return outside


# (where the link lies in the step directory, what it points to: a file or the folder, absolute or relative)
LINKS = [
    ("engine/universal", "folder", "relative"),  # the attack: the conversion is skipped, DeepSpeed loads it
    ("engine/universal", "folder", "absolute"),
    ("engine/state/zero_pp_rank_0_mp_rank_00_optim_states.pt", "file", "relative"),
    ("dcp/__0_0.distcp", "file", "absolute"),
    ("meta.json", "file", "relative"),
]


@pytest.mark.parametrize("tar", [False, True], ids=["as-made", "tar-round-trip"])
@pytest.mark.parametrize("where,kind,how", LINKS)
def test_link_in_a_checkpoint_is_refused_naming_it(tmp_path, capsys, where, kind, how, tar):
    run, marker = tmp_path / "run", tmp_path / "marker"
    folder = sealed_step(run)
    outside = crafted_elsewhere(tmp_path, marker)
    target = outside if kind == "folder" else outside / "fp32.pt"
    link = folder / where
    link.parent.mkdir(parents=True, exist_ok=True)
    if where == META:
        (outside / META).write_text((folder / META).read_text())
        link.unlink()
        target = outside / META
    link.symlink_to(os.path.relpath(target, link.parent) if how == "relative" else target)
    if tar:  # a relative link survives packing and unpacking (an absolute one too, on the same machine)
        subprocess.run(["tar", "-C", str(tmp_path), "-cf", str(tmp_path / "run.tar"), "run"], check=True)
        os.rename(run, tmp_path / "before-tar")
        subprocess.run(["tar", "-C", str(tmp_path), "-xf", str(tmp_path / "run.tar")], check=True)
        assert link.is_symlink()
    with pytest.raises(UnsafeCheckpoint, match="symbolic link") as refused:
        check_files(folder, 0, 2)
    assert str(link) in str(refused.value)
    assert "symbolic link" in check_files(folder, 1, 2)  # the others read nothing and leave it to rank 0
    assert cli(["ckpt", "info", str(run), "--verify"]) == 2  # never listed as loadable
    err = capsys.readouterr().err
    assert err.count("scale: error:") == 1 and where in err and "Traceback" not in err, err
    assert not marker.exists()


def test_checkpoint_without_links_passes(tmp_path):
    """The check refuses links, not checkpoints: the same folder without one reads as loadable."""
    folder = sealed_step(tmp_path / "run")
    assert check_files(folder, 0, 1) is None
