"""A DeepSpeed resume keeps this run's optimizer settings: the optim fields other than `optim.name` change freely
on resume (README 'Resuming, rolling back and changing a run'), yet DeepSpeed's load copies the saved groups'
settings into the optimizer. After the load, and after a step, the inner optimizer's groups carry the resumed
recipe's betas, eps, lr and weight decay, not the checkpoint's (ZeRO-1 and ZeRO-3, 2 gloo ranks)."""

import pytest
from engine_toy import FROZEN_STEPS, build, context, engine_run, make_batch, shard_batch, spawn

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out

pytest.importorskip("deepspeed")

SAVED = {"betas": [0.9, 0.999], "eps": 1e-8, "lr": 1e-2, "weight_decay": 0.04}
STEERED = {"betas": [0.8, 0.99], "eps": 1e-6, "lr": 3e-3, "weight_decay": 0.1}
SETTINGS = ("betas", "eps", "lr", "weight_decay")


def settings(engine) -> list[dict]:
    return [{key: group[key] for key in SETTINGS} for group in engine.ds.optimizer.optimizer.param_groups]


def steered_resume_job(folder: str) -> dict:
    return {stage: steered_resume(stage, f"{folder}/z{stage}") for stage in (1, 3)}


def steered_resume(stage: int, folder: str) -> dict:
    engine_kw = {"kind": "deepspeed", "zero_stage": stage}
    engine_run(engine_kw, SAVED, steps=2, save_to=folder)
    method, engine = build(engine_kw, STEERED)
    before = settings(engine)
    engine.load_native(folder, 2)
    loaded = settings(engine)
    rank, world = engine.dist_info.rank, engine.dist_info.world_size
    loss, _ = method.loss(shard_batch(make_batch(2), rank, world), context(FROZEN_STEPS))
    engine.backward(loss)
    engine.step()
    return {"before": before, "loaded": loaded, "stepped": settings(engine), "steps": engine.ds.global_steps}


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ds_steer")
    return spawn(steered_resume_job, str(tmp / "ckpt"), world=2, tmp_path=tmp)


@pytest.mark.parametrize("stage", [1, 3])
def test_the_resumed_optimizer_has_the_new_recipes_settings(resumed, stage):
    run, steered = resumed[stage], {**STEERED, "betas": tuple(STEERED["betas"])}
    assert run["before"] and all(group == steered for group in run["before"])
    assert run["loaded"] == run["before"]


@pytest.mark.parametrize("stage", [1, 3])
def test_the_new_settings_stay_after_a_step(resumed, stage):
    run = resumed[stage]
    assert run["steps"] == 3  # the checkpoint's 2 steps were loaded, then one more
    assert run["stepped"] == run["before"]
