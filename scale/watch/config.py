"""The recipe's `train.collapse` and `train.probe` sections."""

from dataclasses import dataclass

from scale.config.fields import at_least


@dataclass
class CollapseConfig:
    """DINO sec. 5.3 / Fig. 7: a collapsed run's teacher-student KL converges to 0 within its first epochs and
    stays there (its teacher entropy at 0 without centering, at log K without sharpening), while a healthy run's KL
    stays of order 1 nat (3-5 nats in scale's DINO runs at init). Methods without a teacher distribution are read
    by the per-dimension std of their l2-normalised embeddings, x sqrt(dim): ~1 for spread features, 0 collapsed
    (SimSiam sec. 4.1). The regime must last `window_epochs` of training (past start-up transients) before the
    alarm; 0 disables the alarm."""

    # epochs the collapse regime must last before the alarm; 0: no alarm
    window_epochs: float = at_least(1.0, 0.0)
    kl_below: float = at_least(0.05, 0.0)  # nats
    std_below: float = at_least(0.1, 0.0)  # x 1/sqrt(dim)


@dataclass
class ProbeConfig:
    """Online linear probe (solo-learn): a linear classifier on the detached backbone features of each training
    batch, trained with its own AdamW; its batch accuracy (before its update) is logged as probe_top1."""

    # train the online linear probe (probe_top1 and probe_loss in the metrics)
    enabled: bool = False
    # the probe's AdamW learning rate
    lr: float = at_least(1e-3, 0.0)
    # the probe's AdamW weight decay
    weight_decay: float = at_least(0.0, 0.0)
