"""Multi-node jobs shard within a node by default: `engine.shard_size` = tasks per node reaches every task's
command line and `scale submit` prints it; an explicit setting wins; single-node and replicated jobs are untouched."""

import pytest

from scale.cli import main as cli
from scale.launch import slurm


@pytest.fixture
def recipe(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text("meta:\n  name: tiny\ntrain:\n  max_steps: 2\n")
    return path


@pytest.fixture(autouse=True)
def no_sinfo(monkeypatch):
    monkeypatch.setattr(slurm, "partitions", lambda: None)


def gpu_job(recipe, tmp_path, overrides=(), nodes=4, **kw):
    options = slurm.SlurmOptions(nodes=nodes, gpus_per_node=8, **kw)
    return slurm.plan(str(recipe), list(overrides), tmp_path / "run", options)


def test_multi_node_fsdp2_shards_within_a_node(recipe, tmp_path):
    job = gpu_job(recipe, tmp_path)
    assert job.tasks[0].overrides == ["engine.shard_size=8"]
    assert "OVERRIDES=(engine.shard_size=8)" in slurm.render(job)
    assert job.summary()[0] == "32 ranks, engine.shard_size=8 (GPUs per node): 4 replica(s) x 8 shard(s)"


@pytest.mark.parametrize(
    "overrides,nodes,expected",
    [
        (["engine.shard_size=16"], 4, ["engine.shard_size=16"]),  # the user's choice wins
        (["engine.shard_size=0"], 4, ["engine.shard_size=0"]),  # ... also "all ranks"
        ([], 1, []),  # one node: sharding over all ranks already stays inside it
        (["engine.kind=ddp"], 4, ["engine.kind=ddp"]),  # nothing sharded
        (["engine.kind=deepspeed", "engine.zero_stage=2"], 4, ["engine.kind=deepspeed", "engine.zero_stage=2"]),
        (
            ["engine.kind=deepspeed", "engine.zero_stage=3"],
            4,
            ["engine.kind=deepspeed", "engine.zero_stage=3", "engine.shard_size=8"],
        ),
    ],
)
def test_explicit_settings_and_unsharded_jobs_are_kept(recipe, tmp_path, overrides, nodes, expected):
    assert gpu_job(recipe, tmp_path, overrides, nodes=nodes).tasks[0].overrides == expected


def test_submit_prints_the_shard_size(recipe, tmp_path, capsys):
    args = ["submit", str(recipe), "--nodes", "2", "--gpus-per-node", "4", "--run-dir", str(tmp_path / "r")]
    assert cli([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "# 8 ranks, engine.shard_size=4 (GPUs per node): 2 replica(s) x 4 shard(s)" in out
    assert cli([args[0], args[1], "engine.shard_size=2", *args[2:], "--dry-run"]) == 0
    assert "# 8 ranks, engine.shard_size=2 (overrides): 4 replica(s) x 2 shard(s)" in capsys.readouterr().out
