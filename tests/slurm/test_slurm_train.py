"""`scale submit` of real training runs on the local Slurm cluster (2 CPU tasks, gloo): a run to the end, a run
preempted mid-way that checkpoints, is requeued and continues, and a sweep array of two runs."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from slurm_jobs import job_logs, wait_for_state

from scale.cli import main as cli
from scale.launch import slurm

try:
    import scale.loop.train  # noqa: F401
except ImportError:
    pytest.skip("needs scale train", allow_module_level=True)


pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("slurm_cluster")]

RECIPE = str(Path(__file__).resolve().parent / "tiny_dino.yaml")


@pytest.fixture(scope="module")
def data_env(embedded_data):
    """SCALE_DATA pointing at the embedded data sets; sbatch hands the submitting environment on to the job."""
    saved = {k: os.environ.get(k) for k in ("SCALE_DATA", "OMP_NUM_THREADS", "PYTHONWARNINGS")}
    os.environ.update(SCALE_DATA=str(embedded_data), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    yield embedded_data
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def submit(args: list[str], capsys) -> str:
    assert cli(["submit", RECIPE, *args]) == 0
    out = capsys.readouterr().out
    assert out.startswith("submitted job ")
    return out.split()[2].rstrip(";")


def metric_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


def test_two_task_training_job_runs_to_the_end(data_env, tmp_path, capsys):
    run_dir = tmp_path / "run dir"
    job_id = submit(["train.max_steps=4", "--tasks-per-node", "2", "--time", "10", "--run-dir", str(run_dir)], capsys)
    info = wait_for_state(job_id, {"COMPLETED"}, timeout=300)
    assert info["jobstate"] == "COMPLETED", job_logs(run_dir)
    assert metric_steps(run_dir)[-1] == 4
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_000000004"
    assert (run_dir / "config.yaml").exists()
    assert sorted(p.name for p in (run_dir / "logs").glob("rank*.log")) == ["rank0.log", "rank1.log"]
    assert cli(["status", str(run_dir), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)[0]
    assert (status["step"], status["total_steps"], status["last_checkpoint"]) == (4, 4, "step_000000004")
    assert status["eta_s"] == 0.0
    assert status["job_id"] == job_id and status["slurm"]["jobstate"] == "COMPLETED"


def test_preempted_job_checkpoints_is_requeued_and_continues(data_env, tmp_path, capsys):
    run_dir = tmp_path / "run"
    steps = 24  # the notice comes after step 3: 21 steps to spare for its way through Slurm
    job_id = submit(
        [f"train.max_steps={steps}", "--tasks-per-node", "2", "--time", "15", "--run-dir", str(run_dir)], capsys
    )
    deadline = time.monotonic() + 300
    while len(metric_steps(run_dir)) < 3:
        assert time.monotonic() < deadline and (slurm.job_state(job_id) or {}).get("jobstate") in (
            "PENDING",
            "RUNNING",
        ), job_logs(run_dir)
        time.sleep(0.2)
    # the signal `--signal=B:USR1@...` sends ahead of the time limit: to the batch shell, which relays it
    subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], check=True)
    info = wait_for_state(job_id, {"COMPLETED"}, timeout=600)
    logs = job_logs(run_dir)
    assert info["jobstate"] == "COMPLETED", logs
    assert info["restarts"] == "1", logs
    err = (run_dir / f"slurm-{job_id}.err").read_text()
    assert f"requeueing job {job_id}" in err
    resumed = [line for line in err.splitlines() if "resumed from" in line]
    assert len(resumed) == 1, logs
    # the step count continues from the checkpoint: every step logged once, in order, up to the end
    logged = metric_steps(run_dir)
    assert logged == list(range(1, steps + 1)), logs
    ckpt_step = int(resumed[0].rsplit("at step ", 1)[1])
    assert 3 <= ckpt_step < steps
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step_{steps:09d}"


def test_sweep_array_trains_one_run_directory_per_task(data_env, tmp_path, capsys):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("- {optim.lr: 0.001}\n- {optim.lr: 0.002}\n")
    root = tmp_path / "sweep"
    job_id = submit(["train.max_steps=3", "--sweep", str(sweep), "--time", "10", "--run-dir", str(root)], capsys)
    for index, lr in enumerate((0.001, 0.002)):
        task_dir = root / f"task_{index:03d}"
        info = wait_for_state(f"{job_id}_{index}", {"COMPLETED"}, timeout=300)
        assert info["jobstate"] == "COMPLETED", job_logs(task_dir)
        assert metric_steps(task_dir)[-1] == 3
        assert (task_dir / "checkpoints" / "latest").read_text().strip() == "step_000000003"
        assert f"lr: {lr}" in (task_dir / "config.yaml").read_text()
    assert cli(["status", str(root), "--json"]) == 0
    assert [s["step"] for s in json.loads(capsys.readouterr().out)] == [3, 3]
