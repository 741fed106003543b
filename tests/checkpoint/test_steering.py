"""Resuming on purpose, single process with stand-in modules: a checkpoint that does not fit the run is a user
error naming the key and both shapes with every checkpoint kept; train.resume_step loads that checkpoint and moves
the newer ones aside (applied once); each train.reset entry leaves its part fresh; a fallback past a damaged
checkpoint never lets the new run overwrite it. The fixed-field refusal: every FIXED key of the schema."""

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from scale.checkpoint.checkpointer import Checkpointer
from scale.checkpoint.resume import RECORD, check_compatible, keys_with
from scale.checkpoint.state import run_states
from scale.checkpoint.store import SET_ASIDE, CheckpointStore, step_name
from scale.config import load_recipe
from scale.config.fields import FIXED, NOTED
from scale.config.schema import Recipe
from scale.config.validate import get_key, schema_rules
from scale.engine.parallel import ParallelContext
from scale.errors import ConfigError, UserError
from tests.checkpoint.test_checkpointer_state import CountingLoader, Stateful
from tests.checkpoint.test_fixed_fields import perturbed


class ToyEngine(Stateful):
    """A student weight with its optimizer moment, and a teacher: the keys check_fits compares."""

    def __init__(self, value: float, width: int = 4):
        super().__init__(
            student={"w": torch.full((width,), value)},
            teacher={"w": torch.full((width,), value + 0.5)},
            optimizer={"state": {"w": {"exp_avg": torch.full((width,), value * 10)}}},
        )
        self.ema_calls = []

    def load_state_dict(self, state):
        self.state.update(state)  # a part missing from `state` (train.reset) keeps its fresh value

    def ema(self, momentum: float) -> None:
        self.ema_calls.append(momentum)
        self.state["teacher"] = {"w": self.state["student"]["w"].clone()}


class ToyMethod(Stateful):
    teacher = object()  # the method has a teacher


def toy(root, value, width=4, resume_step=None, reset=()):
    cfg = OmegaConf.create(
        {
            "train": {
                "async_save": False,
                "keep_last": 10,
                "keep_every": 0,
                "seed": 0,
                "resume_step": resume_step,
                "reset": list(reset),
            },
            "engine": {"kind": "ddp"},
            "meta": {"name": "toy"},
        }
    )
    info = ParallelContext(rank=0, world_size=1, local_rank=0, master_addr="", master_port=0, launcher="single")
    engine, loader = ToyEngine(value, width), CountingLoader()
    states = run_states(ToyMethod(c=1), loader, Stateful(m=0), info, seed=0)
    return Checkpointer(root, cfg, info, engine, states), engine, loader


def saved_run(root, steps=(2, 4, 6)):
    """Checkpoints of `steps`, the weights of step s all equal to s; the loader's position equals the step."""
    for step in steps:
        saver, _, loader = toy(root, float(step))
        loader.state["position"] = step
        saver.save(step)
    return root


def inventory(root) -> dict:
    """Every file under the checkpoints folder with its size: what 'nothing deleted' compares."""
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def test_a_checkpoint_that_does_not_fit_is_a_user_error_naming_key_and_shapes(tmp_path):
    root = saved_run(tmp_path)
    before = inventory(root)
    saver, _, _ = toy(root, 0.0, width=8)
    with pytest.raises(UserError) as err:
        saver.resume()
    assert "engine.student.w is [4] in the checkpoint, [8] in this run" in str(err.value)
    assert "damaged" not in str(err.value)
    assert inventory(root) == before, "a refused resume changed the checkpoints"


def test_resume_step_loads_that_checkpoint_moves_newer_aside_once(tmp_path):
    root = saved_run(tmp_path)
    saver, engine, loader = toy(root, 0.0, resume_step=4)
    assert saver.resume() == 4
    assert torch.equal(engine.state["student"]["w"], torch.full((4,), 4.0)) and loader.state["position"] == 4
    store = CheckpointStore(root)
    assert [p.name for p in store.step_dirs()] == [step_name(4), step_name(2)]
    assert [p.name for p in store.set_aside_dirs()] == [step_name(6)]  # moved, with its files
    assert CheckpointStore.problem(store.set_aside_dirs()[0]) is None
    assert (root / "latest").read_text().strip() == step_name(4)
    # the continuation saves step 6 again without touching the one set aside; retention never sees it
    saver.save(6)
    assert CheckpointStore.problem(root / step_name(6)) is None and len(store.set_aside_dirs()) == 1
    # a requeued job with the same recipe continues from its newest checkpoint: the rollback applied once
    again, engine, _ = toy(root, 0.0, resume_step=4)
    assert again.resume() == 6 and len(store.set_aside_dirs()) == 1
    assert json.loads((root / RECORD).read_text())["applied"] == {"resume_step": 4, "reset": []}


def test_resume_step_without_that_checkpoint_names_the_sealed_ones(tmp_path):
    root = saved_run(tmp_path)
    before = inventory(root)
    saver, _, _ = toy(root, 0.0, resume_step=5)
    with pytest.raises(UserError, match=r"train.resume_step=5: no sealed checkpoint .*sealed: \[6, 4, 2\]"):
        saver.resume()
    assert inventory(root) == before


@pytest.mark.parametrize("part", ["optimizer", "data", "schedules", "ema"])
def test_each_reset_leaves_its_part_fresh_and_loads_the_rest(tmp_path, part):
    root = saved_run(tmp_path)
    saver, engine, loader = toy(root, 0.0, reset=[part])
    start = saver.resume()
    assert torch.equal(engine.state["student"]["w"], torch.full((4,), 6.0))  # the weights always load
    fresh_moment = engine.state["optimizer"]["state"]["w"]["exp_avg"]
    assert torch.equal(fresh_moment, torch.zeros(4) if part == "optimizer" else torch.full((4,), 60.0))
    assert loader.state["position"] == (7 if part == "data" else 6)  # 7: CountingLoader's fresh position
    teacher = engine.state["teacher"]["w"]
    assert torch.equal(teacher, torch.full((4,), 6.0 if part == "ema" else 6.5))
    assert engine.ema_calls == ([0.0] if part == "ema" else [])
    store = CheckpointStore(root)
    if part == "schedules":  # the step count restarts: every checkpoint is set aside, none overwritten
        assert start == 0 and store.step_dirs() == [] and len(store.set_aside_dirs()) == 3
    else:
        assert start == 6 and len(store.step_dirs()) == 3


def test_a_damaged_newest_checkpoint_falls_back_and_is_kept_aside(tmp_path):
    root = saved_run(tmp_path)
    (root / step_name(6) / "meta.json").write_text("{")  # damaged
    saver, engine, _ = toy(root, 0.0)
    assert saver.resume() == 4
    store = CheckpointStore(root)
    assert [p.name for p in store.set_aside_dirs()] == [step_name(6)]
    saver.save(6)  # the continuation's own step 6: the damaged one is not overwritten
    assert (store.set_aside_dirs()[0] / "meta.json").read_text() == "{"


def test_every_fixed_field_changed_on_resume_is_refused_naming_it():
    saved = load_recipe("demo/dino_tiny")
    values = {}
    for dotted, rule in schema_rules(Recipe):
        if rule.get("resume") == FIXED:
            other = perturbed(get_key(saved, dotted), rule) or [12345]  # e.g. None -> 8; a str without choices
            values[dotted] = other[0]
    assert set(values) == set(keys_with(FIXED)) and "model.img_size" in values
    for dotted, value in values.items():
        changed = saved.copy()
        OmegaConf.update(changed, dotted, value, merge=False)
        with pytest.raises(ConfigError, match=rf"{dotted}: "):
            check_compatible(saved, changed, "runs/x")


def test_noted_fields_change_and_are_reported():
    saved = load_recipe("demo/dino_tiny")
    overrides = ["data.views.n_local=[4]", "train.epochs=90", "optim.lr=0.001", "engine.kind=ddp"]
    notes = check_compatible(saved, load_recipe("demo/dino_tiny", overrides), "runs/x")
    # engine.kind: DDP and FSDP2 read each other's DCP checkpoints (the format is checked when one loads)
    assert notes == ["data.views.n_local: [0] -> [4]", "engine.kind: 'fsdp2' -> 'ddp'", "train.epochs: 60 -> 90"]
    noted = {"data.views.n_local", "data.train", "data.repeated_aug", "train.epochs", "engine.kind"}
    assert noted == set(keys_with(NOTED))


def test_ckpt_info_lists_every_checkpoint_with_step_time_and_whether_it_loads(tmp_path, capsys):
    from scale.cli import main as cli

    root = saved_run(tmp_path / "checkpoints")
    saver, _, _ = toy(root, 0.0, resume_step=4)
    saver.resume()  # step 6 is set aside
    (root / step_name(2) / "meta.json").unlink()  # a partial write
    assert cli(["ckpt", "info", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split() == ["step", "saved", "loadable", "path"])
    rows = [line.split() for line in lines[header + 1 :]]
    assert [(r[0], r[-1]) for r in rows] == [
        ("6", f"{SET_ASIDE}/{next((root / SET_ASIDE).iterdir()).name}/{step_name(6)}"),
        ("4", step_name(4)),
        ("2", step_name(2)),
    ]
    assert rows[0][3] == "yes" and rows[1][3] == "yes" and "no meta.json" in " ".join(rows[2])


def test_a_fresh_start_past_only_damaged_checkpoints_keeps_them_aside(tmp_path):
    root = saved_run(tmp_path, steps=(2,))
    (root / step_name(2) / "meta.json").unlink()  # a partial write, not even a candidate
    saver, _, _ = toy(root, 0.0)
    assert saver.resume() == 0
    store = CheckpointStore(root)
    assert store.step_dirs() == [] and [p.name for p in store.set_aside_dirs()] == [step_name(2)]


def test_a_resume_reads_top_to_bottom_in_four_files_of_checkpoint(tmp_path):
    """Every function a resume calls (read_start, then the checkpointer's resume of a sealed step), by file: the
    resume's own logic lives in four files of scale/checkpoint/; outside it only the run's context is read (the
    parallel context's rank, the run directory's checkpoints path) and the loader's own counters."""
    import sys

    import scale
    from scale.checkpoint.resume import read_start
    from scale.loop.rundir import RunDir

    run = RunDir(tmp_path / "run")
    saver, _, _ = toy(run.checkpoints, 2.0)
    saver.save(2)
    resumer, _, _ = toy(run.checkpoints, 0.0)
    package, seen = str(Path(scale.__file__).parent) + "/", set()

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(package):
            seen.add(frame.f_code.co_filename.removeprefix(package))

    previous = sys.gettrace()  # a coverage run's tracer, put back after
    sys.settrace(tracer)
    try:
        read_start(run, resumer.cfg)
        step = resumer.resume()
    finally:
        sys.settrace(previous)
    assert step == 2
    own = {"checkpoint/resume.py", "checkpoint/state.py", "checkpoint/store.py", "checkpoint/safe_load.py"}
    helpers = {"checkpoint/checksum.py", "engine/dist.py", "loop/rundir.py", "data/loader.py", "readback.py"}
    assert own <= seen and seen <= own | helpers, sorted(seen)
