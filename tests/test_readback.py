"""Every file scale reads back (scale.readback), replaced in turn by each JSON and YAML type, an object of the wrong
types, truncated text, bytes that are not UTF-8 and an empty file, then read by the real entry points in-process:
a damaged checkpoint (meta.json, its data counters) is skipped with a warning naming the file and the field and the
previous one used; anything else is exit 2 with one line naming the file, or an empty field in `scale status`;
never a traceback. Also: a stray step_garbage folder, and `scale ckpt export --out` onto a folder, a read-only
folder or an existing file."""

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from omegaconf import OmegaConf
from safetensors.torch import load_file

from scale.checkpoint.checksum import checksums
from scale.checkpoint.diskspace import expected_bytes
from scale.checkpoint.state import PER_RANK
from scale.checkpoint.store import META, SET_ASIDE, CheckpointStore, file_sizes, step_name
from scale.cli import main as cli
from scale.config import load_recipe
from scale.config.load import to_yaml
from scale.data.shards.read import read_index, read_manifest
from scale.data.shards.write import build_shards
from scale.data.sources import imagefolder
from scale.errors import UserError
from scale.launch.slurm import JOB_RECORD, recorded_job
from scale.loop.validation import Validation
from scale.readback import VAL_RESULT, BadFile, read_json, read_json_lines, read_line, read_metrics, read_yaml
from scale.trackers import TrackerState, attach_artifacts
from tests.checkpoint.test_steering import saved_run, toy
from tests.data.helpers import make_imagefolder

# every JSON type, an object whose values are of the wrong types, truncated text, bytes that are not UTF-8, empty
JSON_DAMAGE = {
    "null": b"null",
    "number": b"42",
    "string": b'"step_000000004"',
    "bool": b"true",
    "list": b"[1, 2]",
    "empty object": b"{}",
    "values lists": None,  # the file's own keys, each value a list (made from the good file)
    "values strings": None,  # the file's own keys, each value a string
    "values objects": None,  # the file's own keys, each value an object
    "truncated": None,  # the first half of the good file
    "not UTF-8": b'{"step": "\xff\xfe"}',
    "empty": b"",
}
YAML_DAMAGE = {
    "yaml list": b"- train\n- meta\n",
    "yaml string": b"just some text\n",
    "yaml number": b"42\n",
    "yaml null": b"~\n",
    "yaml bad syntax": b"train: {epochs: [1\n",
    "yaml section a list": b"train: [1, 2]\nmeta: 3\n",
}
DAMAGE = {**JSON_DAMAGE, **YAML_DAMAGE}


def damage(path: Path, how: str) -> None:
    """Replace the file at `path` with damage `how`, made from its good content where the damage needs it."""
    good = path.read_bytes()
    data = DAMAGE[how]
    if how == "truncated":
        data = good[: len(good) // 2]
    elif how.startswith("values"):
        value = {"values lists": [1], "values strings": "x", "values objects": {"a": 1}}[how]
        try:
            records = [json.loads(line) for line in good.decode().splitlines() if line.strip()]
        except ValueError:  # YAML (config.yaml), or a line of text (latest)
            records = [yaml.safe_load(good)]
        records = [record if isinstance(record, dict) else {"name": record} for record in records]
        data = "\n".join(json.dumps({key: value for key in record}) for record in records).encode()
    path.write_bytes(data)


def one_line_error(capsys, *names: str) -> str:
    err = capsys.readouterr().err
    assert err.startswith("scale: error: ") and err.count("\n") == 1, err
    assert all(name in err for name in names), err
    return err


def reseal(folder: Path) -> None:
    """Record the files' present sizes and checksums in meta.json (damage only the reader of a file can find)."""
    meta = json.loads((folder / META).read_text())
    meta["files"] = file_sizes(folder)
    meta["checksums"] = checksums(folder, meta["files"])
    (folder / META).write_text(json.dumps(meta))


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """Checkpoints of steps 2 and 4 (the weights equal to the step), saved once for the module; copied per test."""
    return saved_run(tmp_path_factory.mktemp("saved") / "checkpoints", steps=(2, 4))


def copied(saved: Path, run: Path, steps=(2, 4)) -> Path:
    root = Path(shutil.copytree(saved, run / "checkpoints"))
    for step in {2, 4} - set(steps):
        shutil.rmtree(root / step_name(step))
    return root


# --- checkpoints: the damaged-checkpoint path ---


@pytest.mark.parametrize("how", list(DAMAGE))
def test_damaged_meta_json_is_skipped_by_info_export_and_resume(saved, tmp_path, capsys, caplog, how):
    root = copied(saved, tmp_path)
    damage(root / step_name(4) / META, how)
    assert cli(["ckpt", "info", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.split("\n")[0].split() == ["checkpoint", str(root / step_name(2))], out
    row = next(line for line in out.splitlines() if line.endswith(step_name(4)))
    assert "meta.json" in row and "yes" not in row.split(), row
    assert cli(["ckpt", "export", str(tmp_path), "--what", "student", "--out", str(tmp_path / "w.safetensors")]) == 0
    assert torch.equal(load_file(tmp_path / "w.safetensors")["w"], torch.full((4,), 2.0))  # step 2's weights
    saver, engine, _ = toy(root, 0.0)
    with caplog.at_level(logging.WARNING):
        assert saver.resume() == 2
    assert torch.equal(engine.state["student"]["w"], torch.full((4,), 2.0))
    warned = [r.getMessage() for r in caplog.records if step_name(4) in r.getMessage() and r.levelno >= logging.WARNING]
    assert warned and all("meta.json" in w for w in warned), caplog.text
    assert list((root / SET_ASIDE).glob(f"*/{step_name(4)}")), "the damaged checkpoint was not set aside"


@pytest.mark.parametrize("how", list(JSON_DAMAGE))
def test_damaged_data_counters_start_at_zero_with_a_warning(tmp_path, caplog, how):
    root = tmp_path / "checkpoints"
    saver, _, loader = toy(root, 2.0)
    loader.samples_seen = 7
    saver.save(2)
    damage(root / step_name(2) / PER_RANK["counters"].format(rank=0), how)
    reseal(root / step_name(2))
    saver, _, loader = toy(root, 0.0)
    with caplog.at_level(logging.WARNING):
        assert saver.resume() == 2
    assert loader.samples_seen == 0  # not 7: the damaged counters are not used
    # {} is a checkpoint written before the counters were saved: they start at 0, without a warning
    assert how == "empty object" or "rank0.json" in caplog.text


def test_a_stray_step_folder_is_no_checkpoint(saved, tmp_path, capsys):
    root = copied(saved, tmp_path, steps=(2,))
    (root / "step_garbage").mkdir()
    (root / SET_ASIDE / "x" / "step_also_garbage").mkdir(parents=True)
    (root / ".tmp-step_junk").mkdir()
    assert cli(["ckpt", "info", str(tmp_path)]) == 0
    assert capsys.readouterr().out.split("\n")[0].split() == ["checkpoint", str(root / step_name(2))]
    assert toy(root, 0.0)[0].resume() == 2


# --- outside checkpoints: exit 2 with one line, or an empty field where the reader is defensive ---


@pytest.mark.parametrize("how", list(DAMAGE))
def test_damaged_steering_json_is_one_line_naming_it(saved, tmp_path, how):
    root = copied(saved, tmp_path)
    assert toy(root, 0.0, resume_step=2)[0].resume() == 2  # applied: recorded in steering.json
    damage(root / "steering.json", how)
    with pytest.raises(UserError, match="steering.json") as err:
        toy(root, 0.0, resume_step=2)[0].resume()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("how", list(DAMAGE))
def test_damaged_saves_jsonl_costs_the_estimate_not_the_run(saved, tmp_path, how):
    root = copied(saved, tmp_path)
    first = json.loads((root / "saves.jsonl").read_text().splitlines()[0])["bytes"]
    assert expected_bytes(root) > 0
    damage(root / "saves.jsonl", how)
    # none (the check then uses the model's size), or the first line's where a torn last line is dropped
    assert expected_bytes(root) in (None, first)


@pytest.mark.parametrize("how", list(DAMAGE))
def test_damaged_trackers_json_is_one_line_naming_it(tmp_path, how):
    state = TrackerState(tmp_path)
    state.ids, state.last_step = {"mlflow": "abc"}, 12
    state.save()
    damage(tmp_path / "trackers.json", how)
    with pytest.raises(UserError, match="trackers.json") as err:
        TrackerState(tmp_path)
    assert "\n" not in str(err.value)


def status_run(saved: Path, tmp_path: Path) -> Path:
    """A run directory with what `scale status` reads: config.yaml, metrics.jsonl, heartbeat.json, latest."""
    run = tmp_path / "run"
    copied(saved, run, steps=(2,))
    (run / "checkpoints" / "latest").write_text(step_name(2) + "\n")
    (run / "config.yaml").write_text("meta: {name: toy}\ntrain: {epochs: 2, samples_per_epoch: 64, global_batch: 8}\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "time": s, "loss": 1.0}) + "\n" for s in (1, 2)))
    beat = {"step": 3, "phase": "forward", "phase_since": 1.0, "step_since": 1.0, "last_log": 1.0, "time": 2.0}
    (run / "heartbeat.json").write_text(json.dumps(beat))
    return run


@pytest.mark.parametrize("name", ["config.yaml", "metrics.jsonl", "heartbeat.json", "checkpoints/latest"])
@pytest.mark.parametrize("how", list(DAMAGE))
def test_scale_status_shows_what_it_can_of_a_damaged_run(saved, tmp_path, capsys, name, how):
    run = status_run(saved, tmp_path)
    damage(run / name, how)
    assert cli(["status", str(run), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    status = status[0] if isinstance(status, list) else status
    assert status["last_checkpoint"] == step_name(2)


@pytest.mark.parametrize("name", ["config.yaml", "metrics.jsonl", "eval/knn.json"])
@pytest.mark.parametrize(
    "how", ["list", "values lists", "truncated", "not UTF-8", "empty", "yaml list"]
)  # a recipe each
def test_scale_report_reads_what_it_can_or_names_the_file(saved, tmp_path, name, how):
    from scale.report import load_run  # matplotlib: imported by the test that needs it

    run = status_run(saved, tmp_path)
    (run / "eval").mkdir()
    (run / "eval" / "knn.json").write_text(json.dumps({"top1": 50.0, "top5": 80.0}))
    damage(run / name, how)
    try:
        loaded = load_run(run)
    except UserError as err:
        assert str(run / name) in str(err) and "\n" not in str(err)
    else:  # what it read is of the types it uses: a torn last metrics line is dropped, an empty config is defaults
        assert all(isinstance(m["step"], (int, float)) for m in loaded["metrics"]), loaded["metrics"]
        assert loaded["config"].meta.name in ("toy", "") and isinstance(loaded["evals"]["knn"], dict)


@pytest.mark.parametrize("how", list(DAMAGE))
def test_damaged_val_json_costs_its_history_not_the_run(tmp_path, caplog, how):
    out = tmp_path / "eval" / "val.json"
    validation = Validation(OmegaConf.create({"data": {"val": "v"}}), None, torch.device("cpu"), out)
    validation._append({"step": 2, "top1": 10.0})
    damage(out, how)
    with caplog.at_level(logging.WARNING):
        validation._append({"step": 4, "top1": 20.0})
    assert [h["step"] for h in read_json(out, VAL_RESULT)["history"]] == [4] and "val.json" in caplog.text


@pytest.mark.parametrize("how", list(DAMAGE))
def test_damaged_slurm_job_record_is_no_job(tmp_path, how):
    (tmp_path / JOB_RECORD).write_text(json.dumps({"job_id": "1234", "script": "x"}))
    assert recorded_job(tmp_path) == "1234"
    damage(tmp_path / JOB_RECORD, how)
    assert recorded_job(tmp_path) == ("x" if how == "values strings" else None)  # a string is a job id


@pytest.mark.parametrize("how", list(DAMAGE))
def test_export_of_a_run_whose_config_yaml_is_damaged_is_one_line(backbone, tmp_path, capsys, how):
    run = Path(shutil.copytree(backbone, tmp_path / "run"))
    (run / "config.yaml").write_text("meta: {name: toy}\n")
    damage(run / "config.yaml", how)
    code = cli(
        ["ckpt", "export", str(run), "--what", "student-backbone", "--format", "timm", "--out", str(tmp_path / "o")]
    )
    assert code == 2
    one_line_error(capsys, "config.yaml")
    try:  # an empty mapping is a recipe of defaults, with no trackers: nothing to attach
        attach_artifacts(run, [])
    except UserError as err:
        assert "config.yaml" in str(err) and "\n" not in str(err)


@pytest.fixture(scope="module")
def backbone(tmp_path_factory) -> Path:
    """A run whose checkpoint's student has a backbone (what `scale ckpt export` exports)."""
    run = tmp_path_factory.mktemp("backbone") / "run"
    saver, engine, _ = toy(run / "checkpoints", 1.0)
    engine.state["student"] = {"backbone": {"w": torch.ones(4)}}
    saver.save(2)
    return run


def test_export_out_onto_a_folder_a_read_only_folder_or_a_file_is_one_line(backbone, tmp_path, capsys):
    run = Path(shutil.copytree(backbone, tmp_path / "run"))
    export = ["ckpt", "export", str(run), "--what", "student-backbone", "--out"]
    (tmp_path / "folder").mkdir()
    assert cli([*export, str(tmp_path / "folder")]) == 2
    one_line_error(capsys, "--out", "folder")
    for fmt in ("torch", "safetensors"):
        assert cli([*export, str(tmp_path / "folder"), "--format", fmt]) == 2
        one_line_error(capsys, "folder")
    (tmp_path / "a_file").write_text("x")
    (run / "config.yaml").write_text(to_yaml(load_recipe("demo/dino_tiny")))
    assert cli([*export, str(tmp_path / "a_file"), "--format", "timm"]) == 2
    one_line_error(capsys, "a_file")
    assert cli([*export, str(tmp_path / "a_file" / "under"), "--format", "torch"]) == 2
    one_line_error(capsys, "a_file")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    if os.access(locked, os.W_OK):  # root writes anywhere it may: then a folder no one can write files in
        locked = Path("/proc/self")
    try:
        for fmt, name in (("safetensors", "w.safetensors"), ("torch", "w.pt")):
            assert cli([*export, str(locked / name), "--format", fmt]) == 2
            one_line_error(capsys, str(locked), "cannot write there")
    finally:
        (tmp_path / "locked").chmod(0o700)
    assert cli([*export, str(tmp_path / "a_file"), "--format", "torch"]) == 0  # an existing file: replaced
    assert torch.load(tmp_path / "a_file", weights_only=True)["w"].sum() == 4


# --- shards ---


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("shards")
    build_shards(imagefolder(make_imagefolder(tmp / "src")), tmp / "out", shard_size=10, progress=False)
    return tmp / "out"


@pytest.mark.parametrize("how", list(DAMAGE))
def test_damaged_shard_manifest_is_one_line_naming_it(shards, tmp_path, capsys, how):
    copy = Path(shutil.copytree(shards, tmp_path / "out"))
    damage(copy / "_info.json", how)
    with pytest.raises(UserError, match="_info.json"):
        read_manifest(copy)
    assert cli(["shards", "verify", str(copy)]) == 2
    one_line_error(capsys, "_info.json")


@pytest.mark.parametrize("how", list(DAMAGE))
def test_damaged_shard_index_is_one_line_and_rebuilt_by_build(shards, tmp_path, caplog, how):
    copy = Path(shutil.copytree(shards, tmp_path / "out"))
    manifest = read_manifest(copy)
    idx = copy / manifest["shards"][0]["index"]
    good = idx.read_bytes()
    damage(idx, how)
    with pytest.raises(UserError, match=f"{idx.name}: corrupt shard index"):
        read_index(copy, manifest["shards"][0])
    src = shards.parent / "src"
    with caplog.at_level(logging.WARNING):
        build_shards(imagefolder(src), copy, shard_size=10, progress=False, workers=1)
    assert idx.read_bytes() == good


# --- the readers themselves: field names in the message ---


def test_the_message_names_the_file_and_the_field(tmp_path):
    path = tmp_path / "meta.json"
    path.write_text(json.dumps({"step": 1, "engine": "ddp", "world_size": 1, "complete": True, "files": []}))
    with pytest.raises(BadFile, match=r"meta.json: files: a list, not an object"):
        CheckpointStore(tmp_path).read_meta(tmp_path)
    path.write_text(json.dumps({"step": 1, "engine": "ddp", "world_size": 1, "complete": True, "files": {"a.pt": "9"}}))
    with pytest.raises(BadFile, match=r"meta.json: files\['a.pt'\]: a string, not an integer"):
        CheckpointStore(tmp_path).read_meta(tmp_path)
    lines = tmp_path / "x.jsonl"
    lines.write_bytes(b'{"step": 1, "bytes": 2}\n{"step": 2, "bytes": "3"}\n{"step": 3, "by')
    with pytest.raises(BadFile, match=r"x.jsonl: line 2: bytes: a string, not an integer"):
        read_json_lines(lines, {"step": int, "bytes": int}, torn_tail=True)
    (tmp_path / "latest").write_bytes(b"\xff")
    with pytest.raises(BadFile, match="latest: not UTF-8"):
        read_line(tmp_path / "latest", r"step_\d+")
    (tmp_path / "c.yaml").write_text("a: &x [*x]\n")
    with pytest.raises(UserError, match="c.yaml"):
        read_yaml(tmp_path / "c.yaml", {})
    with pytest.raises(FileNotFoundError):  # a missing file is the caller's to handle (often: none yet)
        read_json(tmp_path / "none.json", {})


def test_one_reader_of_metrics_jsonl_strict_or_showing_what_it_can(tmp_path):
    """The report, the demo and the checkpoint bench read metrics.jsonl strictly, `scale status` and the trackers'
    replay as far as it reads: no file is no record; a torn last line (a kill, or the run writing it) is dropped; a
    bad line before it names its line, or is skipped; a file that cannot be read is an error, or no record."""
    path = tmp_path / "metrics.jsonl"
    assert read_metrics(path) == read_metrics(path, skip=True) == []
    path.write_text('{"step": 1}\n{"step": 2, "epoch": 0}\n{"step": 3, "ti')
    assert [r["step"] for r in read_metrics(path)] == [r["step"] for r in read_metrics(path, skip=True)] == [1, 2]
    path.write_text('{"step": 1}\n{"step": "two"}\n{"step": 3}\n')
    with pytest.raises(BadFile, match="line 2: step"):
        read_metrics(path)
    assert [r["step"] for r in read_metrics(path, skip=True)] == [1, 3]
    assert read_metrics(tmp_path, skip=True) == []  # a folder where the file should be
    with pytest.raises(IsADirectoryError):
        read_metrics(tmp_path)
