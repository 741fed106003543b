"""No code runs from a handed-over DeepSpeed checkpoint: a crafted pickle at any file DeepSpeed reads (ZeRO-1 and
ZeRO-3 model and optimizer states, the teacher, a universal folder shipped inside the checkpoint), even with its
entry removed from meta.json, is refused before DeepSpeed opens anything."""

import json
import os
import shutil

import pytest
import torch

from scale.checkpoint.safe_load import UnsafeCheckpoint, check_files
from scale.checkpoint.store import META
from tests.checkpoint.test_faults import Marker
from tests.helpers_run import TINY, run_train

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out

STEPS = 4
NEWEST = f"checkpoints/step_{STEPS:09d}"


def ds(stage: int) -> list[str]:
    return TINY + [
        "engine.kind=deepspeed",
        f"engine.zero_stage={stage}",
        "train.ckpt_every_steps=2",
        "train.keep_last=10",
        f"train.max_steps={STEPS}",
    ]


@pytest.fixture(scope="module")
def ds_runs(embedded_data, tmp_path_factory):
    """A ZeRO-1 and a ZeRO-3 run on 2 ranks; the ZeRO-1 one resumed on 1 rank, which converts its newest
    checkpoint to DeepSpeed's universal format (engine/universal/ beside the state)."""
    pytest.importorskip("deepspeed")
    runs = {}
    for stage in (1, 3):
        runs[stage] = tmp_path_factory.mktemp(f"zero{stage}")
        out = run_train(embedded_data, runs[stage], ds(stage))
        assert out.returncode == 0, out.stderr[-3000:]
    runs["universal"] = tmp_path_factory.mktemp("universal")
    shutil.copytree(runs[1], runs["universal"], dirs_exist_ok=True)
    out = run_train(embedded_data, runs["universal"], ds(1)[:-1] + [f"train.max_steps={STEPS + 1}"], nproc=1)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (runs["universal"] / NEWEST / "engine" / "universal").is_dir()
    shutil.rmtree(runs["universal"] / f"checkpoints/step_{STEPS + 1:09d}")  # a resume loads the converted one
    return runs


def plant(folder, name: str, marker) -> None:
    """A crafted pickle at `name`, its entry dropped from meta.json (sizes and checksums) as an attacker would."""
    torch.save({"module": Marker(marker)}, folder / name)
    meta = json.loads((folder / META).read_text())
    meta["files"].pop(name, None)
    meta["checksums"]["files"].pop(name, None)
    (folder / META).write_text(json.dumps(meta))


def deepspeed_reads(folder) -> list[str]:
    """Every file of DeepSpeed's folder it may unpickle; of the universal folder, one of each kind."""
    names = sorted(str(p.relative_to(folder)) for p in (folder / "engine").rglob("*.pt"))
    zero = [n for n in names if "/universal/state/zero/" in n]  # a folder per parameter
    param = zero[0].rsplit("/", 1)[0] if zero else None
    return [n for n in names if n not in zero or n.rsplit("/", 1)[0] == param]


@pytest.mark.parametrize("run", [1, 3, "universal"])
def test_crafted_pickle_at_any_deepspeed_file_is_refused(ds_runs, tmp_path, run):
    folder = tmp_path / "step"
    shutil.copytree(ds_runs[run] / NEWEST, folder)
    names = deepspeed_reads(folder)
    assert any("optim_states" in n for n in names) and any("model_states" in n for n in names)
    if run == "universal":
        assert any(n.endswith("/exp_avg.pt") for n in names) and any(n.endswith("/fp32.pt") for n in names)
    marker = tmp_path / "marker"
    pristine = tmp_path / "pristine"
    shutil.copytree(folder, pristine)
    for name in names:
        plant(folder, name, marker)
        refused = []
        for rank in (0, 1):  # each rank reads its share; one of them finds it
            try:
                assert check_files(folder, rank, 2) is None
            except UnsafeCheckpoint as err:
                refused.append(str(err))
        assert len(refused) == 1 and name in refused[0] and "refused to load" in refused[0], (name, refused)
        assert not marker.exists(), name
        shutil.rmtree(folder)
        shutil.copytree(pristine, folder)


@pytest.mark.parametrize(
    "run,name,nproc",
    [
        (1, "engine/state/mp_rank_00_model_states.pt", 2),
        ("universal", "engine/universal/state/mp_rank_00_model_states.pt", 1),
    ],
)
def test_resume_from_crafted_deepspeed_file_runs_no_code(embedded_data, ds_runs, tmp_path, run, name, nproc):
    """The issue's attack: the file replaced and removed from meta.json; the run exits 2 with one message."""
    shutil.copytree(ds_runs[run], tmp_path / "run")
    marker = tmp_path / "marker"
    plant(tmp_path / "run" / NEWEST, name, marker)
    out = run_train(embedded_data, tmp_path / "run", ds(1)[:-1] + [f"train.max_steps={STEPS + 2}"], nproc=nproc)
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.count("refused to load") == 1 and name.split("/")[-1] in out.stderr, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert not marker.exists()


def test_elastic_resume_through_a_linked_universal_folder_runs_no_code(embedded_data, ds_runs, tmp_path):
    """The issue's attack: `engine/universal` a relative link (it survives tar) to a folder holding a crafted
    fp32.pt, the 2-rank ZeRO-1 run resumed on 1 rank, where the conversion would be skipped and DeepSpeed would
    unpickle it: exit 2 naming the link, no code run (test_links.py: the same for every link shape and engine)."""
    shutil.copytree(ds_runs[1], tmp_path / "run")
    marker, outside = tmp_path / "marker", tmp_path / "outside"
    shutil.copytree(ds_runs["universal"] / NEWEST / "engine" / "universal", outside)  # a real conversion's layout
    fp32 = sorted(outside.rglob("fp32.pt"))[0]
    torch.save({"param": Marker(marker)}, fp32)  # what DeepSpeed's universal load unpickles first
    link = tmp_path / "run" / NEWEST / "engine" / "universal"
    link.symlink_to(os.path.relpath(outside, link.parent))
    out = run_train(embedded_data, tmp_path / "run", ds(1)[:-1] + [f"train.max_steps={STEPS + 2}"], nproc=1)
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.count("refused to load") == 1 and "engine/universal" in out.stderr, out.stderr[-3000:]
    assert "Traceback" not in out.stderr
    assert not marker.exists()
