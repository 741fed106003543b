"""The loop's cadence (scale.loop.cadence): what follows each step, decided from the step number and agreed inputs
alone, so that every rank makes the same collective calls at the same steps; Trainer.fit does what it plans."""

import inspect
import os
import random
import time
from collections import Counter

import pytest
import torch

import scale.loop.preemption
from scale.config import load_recipe
from scale.errors import PREEMPTED_EXIT_CODE
from scale.faults import ENV as FAULT_ENV
from scale.faults import spec
from scale.loop.cadence import Cadence, StepPlan
from scale.loop.preemption import Preemption
from scale.loop.rundir import RunDir
from scale.loop.train import Trainer
from tests.loop.test_step_guard import TINY

FIELDS = ("log", "validate", "check_finite", "check_preemption", "save", "stop")


def table(cadence: Cadence) -> dict[int, str]:
    """steps done -> the plan's decisions that hold, as letters (L, V, F, P, S, X for stop)."""
    letters = dict(zip(FIELDS, "LVFPSX"))
    return {
        plan.done: "".join(letters[f] for f in FIELDS if getattr(plan, f))
        for plan in (cadence.at(step) for step in range(cadence.stop))
    }


def test_the_plan_of_every_step():
    cadence = Cadence(stop=9, log_every=4, val_every=6, save_every=3, preempt_check_every=5)
    assert table(cadence) == {
        1: "LF",  # the run's first line
        2: "",
        3: "FS",
        4: "LF",
        5: "FP",
        6: "LVFS",  # a validation is logged
        7: "",
        8: "LF",
        9: "LVFPSX",  # the last step: everything, and the end
    }
    quiet = Cadence(stop=4, log_every=100, val_every=0, save_every=100, preempt_check_every=100)
    assert table(quiet) == {1: "LF", 2: "", 3: "", 4: "LFPSX"}


def test_a_resumed_launch_plans_as_the_first_one_did():
    """The plan of a step does not depend on where this launch started: a resumed run logs, saves and checks at
    the steps the uninterrupted run would have."""
    cadence = Cadence(stop=20, log_every=4, val_every=7, save_every=3, preempt_check_every=5)
    assert [cadence.at(step) for step in range(8, 20)] == [cadence.at(step) for step in range(20)][8:]
    assert not cadence.at(8).log  # only step index 0 is logged for being first, not a launch's first step


def test_an_agreed_preemption_saves_and_stops_at_a_check():
    cadence = Cadence(stop=9, log_every=4, val_every=0, save_every=100, preempt_check_every=5)
    plan = cadence.at(4, preempted=True)
    assert (plan.done, plan.save, plan.stop, plan.preempted, plan.check_finite) == (5, True, True, True, True)
    assert not cadence.at(4).save
    with pytest.raises(ValueError, match="step 4 has no preemption check"):
        cadence.at(3, preempted=True)  # no collective agreed on a verdict there


def test_the_cadence_of_a_recipe():
    cfg = load_recipe("demo/dino_tiny", ["train.log_every=7", "train.preempt_check_every=3", "train.max_steps=50"])
    assert cfg.train.ckpt_every_steps == 0 and cfg.train.val_every_epochs == 1
    assert Cadence.of(cfg.train, steps_per_epoch=20, total_steps=100, validates=True) == Cadence(
        stop=50, log_every=7, val_every=20, save_every=20, preempt_check_every=3
    )
    longer = load_recipe("demo/dino_tiny", ["train.ckpt_every_steps=5", "train.val_every_epochs=2"])
    assert Cadence.of(longer.train, 20, 100, validates=False) == Cadence(
        stop=100,
        log_every=longer.train.log_every,
        val_every=0,
        save_every=5,
        preempt_check_every=longer.train.preempt_check_every,
    )
    assert Cadence.of(longer.train, 20, 100, validates=True).val_every == 40


class RankLocal:
    """What differs between the ranks of one run and must never decide a collective call: the clocks (each host
    its own, each rank at its own point of the step), the rank's variables, its RNG streams, and a signal that
    reached this rank only. Entered, the process looks like rank `rank` would."""

    def __init__(self, rank: int, signalled_at: set[int]):
        self.monkeypatch, self.rank, self.signalled_at = pytest.MonkeyPatch(), rank, signalled_at

    def __enter__(self):
        offset = 1000.0 * (self.rank + 1) + 0.37 * self.rank
        for clock in ("time", "monotonic", "perf_counter"):
            real = getattr(time, clock)
            self.monkeypatch.setattr(time, clock, lambda real=real: real() + offset)
        for name in ("RANK", "LOCAL_RANK", "SLURM_PROCID"):
            self.monkeypatch.setenv(name, str(self.rank))
        random.seed(self.rank)
        torch.manual_seed(self.rank)
        return self

    def __exit__(self, *exc):
        self.monkeypatch.undo()

    def signalled(self, done: int) -> bool:
        """This rank's own flag: set from the step its signal arrived (scale.loop.preemption.Preemption._handle)."""
        return any(done >= at for at in self.signalled_at)


@pytest.mark.parametrize(
    "overrides",
    [
        ["train.log_every=3", "train.ckpt_every_steps=4", "train.preempt_check_every=5"],
        ["train.log_every=1", "train.ckpt_every_steps=0", "train.preempt_check_every=1", "train.max_steps=17"],
    ],
)
def test_every_rank_plans_the_same_collective_calls(overrides):
    """Four ranks of one run, each with its own clocks, variables and RNG; a preemption signal reaches rank 2
    alone, after step 11. Each builds its cadence as Trainer does and plans every step, passing the preemption
    verdict as Preemption.requested agrees it (any rank's flag, at a check): their plans are identical, so no
    rank enters a collective (guard read, validation, log, preemption check, save) that a peer skips."""
    cfg = load_recipe("demo/dino_tiny", overrides)
    ranks = [RankLocal(rank, {11} if rank == 2 else set()) for rank in range(4)]
    steps_per_epoch, total_steps = 6, 6 * 4

    def agreed(done: int) -> bool:
        return any(r.signalled(done) for r in ranks)

    plans = []
    for rank in ranks:
        with rank:
            cadence = Cadence.of(cfg.train, steps_per_epoch, total_steps, validates=True)
            mine: list[StepPlan] = []
            for step in range(cadence.stop):
                plan = cadence.at(step)
                if plan.check_preemption and agreed(plan.done):
                    plan = cadence.at(step, preempted=True)
                mine.append(plan)
                if plan.stop:
                    break
            plans.append(mine)
    assert all(p == plans[0] for p in plans[1:])
    assert plans[0][-1].preempted and plans[0][-1].save  # the signal was honoured, at the first check after it
    assert all(sum(getattr(p, f) for p in plans[0]) for f in FIELDS)  # the grid exercised every decision


def test_the_preemption_verdict_is_agreed(monkeypatch):
    """A signal that reached another rank only stops this one too: the flag is a MAX over the group."""
    peer_flag = 1

    def all_reduce(flag, op, group):
        flag.copy_(torch.maximum(flag, torch.tensor([peer_flag], dtype=flag.dtype)))

    monkeypatch.setattr(scale.loop.preemption.dist, "get_backend", lambda group: "gloo")
    monkeypatch.setattr(scale.loop.preemption.dist, "all_reduce", all_reduce)
    here = Preemption([], group=object())
    assert here.received is None and here.requested()
    peer_flag = 0
    assert not here.requested()


def test_fit_is_the_loop():
    """Trainer.fit reads as the loop it is (issue 51: at most 40 lines), its parts in named methods."""
    assert len(inspect.getsource(Trainer.fit).splitlines()) <= 40


# a run that logs, saves and checks for preemption at different steps (world size 1, synthetic batches)
CADENCED = [*TINY, "engine.kind=ddp", "train.log_every=3", "train.ckpt_every_steps=4", "train.preempt_check_every=5"]


def spied(trainer: Trainer) -> list[tuple[int, str]]:
    """(steps done, call) of every collective the loop makes after a step: what the Trainer actually did."""
    calls: list[tuple[int, str]] = []
    done = [0]
    begin = trainer.heartbeat.begin_step

    def begin_step(step):
        done[0] = step + 1
        begin(step)

    def spy(owner, name):
        real = getattr(owner, name)

        def call(*args, **kwargs):
            calls.append((done[0], name))
            return real(*args, **kwargs)

        setattr(owner, name, call)

    trainer.heartbeat.begin_step = begin_step
    for owner, name in (
        (trainer, "check_finite"),
        (trainer, "save"),
        (trainer, "_log"),
        (trainer.preemption, "requested"),
    ):
        spy(owner, name)
    return calls


def planned(cadence: Cadence, start: int, preempted_at: int | None = None) -> list[tuple[int, str]]:
    """The calls the cadence plans from `start`, with a preemption agreed at `preempted_at`'s check."""
    calls = []
    for step in range(start, cadence.stop):
        plan = cadence.at(step)
        calls += [(plan.done, name) for name, due in (("check_finite", plan.check_finite), ("_log", plan.log)) if due]
        if plan.check_preemption:
            calls.append((plan.done, "requested"))
            if preempted_at is not None and plan.done >= preempted_at:
                plan = cadence.at(step, preempted=True)
        calls += [(plan.done, "save")] if plan.save else []
        if plan.stop:
            break
    return calls


@pytest.mark.slow  # a process group and 7 training steps
def test_fit_makes_the_calls_its_cadence_plans(group, tmp_path, monkeypatch):
    """A run preempted (a SIGUSR1 after step 2, from the fault point) saves at its next check and exits for
    requeue; its continuation runs to the end. In both, the guard reads, logs, preemption checks and saves are
    those `Cadence.at` planned, at the same steps, and nothing else."""
    info, device = group
    run = RunDir(tmp_path / "run")
    cfg = load_recipe("demo/dino_tiny", [*CADENCED, "train.max_steps=7"])
    monkeypatch.setenv(FAULT_ENV, spec("preempt", 2))
    first = Trainer(cfg, run, info, device, synthetic=True)
    calls = spied(first)
    assert first.fit() == PREEMPTED_EXIT_CODE
    assert calls == planned(first.cadence, 0, preempted_at=2)
    assert calls[-1] == (5, "save") and Counter(c for _, c in calls)["requested"] == 1
    monkeypatch.delenv(FAULT_ENV)
    second = Trainer(cfg, run, info, device, synthetic=True)
    calls = spied(second)
    assert second.fit() == 0
    assert calls == planned(second.cadence, 5) and calls[-1] == (7, "save")
    assert os.environ.get(FAULT_ENV) is None
