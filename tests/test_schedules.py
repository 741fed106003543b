import math

import numpy as np
import pytest
from omegaconf import OmegaConf

from scale import schedules
from scale.engine.config import OptimConfig


def test_cosine_warmup_then_half_cosine_like_dino():
    """DINO's utils.cosine_scheduler: np.linspace(start, base, warmup_iters) reaches base at the last warmup step."""
    base, final, total, warmup = 1.0, 0.1, 20, 5
    s = schedules.cosine(base, final, total, warmup, warmup_start=0.0)
    assert len(s) == total
    np.testing.assert_allclose([s(t) for t in range(warmup)], [0.0, 0.25, 0.5, 0.75, 1.0])
    decay = total - warmup
    for t in range(decay):
        expected = final + 0.5 * (base - final) * (1 + math.cos(math.pi * t / decay))
        assert s(warmup + t) == pytest.approx(expected)
    assert s(warmup) == pytest.approx(base)
    assert s(10**6) == s(total - 1)  # clamped past the end


def test_cosine_warmup_without_endpoint_like_moco_v3():
    """MoCo v3's adjust_learning_rate (lr * epoch / warmup_epochs, fractional epoch) and timm's warmup: base is first
    reached at the step after the warmup."""
    s = schedules.cosine(1.0, 0.0, 20, 5, warmup_start=0.0, warmup_endpoint=False)
    np.testing.assert_allclose([s(t) for t in range(6)], [0.0, 0.2, 0.4, 0.6, 0.8, 1.0])


def test_weight_decay_and_teacher_momentum_ends():
    wd = schedules.cosine(0.04, 0.4, 100)
    assert wd(0) == pytest.approx(0.04) and wd(99) == pytest.approx(0.4, abs=1e-3)
    assert all(wd(t) <= wd(t + 1) for t in range(99))
    momentum = schedules.cosine(0.996, 1.0, 100)
    assert momentum(0) == pytest.approx(0.996) and 0.9999 < momentum(99) <= 1.0


def test_teacher_temperature_per_epoch():
    temps = schedules.teacher_temperature(0.04, 0.07, 30, 100)
    assert len(temps) == 100
    assert temps[0] == pytest.approx(0.04) and temps[29] == pytest.approx(0.07) and temps[99] == 0.07
    assert temps[15] == pytest.approx(0.04 + 0.03 * 15 / 29)
    short = schedules.teacher_temperature(0.04, 0.07, 30, 10)  # the official code crashes here
    assert len(short) == 10 and short[-1] < 0.07
    assert list(schedules.teacher_temperature(0.04, 0.04, 0, 3)) == [0.04] * 3


def test_moco_momentum_formula():
    assert schedules.moco_momentum(0.99, 0, 300) == pytest.approx(0.99)
    assert schedules.moco_momentum(0.99, 150, 300) == pytest.approx(1 - 0.5 * 0.01)
    assert schedules.moco_momentum(0.99, 300, 300) == pytest.approx(1.0)


def test_encoder_momentum_after_step_t_is_moco_v3s_at_iteration_t_plus_1():
    """MoCo v3: m = 1 - (1 - m0) (cos(pi k / K) + 1) / 2, k the iteration (fractional epoch) that starts with the
    update; the update after the last of K steps uses m = 1."""
    cosine = schedules.encoder_momentum(0.99, True, steps_per_epoch=10, total_steps=30)
    for step in (0, 7, 14, 29):
        k = step + 1
        assert cosine(step) == pytest.approx(1 - 0.01 * (math.cos(math.pi * k / 30) + 1) / 2, abs=1e-15)
    assert cosine(29) == 1.0
    constant = schedules.encoder_momentum(0.999, False, steps_per_epoch=10, total_steps=30)
    assert constant(0) == constant(29) == 0.999


def test_lr_schedule_scales_with_batch():
    optim = OmegaConf.structured(OptimConfig(lr=5e-4, warmup_epochs=2, min_lr=1e-6))
    lr = schedules.lr_schedule(optim, global_batch=1024, steps_per_epoch=10, total_steps=100)
    assert lr(0) == 0.0 and lr(19) == lr(20) == pytest.approx(5e-4 * 4)  # DINO: the peak at the last warmup step
    assert 1e-6 < lr(99) < 1e-5  # one step short of the end, as in DINO
    with pytest.raises(ValueError, match="lr_scaling"):
        schedules.scaled_lr(1.0, 1, 1, "cubic")


def _timm_optim(**options) -> OptimConfig:
    timm = dict(warmup_endpoint=False, warmup_prefix=False, lr_lag=1, weight_decay=0.05, weight_decay_end=0.05)
    return OmegaConf.structured(OptimConfig(**{**timm, **options}))


def test_deit_lr_per_epoch_one_epoch_late():
    """DeiT main.py (MoCo v3 transfer command): lr 3e-4 * 1024 / 512, --warmup-epochs 3 from --warmup-lr 1e-6,
    --min-lr 1e-5, 10 epochs. timm's CosineLRScheduler (t_in_epochs, no warmup_prefix) gives epoch t
    1e-6 + t (6e-4 - 1e-6) / 3 for t < 3, else 1e-5 + (6e-4 - 1e-5) / 2 (1 + cos(pi t / 10)); main.py calls
    lr_scheduler.step(epoch) after each epoch, so epoch e trains at value e - 1 and epoch 0 at the warm-up lr."""
    optim = _timm_optim(lr=3e-4, ref_batch=512, warmup_epochs=3, warmup_start_lr=1e-6, min_lr=1e-5, lr_step="epoch")
    lr = schedules.lr_schedule(optim, global_batch=1024, steps_per_epoch=4, total_steps=40)
    by_epoch = {
        0: 1e-6,
        1: 1e-6,
        2: 2.0066666666666665e-4,
        3: 4.003333333333333e-4,
        4: 4.7839664942627964e-4,  # 1e-5 + 2.95e-4 (1 + cos(0.3 pi))
        9: 6.633998665939054e-5,  # value 8: 1e-5 + 2.95e-4 (1 + cos(0.8 pi))
    }
    for epoch, expected in by_epoch.items():
        assert [lr(epoch * 4 + i) for i in range(4)] == pytest.approx([expected] * 4, rel=1e-12)


def test_drloc_lr_spans_total_epochs_while_training_stops_early():
    """DRLoc's main.py (Swin lr_scheduler.py): timm's CosineLRScheduler per iteration over TRAIN.EPOCHS =
    --total_epochs, here 30 epochs of 2 steps (t_initial 60, warmup_t 4 from 1e-6), lr 5e-4 * 1024 / 512, min 1e-5;
    training stops after 10 epochs. step_update(i) after update i sets update i + 1's lr."""
    optim = _timm_optim(lr=5e-4, ref_batch=512, warmup_epochs=2, warmup_start_lr=1e-6, min_lr=1e-5)
    optim.lr_schedule_epochs = 30
    lr = schedules.lr_schedule(optim, global_batch=1024, steps_per_epoch=2, total_steps=20)
    assert lr(0) == lr(1) == pytest.approx(1e-6)
    assert lr(2) == pytest.approx(2.5075e-4, rel=1e-12)  # 1e-6 + 1 * (1e-3 - 1e-6) / 4
    assert lr(5) == pytest.approx(9.891830623632338e-4, rel=1e-12)  # 1e-5 + 4.95e-4 (1 + cos(4 pi / 60))
    assert lr(19) == pytest.approx(7.959536998847742e-4, rel=1e-12)  # the last trained step: cos(18 pi / 60)
    assert lr(60) == pytest.approx(1e-5 + 4.95e-4 * (1 + math.cos(math.pi * 59 / 60)), rel=1e-12)  # the span's end
