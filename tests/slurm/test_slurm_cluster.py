"""The local Slurm cluster itself, and the rendered script on it with a stand-in for `scale train`: requeue after
the preemption signal, logs appended across restarts, per-task run directories of an array."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from slurm_jobs import job_logs, wait_for_file, wait_for_state

from scale.cli import main as cli
from scale.errors import PREEMPTED_EXIT_CODE
from scale.launch import slurm

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("slurm_cluster")]

# Stands in for `python -m scale.cli train RECIPE ... --run-dir DIR`: records each start, and on the first start
# waits for SIGUSR1 or SIGTERM and exits as `scale train` does after its preemption checkpoint, rank 1 later. Only
# that start imports scale's exit status (scale.loop.preemption imports torch: ~2-5 CPU s a start).
FAKE_TRAIN = """#!{python}
import json, os, signal, sys, time
from pathlib import Path
run_dir = Path(sys.argv[sys.argv.index("--run-dir") + 1])
rank, restart = os.environ["SLURM_PROCID"], os.environ.get("SLURM_RESTART_COUNT", "0")
with open(run_dir / "starts", "a") as f:
    f.write(json.dumps([restart, rank, os.environ["SLURM_NTASKS"], os.environ["MASTER_ADDR"], *sys.argv[1:]]) + "\\n")
if restart == "0" and os.environ.get("FAKE_TRAIN_WAIT"):
    from scale.loop.preemption import launcher_status
    got = []
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, lambda n, f: got.append(n))
    (run_dir / f"ready{{rank}}").touch()
    deadline = time.time() + 120
    while not got and time.time() < deadline:
        time.sleep(0.1)
    if got and rank == "1":  # finishes later than rank 0, no longer handling signals (as while Python exits)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        time.sleep(2)
    sys.exit(launcher_status({preempted}) if got else 1)
"""


@pytest.fixture
def fake_train(tmp_path) -> str:
    # no space in this name: proctrack/linuxproc misreads /proc/PID/stat when the command name has one, and
    # could then neither signal nor kill the task
    path = tmp_path / "fake_python"
    path.write_text(FAKE_TRAIN.format(python=sys.executable, preempted=PREEMPTED_EXIT_CODE))
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def recipe(tmp_path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text("meta:\n  name: slurm-test\n")
    return path


def test_batch_job_and_two_task_step(tmp_path):
    script = tmp_path / "hello.sbatch"
    out = tmp_path / "hello.out"
    script.write_text(
        f"#!/bin/bash\n#SBATCH --ntasks=2\n#SBATCH --output={out}\nhostname\n"
        "srun bash -c 'echo task $SLURM_PROCID of $SLURM_NTASKS'\n"
    )
    done = subprocess.run(["sbatch", "--wait", str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = out.read_text().splitlines()
    assert sorted(lines[1:]) == ["task 0 of 2", "task 1 of 2"]


@pytest.mark.parametrize("target", [["--batch"], []], ids=["batch-shell", "tasks"])
def test_preemption_signal_requeues_into_the_same_run_directory(recipe, tmp_path, fake_train, monkeypatch, target):
    monkeypatch.setenv("FAKE_TRAIN_WAIT", "1")  # sbatch passes the submitting environment on to the job
    options = slurm.SlurmOptions(tasks_per_node=2, time="10")
    job = slurm.plan(str(recipe), ["train.max_steps=3"], tmp_path / "run dir", options)
    job.python = fake_train
    slurm.write(job)
    job_id = slurm.submit(job)
    assert slurm.recorded_job(job.run_dir) == job_id
    for rank in (0, 1):
        wait_for_file(job.run_dir / f"ready{rank}", timeout=120, job_id=job_id)
    # --batch: what `--signal=B:USR1@...` does ahead of the time limit, the batch shell relays it to the tasks;
    # without it, scancel signals the tasks directly
    subprocess.run(["scancel", *target, "--signal=USR1", job_id], check=True)
    info = wait_for_state(job_id, {"COMPLETED"}, timeout=180)
    assert info["jobstate"] == "COMPLETED", job_logs(job.run_dir)
    assert info["restarts"] == "1"
    starts = sorted(json.loads(line) for line in (job.run_dir / "starts").read_text().splitlines())
    assert [s[:4] for s in starts] == [
        ["0", "0", "2", "localhost"],
        ["0", "1", "2", "localhost"],
        ["1", "0", "2", "localhost"],
        ["1", "1", "2", "localhost"],
    ]
    assert starts[0][4:] == [
        "-m",
        "scale.cli",
        "train",
        str(recipe),
        "train.max_steps=3",
        "--run-dir",
        str(job.run_dir),
    ]
    log = (job.run_dir / f"slurm-{job_id}.out").read_text()
    assert "(restart 0)" in log and "(restart 1)" in log  # appended across the requeue, not truncated
    assert f"requeueing job {job_id}" in (job.run_dir / f"slurm-{job_id}.err").read_text()


def test_scancel_stops_the_run_without_requeue(recipe, tmp_path, fake_train, monkeypatch):
    monkeypatch.setenv("FAKE_TRAIN_WAIT", "1")
    job = slurm.plan(str(recipe), [], tmp_path / "run", slurm.SlurmOptions(tasks_per_node=2, time="10"))
    job.python = fake_train
    slurm.write(job)
    job_id = slurm.submit(job)
    for rank in (0, 1):
        wait_for_file(job.run_dir / f"ready{rank}", timeout=120, job_id=job_id)
    subprocess.run(["scancel", job_id], check=True)
    err = job.run_dir / f"slurm-{job_id}.err"
    deadline = time.monotonic() + 60
    while "not requeued" not in (err.read_text() if err.exists() else ""):
        assert time.monotonic() < deadline, job_logs(job.run_dir)
        time.sleep(0.2)
    info = wait_for_state(job_id, {"CANCELLED"}, timeout=60)
    assert (info["jobstate"], info["restarts"]) == ("CANCELLED", "0"), job_logs(job.run_dir)


def test_sweep_array_runs_each_task_in_its_directory(recipe, tmp_path, fake_train):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("- {optim.lr: 0.001}\n- {optim.lr: 0.002}\n")
    job = slurm.plan(str(recipe), [], tmp_path / "sweep", slurm.SlurmOptions(), sweep=sweep)
    job.python = fake_train
    slurm.write(job)
    job_id = slurm.submit(job)
    for index, lr in enumerate(("0.001", "0.002")):
        task_dir = job.run_dir / f"task_{index:03d}"
        task_job = slurm.recorded_job(task_dir)
        assert task_job == f"{job_id}_{index}"
        info = wait_for_state(task_job, {"COMPLETED"}, timeout=120)
        assert info["jobstate"] == "COMPLETED", job_logs(job.run_dir)
        argv = json.loads((task_dir / "starts").read_text())[4:]
        assert argv[-3:] == [f"optim.lr={lr}", "--run-dir", str(task_dir)]
        assert (task_dir / f"slurm-{job_id}_{index}.out").exists()


def test_submit_rejects_an_unknown_partition(recipe, tmp_path, capsys):
    assert cli(["submit", str(recipe), "--partition", "nosuch", "--run-dir", str(tmp_path / "run")]) == 2
    assert "--partition 'nosuch': not a partition of this cluster (sinfo lists: debug)" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
