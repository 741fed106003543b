"""`scale status`: progress, throughput, ETA and the last checkpoint read from a run directory, Slurm state from
scontrol or sacct (stand-ins here; the cluster tests use the real ones)."""

import json
import os
from pathlib import Path

import pytest

from scale.cli import main as cli
from scale.launch import slurm
from scale.launch.status import last_checkpoint, run_status


def write_run(root: Path, steps_times: list[tuple[int, float]], max_steps: int | None = 30) -> Path:
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(
        f"train:\n  epochs: 100\n  global_batch: 8\n  max_steps: "
        f"{'null' if max_steps is None else max_steps}\n  samples_per_epoch: null\n"
    )
    with open(root / "metrics.jsonl", "w") as f:
        for step, t in steps_times:
            f.write(
                json.dumps({"step": step, "time": t, "loss": 10.0 / step, "epoch": step // 10, "images_per_s": 16.0})
                + "\n"
            )
    return root


@pytest.fixture
def no_slurm(monkeypatch, tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))


def test_progress_rate_and_eta(tmp_path, no_slurm):
    run = write_run(tmp_path / "run", [(s, 1000.0 + 2 * s) for s in range(1, 11)])
    status = run_status(run)
    assert status.step == 10 and status.total_steps == 30
    assert status.epoch == 1 and status.loss == pytest.approx(1.0) and status.images_per_s == 16.0
    assert status.steps_per_s == pytest.approx(0.5)
    assert status.eta_s == pytest.approx(40.0)
    assert status.slurm is None and status.job_id is None


def test_rate_ignores_the_pause_of_a_requeue(tmp_path, no_slurm):
    before = [(s, 1000.0 + 2 * s) for s in range(1, 6)]
    after = [(s, 5000.0 + s) for s in range(6, 11)]  # requeued: an hour later, twice as fast
    status = run_status(write_run(tmp_path / "run", before + after))
    assert status.steps_per_s == pytest.approx(1.0)
    assert status.eta_s == pytest.approx(20.0)


def test_finished_run_has_zero_eta_and_half_written_lines_are_skipped(tmp_path, no_slurm):
    run = write_run(tmp_path / "run", [(s, 1000.0 + s) for s in range(1, 31)])
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 31, "ti')
    status = run_status(run)
    assert status.step == 30 and status.eta_s == 0.0


def test_total_steps_from_epochs_when_no_max_steps(tmp_path, no_slurm):
    run = write_run(tmp_path / "run", [(1, 1.0), (2, 2.0)], max_steps=None)
    (run / "config.yaml").write_text("train:\n  epochs: 3\n  global_batch: 8\n  samples_per_epoch: 80\n")
    assert run_status(run).total_steps == 30


def test_an_epoch_mode_run_has_an_eta(tmp_path, no_slurm):
    """Recipes leave samples_per_epoch null (the epoch is the dataset): status showed no ETA."""
    run = write_run(tmp_path / "run", [(s, 1000.0 + s) for s in range(1, 21)], max_steps=None)  # 10 steps/epoch
    status = run_status(run)
    assert status.total_steps == 1000 and status.eta_s == pytest.approx(980.0)


def test_status_of_a_folder_that_is_not_a_run_exits_2(tmp_path, no_slurm, capsys):
    (tmp_path / "photos").mkdir()
    assert cli(["status", str(tmp_path / "photos")]) == 2
    assert "not a run directory" in capsys.readouterr().err


def test_empty_or_unknown_run_directory_gives_empty_fields(tmp_path, no_slurm):
    (tmp_path / "run").mkdir()
    status = run_status(tmp_path / "run")
    assert (status.step, status.total_steps, status.eta_s, status.last_checkpoint) == (None, None, None, None)


def test_last_checkpoint_pointer_file_symlink_or_newest_directory(tmp_path):
    ckpt = tmp_path / "checkpoints"
    for step in (10, 20, 30):
        (ckpt / f"step_{step:09d}").mkdir(parents=True)
    (ckpt / ".tmp-step_000000040").mkdir()  # an interrupted write is never the last checkpoint
    assert last_checkpoint(ckpt) == "step_000000030"
    (ckpt / "latest").write_text("step_000000020\n")
    assert last_checkpoint(ckpt) == "step_000000020"
    (ckpt / "latest").unlink()
    (ckpt / "latest").symlink_to("step_000000010")
    assert last_checkpoint(ckpt) == "step_000000010"
    (ckpt / "latest").unlink()
    (ckpt / "latest").write_text("step_000000099\n")  # a pointer to nothing: fall back to the directories
    assert last_checkpoint(ckpt) == "step_000000030"
    assert last_checkpoint(tmp_path / "missing") is None


def fake_tool(bin_dir: Path, name: str, script: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text("#!/bin/bash\n" + script)
    (bin_dir / name).chmod(0o755)


def test_slurm_state_from_scontrol_then_sacct(tmp_path, monkeypatch):
    run = write_run(tmp_path / "run", [(1, 1.0), (2, 2.0)])
    (run / slurm.JOB_RECORD).write_text(json.dumps({"job_id": "77"}))
    bin_dir = tmp_path / "bin"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    fake_tool(
        bin_dir,
        "scontrol",
        'echo "JobId=$4 JobName=a b JobState=RUNNING Reason=None Restarts=2 '
        'RunTime=00:01:40 TimeLimit=01:00:00 ExitCode=0:0 NodeList=node[1-2]"\n',
    )
    fake_tool(bin_dir, "sacct", "exit 1\n")
    state = run_status(run).slurm
    assert state == {
        "source": "scontrol",
        "jobstate": "RUNNING",
        "reason": "None",
        "restarts": "2",
        "runtime": "00:01:40",
        "timelimit": "01:00:00",
        "exitcode": "0:0",
        "nodelist": "node[1-2]",
    }
    fake_tool(bin_dir, "scontrol", 'echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1\n')
    fake_tool(bin_dir, "sacct", 'echo "COMPLETED|00:05:00|0:0|node1"\n')
    assert run_status(run).slurm == {
        "source": "sacct",
        "jobstate": "COMPLETED",
        "runtime": "00:05:00",
        "exitcode": "0:0",
        "nodelist": "node1",
    }
    fake_tool(bin_dir, "sacct", "exit 1\n")
    assert run_status(run).slurm is None


def test_status_command_table_json_and_sweeps(tmp_path, no_slurm, capsys):
    sweep = tmp_path / "sweep"
    for index in range(2):
        write_run(sweep / f"task_{index:03d}", [(s, 1000.0 + s) for s in range(1, 4 + index)])
    assert cli(["status", str(sweep), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["step"] for r in rows] == [3, 4]
    assert cli(["status", str(sweep / "task_001")]) == 0
    table = capsys.readouterr().out
    assert "4/30" in table and "16.0" in table
    assert cli(["status", str(tmp_path / "nope")]) == 2
    assert "run directory not found" in capsys.readouterr().err
