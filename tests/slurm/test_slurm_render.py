"""The rendered sbatch script, run by bash with stand-ins for srun and scontrol: quoting, the environment the tasks
get, requeue on the preemption exit status, signal relay, sweeps; and validation before anything is submitted."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scale.cli import main as cli
from scale.errors import PREEMPTED_EXIT_CODE, UserError
from scale.launch import slurm

EVIL = 'meta.notes=it\'s $(touch PWNED) `touch PWNED` "quoted" ; rm -rf / #'

FAKE_SRUN = """#!{python}
# stands in for srun: records its argv and environment, then behaves as FAKE_SRUN_MODE says: exit:N, preempted
# (tasks that checkpointed for preemption: the marker file, status 0) or wait (for a signal, then preempted)
import json, os, signal, sys, time
log = os.environ["FAKE_SRUN_LOG"]
keys = ("MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS", "NCCL_DEBUG", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "SCALE_PREEMPTED_MARKER")
json.dump({{"argv": sys.argv[1:], "pid": os.getpid(), "env": {{k: os.environ.get(k) for k in keys}}}}, open(log, "w"))
mode = os.environ.get("FAKE_SRUN_MODE", "exit:0")
if mode.startswith("exit:"):
    sys.exit(int(mode[5:]))
if mode == "preempted":
    open(os.environ["SCALE_PREEMPTED_MARKER"], "w").close()
    sys.exit(0)
got = []
for sig in (signal.SIGUSR1, signal.SIGTERM):
    signal.signal(sig, lambda n, f: got.append(signal.Signals(n).name))
open(log + ".ready", "w").close()
deadline = time.time() + 30
while not got and time.time() < deadline:
    time.sleep(0.02)
open(log + ".signals", "w").write(",".join(got))
if not got:
    sys.exit(1)
open(os.environ["SCALE_PREEMPTED_MARKER"], "w").close()
"""

FAKE_SCONTROL = """#!/bin/bash
# stands in for scontrol: records its arguments, answers `show hostnames`
echo "$*" >> "$FAKE_SCONTROL_LOG"
if [ "$1 $2" = "show hostnames" ]; then echo node017; echo node018; fi
exit "${FAKE_SCONTROL_STATUS:-0}"
"""


@pytest.fixture
def recipe(tmp_path) -> Path:
    folder = tmp_path / "my recipes"
    folder.mkdir()
    path = folder / "tiny run.yaml"
    path.write_text("meta:\n  name: tiny/run\ntrain:\n  max_steps: 2\n")
    return path


@pytest.fixture
def fake_slurm(tmp_path) -> dict:
    """PATH with fake srun and scontrol; returns the environment the script is run with."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN.format(python=sys.executable, preempted=PREEMPTED_EXIT_CODE))
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "NCCL_", "TORCH_NCCL_"))}
    env.update(
        PATH=f"{bin_dir}:{env['PATH']}",
        FAKE_SRUN_LOG=str(tmp_path / "srun.json"),
        FAKE_SCONTROL_LOG=str(tmp_path / "scontrol.log"),
        SLURM_JOB_ID="4321",
        SLURM_JOB_NODELIST="node[017-018]",
        SLURM_NTASKS="8",
        OMP_NUM_THREADS="7",
    )
    return env


def run_script(script: Path, env: dict, cwd: Path, **extra) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(script)], env={**env, **extra}, cwd=cwd, capture_output=True, text=True, timeout=60
    )


def srun_call(env: dict) -> dict:
    return json.loads(Path(env["FAKE_SRUN_LOG"]).read_text())


def scontrol_calls(env: dict) -> list[str]:
    path = Path(env["FAKE_SCONTROL_LOG"])
    return path.read_text().splitlines() if path.exists() else []


def test_time_formats():
    assert slurm.time_seconds("90") == 90 * 60
    assert slurm.time_seconds("10:30") == 10 * 60 + 30
    assert slurm.time_seconds("2:00:00") == 7200
    assert slurm.time_seconds("1-12") == 86400 + 12 * 3600
    assert slurm.time_seconds("1-00:30") == 86400 + 1800
    assert slurm.time_seconds("3-01:02:03") == 3 * 86400 + 3723
    assert slurm.time_seconds("infinite") is None
    for bad in ("1h", "1:2:3:4", "-5", "1-", "ten", "1.5"):
        with pytest.raises(UserError, match="--time"):
            slurm.time_seconds(bad)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(nodes=0), "--nodes 0"),
        (dict(gpus_per_node=-1), "--gpus-per-node -1"),
        (dict(tasks_per_node=0), "--tasks-per-node 0"),
        (dict(gpus_per_node=4, tasks_per_node=2), "one task per GPU"),
        (dict(cpus_per_task=0), "--cpus-per-task 0"),
        (dict(time="2 hours"), "--time '2 hours'"),
        (dict(time="1:30"), "not longer than the preemption signal lead"),
        (dict(time="0"), "not longer than the preemption signal lead"),
        (dict(mem="lots"), "--mem 'lots'"),
        (dict(account='a"; rm -rf /'), "--account"),
        (dict(qos="normal\n#SBATCH --nodes=99"), "--qos"),
        (dict(job_name=""), "--job-name"),
    ],
)
def test_invalid_options_fail_before_anything_is_written(recipe, tmp_path, options, message):
    run_dir = tmp_path / "run"
    with pytest.raises(UserError, match=message.replace("(", r"\(")):
        slurm.plan(str(recipe), [], run_dir, slurm.SlurmOptions(**options))
    assert not run_dir.exists()


def test_unknown_partition_is_rejected_when_sinfo_answers(recipe, tmp_path, monkeypatch):
    monkeypatch.setattr(slurm, "partitions", lambda: ["debug", "gpu"])
    with pytest.raises(UserError, match="--partition 'gpu-big': not a partition of this cluster.*debug, gpu"):
        slurm.plan(str(recipe), [], tmp_path / "run", slurm.SlurmOptions(partition="gpu-big"))
    slurm.plan(str(recipe), [], tmp_path / "run", slurm.SlurmOptions(partition="gpu"))


def test_bad_recipe_override_and_run_dir_fail_with_their_names(recipe, tmp_path):
    with pytest.raises(UserError, match="unknown key 'train.max_stepz'"):
        slurm.plan(str(recipe), ["train.max_stepz=3"], tmp_path / "run", slurm.SlurmOptions())
    with pytest.raises(UserError, match="--run-dir"):
        slurm.plan(str(recipe), [], tmp_path / "100%", slurm.SlurmOptions())


def test_dry_run_renders_a_cpu_job_and_submits_nothing(recipe, tmp_path, capsys):
    run_dir = tmp_path / "run dir"
    assert (
        cli(
            [
                "submit",
                str(recipe),
                "--run-dir",
                str(run_dir),
                "--tasks-per-node",
                "2",
                "--time",
                "1:00:00",
                "--dry-run",
            ]
        )
        == 0
    )
    script = run_dir / slurm.SCRIPT_NAME
    text = script.read_text()
    assert capsys.readouterr().out.startswith(text)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert "#SBATCH --nodes=1" in directives
    assert "#SBATCH --ntasks-per-node=2" in directives
    assert "#SBATCH --time=1:00:00" in directives
    assert "#SBATCH --requeue" in directives
    assert "#SBATCH --signal=B:USR1@120" in directives
    assert "#SBATCH --open-mode=append" in directives
    assert f'#SBATCH --output="{run_dir}/slurm-%j.out"' in directives
    assert f'#SBATCH --error="{run_dir}/slurm-%j.err"' in directives
    assert "#SBATCH --job-name=tiny_run" in directives
    assert not any("gpus" in line for line in directives)
    assert "NCCL" not in text  # a CPU job: gloo
    assert not (run_dir / slurm.JOB_RECORD).exists()


def test_gpu_job_runs_one_task_per_gpu_with_nccl_defaults(recipe, tmp_path, monkeypatch):
    monkeypatch.setattr(slurm, "partitions", lambda: None)  # as on a machine without Slurm
    options = slurm.SlurmOptions(
        nodes=64,
        gpus_per_node=8,
        partition="gpu",
        account="proj 1",
        qos="high",
        constraint="a100&ib",
        cpus_per_task=10,
        mem="0",
        time="2-00:00:00",
    )
    job = slurm.plan(str(recipe), [], tmp_path / "run", options)
    text = slurm.render(job)
    for line in (
        "--nodes=64",
        "--ntasks-per-node=8",
        "--gpus-per-node=8",
        "--partition=gpu",
        '--account="proj 1"',
        "--qos=high",
        "--constraint=a100&ib",
        "--cpus-per-task=10",
        "--mem=0",
        "--time=2-00:00:00",
    ):
        assert f"#SBATCH {line}\n" in text
    assert "NCCL_DEBUG=${NCCL_DEBUG:-WARN}" in text
    assert "srun --kill-on-bad-exit=1 --cpus-per-task=10 " in text


@pytest.mark.slow  # spawns ranks
def test_quoting_the_tasks_get_exactly_the_recipe_overrides_and_run_dir(recipe, tmp_path, fake_slurm):
    run_dir = tmp_path / "run dir 'x'"
    overrides = [EVIL, "optim.lr=0.001", "meta.row=a b"]
    job = slurm.plan(str(recipe), overrides, run_dir, slurm.SlurmOptions(gpus_per_node=2))
    script = slurm.write(job)
    out = run_script(script, fake_slurm, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    call = srun_call(fake_slurm)
    assert call["argv"] == [
        "--kill-on-bad-exit=1",
        "--cpus-per-task=5",  # data.workers 4 + 1 (scale.launch.slurm.resource_defaults)
        sys.executable,
        "-m",
        "scale.cli",
        "train",
        str(recipe),
        *overrides,
        "--run-dir",
        str(run_dir),
    ]
    assert not (tmp_path / "PWNED").exists()
    # rendezvous on the first node, port from the job id as scale.engine.dist.slurm_port computes it
    from scale.engine.dist import slurm_port

    assert call["env"]["MASTER_ADDR"] == "node017"
    assert call["env"]["MASTER_PORT"] == str(slurm_port("4321"))
    assert call["env"]["NCCL_DEBUG"] == "WARN"
    assert call["env"]["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert call["env"]["OMP_NUM_THREADS"] == "1"  # SLURM_CPUS_PER_TASK unset: one thread per task
    assert not any(c.startswith("requeue") for c in scontrol_calls(fake_slurm))


def test_relative_recipe_path_is_passed_on_absolute(recipe, tmp_path, monkeypatch):
    monkeypatch.chdir(recipe.parent)
    job = slurm.plan(recipe.name, [], tmp_path / "run", slurm.SlurmOptions())
    assert job.recipe == str(recipe)


@pytest.mark.slow  # spawns ranks
def test_preempted_tasks_requeue_the_job(recipe, tmp_path, fake_slurm):
    """Preempted tasks exit 0 (so that srun --kill-on-bad-exit does not end the slower ones) and leave the marker
    file; the script requeues on it and removes it. A bare preemption status (3) from srun requeues too."""
    script = slurm.write(slurm.plan(str(recipe), [], tmp_path / "run", slurm.SlurmOptions()))
    (tmp_path / "run").mkdir(exist_ok=True)
    marker = tmp_path / "run" / ".preempted-4321"
    marker.touch()  # a stale marker from a killed earlier start must not count
    out = run_script(script, fake_slurm, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert srun_call(fake_slurm)["env"]["SCALE_PREEMPTED_MARKER"] == str(marker)
    assert not any(c.startswith("requeue") for c in scontrol_calls(fake_slurm))
    for mode in ("preempted", f"exit:{PREEMPTED_EXIT_CODE}"):
        out = run_script(script, fake_slurm, cwd=tmp_path, FAKE_SRUN_MODE=mode)
        assert out.returncode == 0, out.stderr
        assert scontrol_calls(fake_slurm).count("requeue 4321") == (1 if mode == "preempted" else 2)
        assert not marker.exists()


@pytest.mark.slow  # spawns ranks
def test_failed_requeue_and_other_failures_keep_their_status(recipe, tmp_path, fake_slurm):
    script = slurm.write(slurm.plan(str(recipe), [], tmp_path / "run", slurm.SlurmOptions()))
    out = run_script(script, fake_slurm, cwd=tmp_path, FAKE_SRUN_MODE="exit:1")
    assert out.returncode == 1
    assert not any(c.startswith("requeue") for c in scontrol_calls(fake_slurm))
    out = run_script(script, fake_slurm, cwd=tmp_path, FAKE_SRUN_MODE="preempted", FAKE_SCONTROL_STATUS="1")
    assert out.returncode == PREEMPTED_EXIT_CODE
    assert "not requeued. Continue it with: sbatch" in out.stderr


def _start_waiting_job(script: Path, env: dict, cwd: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        ["bash", str(script)],
        env={**env, "FAKE_SRUN_MODE": "wait"},
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    ready = Path(env["FAKE_SRUN_LOG"] + ".ready")
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline and proc.poll() is None, "the fake srun did not start"
        time.sleep(0.02)
    return proc


@pytest.mark.slow  # spawns ranks
def test_usr1_to_the_batch_shell_is_relayed_to_the_tasks(recipe, tmp_path, fake_slurm):
    script = slurm.write(slurm.plan(str(recipe), [], tmp_path / "run", slurm.SlurmOptions()))
    proc = _start_waiting_job(script, fake_slurm, tmp_path)
    proc.send_signal(signal.SIGUSR1)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert Path(fake_slurm["FAKE_SRUN_LOG"] + ".signals").read_text() == "SIGUSR1"
    assert "requeue 4321" in scontrol_calls(fake_slurm)


@pytest.mark.slow  # spawns ranks
def test_sigterm_keeps_the_batch_shell_alive_until_the_tasks_checkpoint_and_is_not_requeued(
    recipe, tmp_path, fake_slurm
):
    """scancel sends SIGTERM to the batch shell and to the tasks: the shell outlives the tasks, and a run that was
    told to terminate stays stopped (Slurm itself requeues jobs it preempts with PreemptMode=REQUEUE)."""
    script = slurm.write(slurm.plan(str(recipe), [], tmp_path / "run", slurm.SlurmOptions()))
    proc = _start_waiting_job(script, fake_slurm, tmp_path)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert proc.poll() is None, "the batch shell died on SIGTERM"
    assert not Path(fake_slurm["FAKE_SRUN_LOG"] + ".signals").exists()  # not relayed: Slurm signals the tasks
    os.kill(srun_call(fake_slurm)["pid"], signal.SIGTERM)  # what Slurm does to the step
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == PREEMPTED_EXIT_CODE, stderr
    assert not any(c.startswith("requeue") for c in scontrol_calls(fake_slurm))
    assert "not requeued. Continue it with: sbatch" in stderr


SWEEP = """\
- {optim.lr: 0.001, meta.notes: "it's a \\"test\\""}
- [optim.lr=0.002, 'meta.notes=a b']
- optim: {lr: 0.003}
  meta: {notes: "1e-3"}
"""


@pytest.mark.slow  # spawns ranks
def test_sweep_is_one_array_task_and_run_directory_per_override_set(recipe, tmp_path, fake_slurm):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(SWEEP)
    job = slurm.plan(str(recipe), ["train.max_steps=5"], tmp_path / "sweep", slurm.SlurmOptions(), sweep=sweep)
    script = slurm.write(job)
    text = script.read_text()
    assert "#SBATCH --array=0-2\n" in text
    assert f"#SBATCH --output={tmp_path}/sweep/task_%3a/slurm-%A_%a.out\n" in text
    expected = [
        ["optim.lr=0.001", 'meta.notes=it\'s a "test"'],
        ["optim.lr=0.002", "meta.notes=a b"],
        ["optim.lr=0.003", 'meta.notes="1e-3"'],
    ]
    for index, extra in enumerate(expected):
        task_dir = tmp_path / "sweep" / f"task_{index:03d}"
        assert task_dir.is_dir()  # Slurm opens the task's stdout there before the script starts
        out = run_script(script, fake_slurm, cwd=tmp_path, SLURM_ARRAY_TASK_ID=str(index))
        assert out.returncode == 0, out.stderr
        assert srun_call(fake_slurm)["argv"][6:] == ["train.max_steps=5", *extra, "--run-dir", str(task_dir)]
    # each override set reads back with the intended types
    from scale.config import load_recipe

    assert load_recipe(str(recipe), expected[2]).meta.notes == "1e-3"
    assert load_recipe(str(recipe), expected[0]).meta.notes == 'it\'s a "test"'


@pytest.mark.parametrize(
    "content, message",
    [
        ("{optim.lr: 0.1}", "expected a non-empty YAML list"),
        ("[]", "expected a non-empty YAML list"),
        ("- 3", "entry 0 must be a mapping"),
        ("- {optim.lr: 0.1}\n- {optim.lrr: 0.2}", "entry 1: command line: unknown key 'optim.lrr'"),
        ("- [a b]", "entry 0: bad override 'a b'"),
        ("- [", "not valid YAML"),
    ],
)
def test_bad_sweep_files_name_the_file_and_entry(recipe, tmp_path, content, message):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(content)
    with pytest.raises(UserError, match=f"--sweep {sweep}.*{message}".replace("(", r"\(")):
        slurm.plan(str(recipe), [], tmp_path / "run", slurm.SlurmOptions(), sweep=sweep)


def test_submit_without_slurm_says_to_use_dry_run(recipe, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    job = slurm.plan(str(recipe), [], tmp_path / "run", slurm.SlurmOptions())
    slurm.write(job)
    with pytest.raises(UserError, match="sbatch not found.*--dry-run"):
        slurm.submit(job)


def test_custom_template_errors_name_the_template(recipe, tmp_path):
    job = slurm.plan(str(recipe), [], tmp_path / "run", slurm.SlurmOptions())
    with pytest.raises(UserError, match="--template .*missing.j2: file not found"):
        slurm.render(job, tmp_path / "missing.j2")
    bad = tmp_path / "bad.j2"
    bad.write_text("#!/bin/bash\n{% if %}\n")
    with pytest.raises(UserError, match="--template .*bad.j2: line 2"):
        slurm.render(job, bad)
    unknown = tmp_path / "unknown.j2"
    unknown.write_text("#!/bin/bash\necho {{ opts.no_such_option }}\n")
    with pytest.raises(UserError, match="no_such_option"):
        slurm.render(job, unknown)
    custom = tmp_path / "custom.j2"
    custom.write_text("#!/bin/bash\n#SBATCH --nodes={{ opts.nodes }}\nmodule load cuda\n")
    assert slurm.render(job, custom) == "#!/bin/bash\n#SBATCH --nodes=1\nmodule load cuda\n"


def test_continue_hint_is_a_shell_command_for_any_path(recipe, tmp_path, fake_slurm):
    """The hint after a failed requeue quotes the script's path (a run directory with a space and a quote)."""
    run = tmp_path / "my run's dir"
    script = slurm.write(slurm.plan(str(recipe), [], run, slurm.SlurmOptions()))
    out = run_script(script, fake_slurm, cwd=tmp_path, FAKE_SRUN_MODE="preempted", FAKE_SCONTROL_STATUS="1")
    assert out.returncode == PREEMPTED_EXIT_CODE
    hint = out.stderr.split("Continue it with: ", 1)[1].splitlines()[0]
    assert shlex.split(hint) == ["sbatch", str(script)]


def test_a_gpu_job_asks_for_its_loaders_cpus_and_warns_of_what_slurm_decides_alone(recipe, tmp_path):
    """The sbatch had no --cpus-per-task, --time or --mem unless given (Slurm's default: often one CPU per task,
    for 4 loader workers per rank), and nothing checked that data.train exists."""
    job = slurm.plan(str(recipe), ["data.workers=6"], tmp_path / "run", slurm.SlurmOptions(gpus_per_node=2))
    text = slurm.render(job)
    assert "#SBATCH --cpus-per-task=7\n" in text and "srun --kill-on-bad-exit=1 --cpus-per-task=7 " in text
    summary = "\n".join(job.summary())
    assert "warning: no --time" in summary and "warning: no --mem" in summary
    assert "warning: data.train" in summary and "does not exist on this machine" in summary
    (tmp_path / "shards").mkdir()
    given = slurm.SlurmOptions(gpus_per_node=2, cpus_per_task=3, time="1:00:00", mem="64G")
    data = [f"data.train={tmp_path / 'shards'}", f"data.val={tmp_path / 'shards'}"]
    job = slurm.plan(str(recipe), data, tmp_path / "run", given)
    assert "#SBATCH --cpus-per-task=3\n" in slurm.render(job) and not [n for n in job.summary() if "warning" in n]
