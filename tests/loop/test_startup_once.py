"""Start-up reads the run directory once: `scale train` checks that the run can continue with the recipe
(check_resumable) and lists the sealed checkpoints once per process, and the Trainer uses what it read; only the
resume itself lists them again (scale.checkpoint.checkpointer)."""

from collections import Counter

import pytest

import scale.checkpoint.resume
import scale.config.load
import scale.loop.train
from scale.checkpoint.store import CheckpointStore
from scale.loop.train import main
from tests.loop.test_step_guard import TINY as STEP_TINY

TINY = [*STEP_TINY, "engine.kind=ddp"]


@pytest.fixture
def calls(monkeypatch) -> Counter:
    """Calls of check_resumable and CheckpointStore.candidates, by the module that made them."""
    counted: Counter = Counter()
    check, candidates = scale.checkpoint.resume.check_resumable, CheckpointStore.candidates

    def counting_check(run, cfg):
        counted["check_resumable"] += 1
        return check(run, cfg)

    def counting_candidates(store):
        import sys

        counted[f"candidates from {sys._getframe(1).f_globals['__name__']}"] += 1
        return candidates(store)

    monkeypatch.setattr(scale.checkpoint.resume, "check_resumable", counting_check)
    monkeypatch.setattr(CheckpointStore, "candidates", counting_candidates)
    return counted


def test_a_fresh_run_and_its_resume_read_the_run_directory_once(calls, tmp_path):
    run = str(tmp_path / "run")
    # read_start's listing (is the run fresh?) and the resume's own plan, both in scale.checkpoint.resume
    listings = {"candidates from scale.checkpoint.resume": 2}
    assert main("demo/dino_tiny", [*TINY, "train.max_steps=2"], run_dir=run, synthetic=True) == 0
    assert dict(calls) == {"check_resumable": 1, **listings}
    calls.clear()
    longer = [*TINY, "train.max_steps=3", "train.epochs=200"]  # a NOTED change: allowed, named in the log once
    assert main("demo/dino_tiny", longer, run_dir=run, synthetic=True) == 0
    assert dict(calls) == {"check_resumable": 1, **listings}
    assert [p.name for p in CheckpointStore(tmp_path / "run" / "checkpoints").candidates()][0] == "step_000000003"
    log = (tmp_path / "run" / "logs" / "rank0.log").read_text()
    assert log.count("resuming with a changed setting") == 1 and "train.epochs: 60 -> 200" in log


def test_the_launcher_checks_once_for_its_ranks(monkeypatch, tmp_path):
    """`--nproc 2`: the launcher runs the start-up checks (the recipe's field rules among them) and tells its ranks
    (an environment variable), which skip them; a process that no launcher of ours started (one process, torchrun,
    srun) runs them itself."""
    checked: list[str] = []
    launched: dict = {}
    check_recipe, check_launch = scale.config.load.check_recipe, scale.loop.train.check_launch
    writable = scale.loop.train.RunDir.check_writable
    monkeypatch.setattr(scale.config.load, "check_recipe", lambda *a: checked.append("recipe") or check_recipe(*a))
    monkeypatch.setattr(
        scale.loop.train, "check_launch", lambda *a, **k: checked.append("launch") or check_launch(*a, **k)
    )
    monkeypatch.setattr(scale.loop.train.RunDir, "check_writable", lambda r: checked.append("writable") or writable(r))
    monkeypatch.setattr(scale.loop.train, "startup_checks", lambda *a: checked.append("startup"))
    monkeypatch.setattr(scale.loop.train, "check_trackers", lambda cfg: checked.append("trackers"))
    monkeypatch.setattr(scale.loop.train, "spawn", lambda n, argv, pass_fds, env: launched.update(env) or 0)
    for name in ("RANK", "SLURM_PROCID", scale.loop.train.LAUNCH_MARK, scale.loop.train.CHECKED):
        monkeypatch.delenv(name, raising=False)
    run = str(tmp_path / "run")
    assert main("demo/dino_tiny", TINY, run_dir=run, nproc=2, synthetic=True) == 0
    assert checked == ["recipe", "launch", "trackers", "writable", "startup"] and launched == {
        scale.loop.train.CHECKED: "1"
    }
    checked.clear()
    monkeypatch.setenv(scale.loop.train.CHECKED, "1")  # as a rank that launcher started
    assert main("demo/dino_tiny", [*TINY, "train.max_steps=1"], run_dir=run, synthetic=True) == 0
    assert checked == []
    monkeypatch.delenv(scale.loop.train.CHECKED)
    assert main("demo/dino_tiny", [*TINY, "train.max_steps=2"], run_dir=run, synthetic=True) == 0
    assert checked == ["recipe", "launch", "trackers", "writable", "startup"]


# one training process of the demo (one step, synthetic data) through the command line, then the modules it imported
RANK_PROBE = """
import json, sys
from scale.cli import main
assert main(["train", "demo/dino_tiny", "--synthetic-data", "--run-dir", sys.argv[1], *json.loads(sys.argv[2])]) == 0
print(json.dumps(sorted(sys.modules)))
"""


def test_a_rank_imports_what_its_recipe_runs(tmp_path):
    """adamw, fsdp2, no tracker (train.trackers=[]), no validation: no wandb (timm imports it for its own scripts),
    no mlflow, no tensorboard, no timm optimizers, no DeepSpeed, no evaluation code, no other method, and none of
    scale's torchvision transforms (the reference augmentation, eval, viz; timm imports torchvision's v1 only)."""
    import json
    import subprocess
    import sys

    overrides = [*TINY, "train.max_steps=1", "train.probe.enabled=false", "train.trackers=[]"]
    out = subprocess.run(
        [sys.executable, "-c", RANK_PROBE, str(tmp_path / "run"), json.dumps(overrides)],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    modules = set(json.loads(out.stdout.splitlines()[-1]))
    assert {"torch", "timm", "scale.loop.train", "scale.methods.dino"} <= modules
    unwanted = ("wandb", "mlflow", "tensorboard", "timm.optim", "deepspeed", "scale.eval", "scale.methods.mocov3")
    unwanted += ("scale.data.reference", "scale.viz", "torchvision.transforms.v2")
    assert sorted(m for m in modules if any(m == u or m.startswith(f"{u}.") for u in unwanted)) == []
