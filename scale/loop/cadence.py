"""What the training loop does after each step (log, validate, read the non-finite guard, check for preemption,
save, stop), decided in one place: `Cadence.at`.

The collective-call rule. Reading the guard (`Trainer.check_finite`), validating, logging (the loader's counts are
gathered, the collapse alarm may agree to stop), the preemption check and the save are collectives of the
data-parallel group: every rank must make the same calls at the same steps, or the run hangs in a collective that a
peer never enters, or a rank stops while its peers go on. So each decision is a function of the step number and of
inputs every rank holds alike: the recipe, the step counts every rank computes from it (steps per epoch, the stop
step) and whether the run validates, all fixed when the cadence is built, and the preemption verdict, which is
agreed through a collective (`Preemption.requested`, a MAX over the group) before it is passed in. Never rank-local
state: wall or step time, a signal flag before it is agreed, the rank, an RNG, a file one rank reads. A time-based
rule (save every N minutes) would have to agree on the time through a collective first, as preemption does.
"""

from dataclasses import dataclass, replace

from omegaconf import DictConfig


@dataclass(frozen=True)
class StepPlan:
    """What follows step index `done - 1` (`done`: steps done, as metrics.jsonl and the checkpoints number it), in
    this order: read the guard, validate, log, check for preemption, save, stop."""

    done: int
    log: bool
    validate: bool
    check_preemption: bool
    save: bool
    stop: bool
    preempted: bool = False

    @property
    def check_finite(self) -> bool:
        """The guard is read before anything reads the weights (a log, a validation) or writes them (a save), and
        before a preemption check (whose verdict may be a save)."""
        return self.log or self.validate or self.save or self.check_preemption


@dataclass(frozen=True)
class Cadence:
    """The loop's intervals in steps, built once from the recipe and the step counts every rank agrees on."""

    stop: int  # the steps done when this run ends: the schedule's length, or train.max_steps if fewer
    log_every: int
    val_every: int  # 0: the run does not validate
    save_every: int
    preempt_check_every: int

    @classmethod
    def of(cls, train: DictConfig, steps_per_epoch: int, total_steps: int, validates: bool) -> "Cadence":
        """From the recipe's `train` section; `validates`: the run reports validation accuracy."""
        stop = total_steps if train.max_steps is None else min(total_steps, train.max_steps)
        return cls(
            stop=stop,
            log_every=train.log_every,
            val_every=train.val_every_epochs * steps_per_epoch if validates else 0,
            save_every=train.ckpt_every_steps or steps_per_epoch,
            preempt_check_every=train.preempt_check_every,
        )

    def at(self, step: int, preempted: bool = False) -> StepPlan:
        """The plan after step index `step`. `preempted`: the agreed verdict of this step's preemption check (only
        where the plan without it checks): the run saves and stops."""
        done = step + 1
        last = done == self.stop
        validate = bool(self.val_every) and (done % self.val_every == 0 or last)
        check_preemption = done % self.preempt_check_every == 0 or last
        plan = StepPlan(
            done=done,
            log=done % self.log_every == 0 or last or step == 0 or validate,  # step 0: the run's first line
            validate=validate,
            check_preemption=check_preemption,
            save=done % self.save_every == 0 or last,
            stop=last,
        )
        if preempted:
            if not check_preemption:
                raise ValueError(f"step {done} has no preemption check: its verdict cannot be agreed")
            return replace(plan, save=True, stop=True, preempted=True)
        return plan
