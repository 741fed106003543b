"""A resume keeps this run's optimizer settings: the optim fields other than `optim.name` change freely on resume
(docs/how-to/resume.md), yet the loads (DeepSpeed's, torch's set_state_dict after
DCP) copy the saved groups' settings into the optimizer. After the load, and after a step, the optimizer's groups
carry the resumed recipe's betas, eps, lr and weight decay, not the checkpoint's (DeepSpeed ZeRO-1 and ZeRO-3,
DDP and FSDP2, 2 gloo ranks)."""

import pytest
import torch
from engine_toy import FROZEN_STEPS, build, context, engine_run, make_batch, shard_batch, spawn

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out

SAVED = {"betas": [0.9, 0.999], "eps": 1e-8, "lr": 1e-2, "weight_decay": 0.04}
STEERED = {"betas": [0.8, 0.99], "eps": 1e-6, "lr": 3e-3, "weight_decay": 0.1}
SETTINGS = ("betas", "eps", "lr", "weight_decay")
ENGINES = {
    "zero1": {"kind": "deepspeed", "zero_stage": 1},
    "zero3": {"kind": "deepspeed", "zero_stage": 3},
    "ddp": {"kind": "ddp"},
    "fsdp2": {"kind": "fsdp2"},
}


def settings(engine) -> list[dict]:
    return [{key: group[key] for key in SETTINGS} for group in engine.optimizer.param_groups]


def load(engine, folder: str) -> None:
    """As the checkpointer loads: the engine's own files, or its state through DCP."""
    import torch.distributed.checkpoint as dcp

    if engine.native_checkpoint:
        from scale.checkpoint.state import load_engine_files

        load_engine_files(engine, folder, 2)
        return
    state = engine.state_dict()
    dcp.load(state, checkpoint_id=folder)
    engine.load_state_dict(state)


def steered_resume(engine_kw: dict, folder: str) -> dict:
    saved = engine_run(engine_kw, SAVED, steps=2, save_to=folder)
    method, engine = build(engine_kw, STEERED)
    before = settings(engine)
    load(engine, folder)
    loaded = settings(engine)
    weights = engine.export_state_dict("student")
    rank, world = engine.dist_info.rank, engine.dist_info.world_size
    loss, _ = method.loss(shard_batch(make_batch(2), rank, world).to(engine.device), context(FROZEN_STEPS))
    engine.backward(loss)
    engine.step()
    return {
        "saved": saved["student"],
        "weights": weights,
        "before": before,
        "loaded": loaded,
        "stepped": settings(engine),
    }


def steered_resumes(folder: str, labels: list[str]) -> dict:
    return {label: steered_resume(ENGINES[label], f"{folder}/{label}") for label in labels}


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    labels = [label for label in ENGINES if label in ("ddp", "fsdp2") or deepspeed_installed()]
    tmp = tmp_path_factory.mktemp("steered")
    return spawn(steered_resumes, str(tmp / "ckpt"), labels, world=2, tmp_path=tmp)


def deepspeed_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("deepspeed") is not None


def run_of(resumed, label: str) -> dict:
    if label not in resumed:
        pytest.skip("deepspeed is not installed")
    return resumed[label]


@pytest.mark.parametrize("label", list(ENGINES))
def test_the_resumed_optimizer_has_the_new_recipes_settings(resumed, label):
    run, steered = run_of(resumed, label), {**STEERED, "betas": tuple(STEERED["betas"])}
    assert run["saved"].keys() == run["weights"].keys()
    # the checkpoint was loaded (its weights; DDP ranks' BatchNorm statistics differ, DCP keeps one rank's)
    weights = [k for k in run["saved"] if ".running_" not in k]
    assert [k for k in weights if not torch.equal(run["saved"][k], run["weights"][k])] == []
    assert run["before"] and all(group == steered for group in run["before"])
    assert run["loaded"] == run["before"]


@pytest.mark.parametrize("label", list(ENGINES))
def test_the_new_settings_stay_after_a_step(resumed, label):
    run = run_of(resumed, label)
    assert run["stepped"] == run["before"]
