"""Every method trains a few steps in one process with a tiny backbone (plain AdamW loop standing in for the
engine) and its loss goes down; plus the method-level behaviour the engine relies on."""

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from scale.config.schema import Recipe
from scale.data.batch import Batch
from scale.errors import UserError
from scale.methods import build_method
from scale.methods.base import StepContext
from scale.methods.config import MOCO_KINDS

STEPS_PER_EPOCH = 100


def recipe(kind: str, model: str = "vit_nano", **sections) -> object:
    cfg = OmegaConf.structured(Recipe)
    cfg.method.kind = kind
    cfg.model.name = model
    cfg.model.img_size = 32
    cfg.model.drop_path = 0.0
    cfg.data.num_classes = 4
    cfg.method.dino.out_dim = 128
    cfg.method.dino.hidden_dim = 64
    cfg.method.dino.bottleneck_dim = 32
    cfg.method.dino.freeze_last_layer = 0
    for framework in MOCO_KINDS:
        cfg.method[framework].dim = 16
        cfg.method[framework].mlp_dim = 64
    cfg.method.swav.prototypes = 32
    cfg.method.swav.freeze_prototypes_steps = 0
    cfg.method.drloc.hidden_dim = 64
    for dotted, value in sections.items():
        OmegaConf.update(cfg, dotted.replace("__", "."), value)
    return cfg


def images(n: int, size: int, seed: int) -> torch.Tensor:
    """Smooth random images (low-frequency noise upsampled), so that crops of one image resemble each other."""
    g = torch.Generator().manual_seed(seed)
    return F.interpolate(torch.randn(n, 3, 4, 4, generator=g), size=size, mode="bilinear", align_corners=False)


def make_batch(batch: int = 8, n_global: int = 2, global_size: int = 32, locals_: tuple = (), seed: int = 0) -> Batch:
    base = images(batch, 2 * global_size, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)

    def view(size):
        noisy = base + 0.1 * torch.randn(base.shape, generator=g)
        return F.interpolate(noisy, size=size, mode="bilinear", align_corners=False)

    crops = [torch.cat([view(global_size) for _ in range(n_global)])]
    views = [n_global]
    for count, size in locals_:
        crops.append(torch.cat([view(size) for _ in range(count)]))
        views.append(count)
    labels = torch.arange(batch) % 4
    return Batch(crops, views, labels, [f"img{i}" for i in range(batch)])


def train(method, batch: Batch | list[Batch], steps: int, lr: float = 1e-3) -> list[float]:
    """A plain AdamW loop following the engine's contract: backward, frozen params get no update, then EMA. A list
    of batches is taken in turn."""
    batches = batch if isinstance(batch, list) else [batch]
    params = [(n, p) for n, p in method.student.named_parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW([p for _, p in params], lr=lr, weight_decay=0.0)
    losses = []
    for step in range(steps):
        ctx = StepContext(step=step, epoch=step // STEPS_PER_EPOCH, steps_per_epoch=STEPS_PER_EPOCH, total_steps=steps)
        loss, metrics = method.loss(batches[step % len(batches)], ctx)
        assert torch.isfinite(loss) and metrics["loss"] == pytest.approx(loss.item())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        frozen = method.frozen_params(ctx)
        for name, p in params:
            if frozen is not None and frozen(name):
                p.grad = None
        optimizer.step()
        momentum = method.ema_momentum(ctx)
        if method.teacher is not None:
            student = dict(method.student.named_parameters())
            with torch.no_grad():
                for name, t in method.teacher.named_parameters():
                    t.lerp_(student[name], 1 - momentum)
        losses.append(loss.item())
    return losses


def assert_goes_down(losses: list[float], k: int = 3) -> None:
    first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
    assert last < first, f"loss did not go down: {losses}"


def build(cfg, total_steps: int = 1000):
    torch.manual_seed(0)
    return build_method(cfg, STEPS_PER_EPOCH, total_steps)


def test_dino_trains_with_multicrop():
    method = build(recipe("dino"))
    assert set(dict(method.teacher.named_parameters())) <= set(dict(method.student.named_parameters()))
    assert not any(p.requires_grad for p in method.teacher.parameters())
    losses = train(method, make_batch(locals_=((4, 16),)), 12)
    assert_goes_down(losses)
    assert method.state_dict()["center"].shape == (1, 128)


def test_dino_schedules_and_frozen_last_layer():
    cfg = recipe(
        "dino",
        method__dino__freeze_last_layer=1,
        method__dino__warmup_teacher_temp_epochs=5,
        method__dino__teacher_temp=0.07,
    )
    method = build(cfg, total_steps=10 * STEPS_PER_EPOCH)
    ctx0 = StepContext(0, 0, STEPS_PER_EPOCH, 10 * STEPS_PER_EPOCH)
    later = StepContext(STEPS_PER_EPOCH * 6, 6, STEPS_PER_EPOCH, 10 * STEPS_PER_EPOCH)
    frozen = method.frozen_params(ctx0)
    assert frozen("head.last_layer.weight_v") and not frozen("head.mlp.0.weight")
    assert method.frozen_params(later) is None
    assert method.ema_momentum(ctx0) == pytest.approx(0.996) and method.ema_momentum(later) > 0.996
    assert method.temperature(ctx0) == pytest.approx(0.04) and method.temperature(later) == pytest.approx(0.07)
    before = method.student.head.last_layer.weight_v.clone()
    train(method, make_batch(), 2)
    assert torch.equal(before, method.student.head.last_layer.weight_v)


@pytest.mark.parametrize(
    "option",
    [
        {"method__dino__teacher": "copy", "method__dino__centering": "sinkhorn"},  # Table 7 row 9 style
        {"method__dino__loss": "mse"},
        {"method__dino__predictor": True},
    ],
)
def test_dino_table7_variants_train(option):
    method = build(recipe("dino", **option))
    losses = train(method, make_batch(locals_=((2, 16),)), 8)
    assert all(torch.isfinite(torch.tensor(losses)))
    if option.get("method__dino__teacher") == "copy":
        assert method.ema_momentum(StepContext(5, 0, STEPS_PER_EPOCH, 1000)) == 0.0
    if option.get("method__dino__predictor"):
        assert any("predictor" in n for n, _ in method.student.named_parameters())
        assert not any("predictor" in n for n, _ in method.teacher.named_parameters())
    if option.get("method__dino__loss") == "mse":
        assert_goes_down(losses)


def test_esvit_trains_on_swin_with_region_loss():
    cfg = recipe("esvit", model="swin_nano", model__img_size=64)
    method = build(cfg)
    batch = make_batch(global_size=64, locals_=((2, 32),))
    losses = train(method, batch, 10)
    assert_goes_down(losses)
    _, metrics = method.loss(batch, StepContext(10, 0, STEPS_PER_EPOCH, 1000))
    assert {"view_loss", "region_loss", "teacher_entropy"} <= set(metrics)
    assert method.state_dict()["region_center"].shape == (1, 128)


def test_esvit_region_loss_and_center_follow_the_equations():
    """The method's region loss and region center against a per-pair computation from its nets' outputs."""
    method = build(recipe("esvit", model="swin_nano", model__img_size=64))
    method.region_center = torch.randn(1, 128)
    center, dc = method.region_center.clone(), method.cfg
    batch = make_batch(batch=2, global_size=64, locals_=((2, 32),))
    ctx = StepContext(0, 0, STEPS_PER_EPOCH, 1000)
    with torch.no_grad():
        teacher, student = method.teacher(batch.crops[:1]), method.student(batch.crops)
    _, metrics = method.loss(batch, ctx)
    t_logits = teacher["region_logits"].float()
    probs = torch.softmax((t_logits - center) / method.temperature(ctx), -1)
    t_tokens = list(teacher["tokens"][0].chunk(2))
    s_tokens = list(student["tokens"][0].chunk(2)) + list(student["tokens"][1].chunk(2))
    s_region = student["region_logits"].split([t.shape[0] * t.shape[1] for t in s_tokens])
    t_probs = probs.split([t.shape[0] * t.shape[1] for t in t_tokens])
    terms = []
    for i, t in enumerate(t_tokens):
        for v, s in enumerate(s_tokens):
            if v != i:
                sim = F.normalize(s, dim=-1) @ F.normalize(t, dim=-1).transpose(1, 2)
                rows = (sim.argmax(-1) + torch.arange(2).unsqueeze(1) * t.shape[1]).flatten()
                terms.append(-(t_probs[i][rows] * torch.log_softmax(s_region[v] / dc.student_temp, -1)).sum(-1).mean())
    assert metrics["region_loss"] == pytest.approx(torch.stack(terms).mean().item(), rel=1e-5)
    expected_center = center * dc.center_momentum + t_logits.mean(0, keepdim=True) * (1 - dc.center_momentum)
    assert torch.allclose(method.region_center, expected_center, atol=1e-6)


def test_esvit_region_loss_from_epoch():
    method = build(recipe("esvit", method__esvit__region_from_epoch=2))
    batch = make_batch()
    loss, metrics = method.loss(batch, StepContext(0, 0, STEPS_PER_EPOCH, 1000))
    assert "region_loss" not in metrics and loss.item() == pytest.approx(metrics["view_loss"])
    _, metrics = method.loss(batch, StepContext(250, 2, STEPS_PER_EPOCH, 1000))
    assert "region_loss" in metrics


def test_esvit_region_from_epoch_two_phases_and_resume():
    """method.esvit.region_from_epoch = N: the released continued_from0200_dense runs (L_V, then L_R added at epoch
    N). Before N the loss is the view loss alone, the region head gets no gradient (student and teacher keep their
    common init, as the official continuation builds a fresh head_dense) and the region center stays zero; from N
    the loss is (1 - w) L_V + w L_R. A run resumed at N from a view-only checkpoint (no region center, as the
    official one) and a run resumed after N (the region center saved) compute what the run that went on computes."""
    cfg = recipe("esvit", method__esvit__region_from_epoch=2)
    batch, per_epoch = make_batch(), 2

    def ctx(step):
        return StepContext(step, step // per_epoch, per_epoch, 6 * per_epoch)

    method = build(cfg)
    optimizer = torch.optim.AdamW([p for p in method.student.parameters() if p.requires_grad], lr=1e-3)

    def step(i):
        loss, metrics = method.loss(batch, ctx(i))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        region_grads = [
            p.grad for n, p in method.student.named_parameters() if n.startswith("region_head.") and p.requires_grad
        ]
        optimizer.step()
        with torch.no_grad():
            student = dict(method.student.named_parameters())
            for name, t in method.teacher.named_parameters():
                t.lerp_(student[name], 1 - method.ema_momentum(ctx(i)))
        return loss, metrics, region_grads

    def region_head(net):
        return {n: p.detach().clone() for n, p in net.named_parameters() if n.startswith("region_head.")}

    def snapshot(with_region_center=True):
        state = {k: v.clone() for k, v in method.state_dict().items()}
        if not with_region_center:
            del state["region_center"]
        return [{k: v.clone() for k, v in net.state_dict().items()} for net in (method.student, method.teacher)], state

    def resumed(snap):
        other = build(cfg)
        for net, weights in zip((other.student, other.teacher), snap[0]):
            net.load_state_dict(weights)
        other.load_state_dict(snap[1])
        return other

    init = region_head(method.student)
    assert init and all(torch.equal(init[n], p) for n, p in region_head(method.teacher).items())
    for i in range(2 * per_epoch):  # epochs 0 and 1: L_V only
        loss, metrics, region_grads = step(i)
        assert "region_loss" not in metrics and loss.item() == pytest.approx(metrics["view_loss"])
        assert all(g is None for g in region_grads)
    for net in (method.student, method.teacher):
        assert all(torch.equal(init[n], p) for n, p in region_head(net).items())
    assert not method.region_center.any()

    view_only = resumed(snapshot(with_region_center=False))  # the official continuation's starting point
    assert not view_only.region_center.any()
    first = 2 * per_epoch  # epoch N
    expected, _ = view_only.loss(batch, ctx(first))
    loss, metrics, region_grads = step(first)
    assert "region_loss" in metrics and all(g is not None for g in region_grads)
    w = cfg.method.esvit.region_weight
    assert loss.item() == pytest.approx(((1 - w) * metrics["view_loss"] + w * metrics["region_loss"]).item(), rel=1e-5)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert method.region_center.any() and torch.equal(view_only.region_center, method.region_center)

    later = resumed(snapshot())  # a checkpoint after N keeps the region center
    assert torch.equal(later.region_center, method.region_center)
    expected, expected_metrics = later.loss(batch, ctx(first + 1))
    loss, metrics, _ = step(first + 1)
    assert metrics["region_loss"].item() == pytest.approx(expected_metrics["region_loss"].item(), rel=1e-6)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


@pytest.mark.parametrize("variant", ["mocov3", "simclr", "byol", "swav"])
def test_two_view_frameworks_train(variant):
    method = build(recipe(variant))
    losses = train(method, make_batch(), 10)
    assert_goes_down(losses)
    if variant in ("mocov3", "byol"):
        names = set(dict(method.teacher.named_parameters()))
        assert names <= set(dict(method.student.named_parameters()))
        assert not any(n.startswith("predictor") for n in names)
        assert method.ema_momentum(StepContext(0, 0, STEPS_PER_EPOCH, 1000)) >= 0.99


def test_mocov2_trains_against_a_queue_of_other_images_keys():
    """Two batches of different images in turn and a queue of one step's keys (2 views x 8 images), so that each
    step's negatives are the other batch's keys (with one batch, a queue holds the positives' own earlier keys). In
    fp32 nothing casts the queue: backward needs it as it was when the logits were computed."""
    cfg = recipe(
        "mocov2",
        method__mocov2__queue_size=16,
        method__mocov2__momentum=0.999,
        method__mocov2__momentum_cosine=False,
    )
    method = build(cfg)
    names = set(dict(method.teacher.named_parameters()))
    assert names == set(dict(method.student.named_parameters()))  # no predictor: the encoders match
    assert method.ema_momentum(StepContext(0, 0, STEPS_PER_EPOCH, 1000)) == 0.999
    assert method.ema_momentum(StepContext(900, 9, STEPS_PER_EPOCH, 1000)) == 0.999
    losses = train(method, [make_batch(seed=0), make_batch(seed=1)], 14)
    # steps 0 and 1 see the random unit keys the queue starts with (easy negatives) and their replacement
    assert_goes_down(losses[2:])


@pytest.mark.parametrize("size, steps", [(40, 3), (12, 1)])
def test_mocov2_loss_uses_the_queue_before_the_step_then_enqueues_its_keys(size, steps):
    """MoCo's order: logits against the queue, then this step's keys (both views, normalised) replace the oldest
    entries, as if written one by one into a ring (wrapping; with more keys than the queue holds, the newest stay)."""
    from scale.methods.mocov2 import queue_contrastive

    method = build(recipe("mocov2", method__mocov2__queue_size=size))
    batch = make_batch()
    ring = method.queue.clone()
    with torch.no_grad():  # the batch and the nets do not change here: every step has the same queries and keys
        q1, q2 = method.student(batch.crops[:1], batch.views_per_group[:1], False)["z"].chunk(2)
        keys = method.teacher(batch.crops[:1], batch.views_per_group[:1], False)["z"]
    k1, k2 = keys.chunk(2)
    written = 0
    for step in range(steps):
        loss, _ = method.loss(batch, StepContext(step, 0, STEPS_PER_EPOCH, 1000))
        tau = method.cfg.temperature
        expected = queue_contrastive(q1, k2, ring, tau) + queue_contrastive(q2, k1, ring, tau)
        assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
        loss.backward()
        for key in F.normalize(keys, dim=1):
            ring[written % size] = key
            written += 1
    state = method.state_dict()  # holds the last step's keys too
    assert torch.allclose(state["queue"], ring, atol=1e-6) and int(state["queue_ptr"]) == written % size


def test_moco_joint_bn_batching_and_momentum_schedule():
    cfg = recipe("mocov3", method__mocov3__bn_batching="joint", method__mocov3__momentum=0.99)
    method = build(cfg, total_steps=3 * STEPS_PER_EPOCH)
    assert method.ema_momentum(StepContext(3 * STEPS_PER_EPOCH - 1, 2, STEPS_PER_EPOCH, 300)) == pytest.approx(1.0)
    assert_goes_down(train(method, make_batch(), 8))
    with pytest.raises(UserError, match="2 global views"):
        method.loss(make_batch(n_global=3), StepContext(0, 0, STEPS_PER_EPOCH, 300))


@pytest.mark.parametrize("variant", ["mocov3", "byol"])
def test_per_view_bn_heads_with_one_image_per_forward_name_the_setting(variant):
    method = build(recipe(variant))
    ctx = StepContext(step=0, epoch=0, steps_per_epoch=1, total_steps=1)
    with pytest.raises(UserError, match=rf"needs at least 2 per forward, got 1.*method\.{variant}\.bn_batching=joint"):
        method.loss(make_batch(batch=1), ctx)
    joint = build(recipe(variant, **{f"method__{variant}__bn_batching": "joint"}))
    assert torch.isfinite(joint.loss(make_batch(batch=1), ctx)[0])  # two views: two images per BatchNorm


def test_supervised_trains_and_mixup_runs():
    method = build(recipe("supervised", method__supervised__mixup=0.0, method__supervised__cutmix=0.0))
    assert_goes_down(train(method, make_batch(n_global=1), 10))
    mixed = build(recipe("supervised"))
    images, targets = mixed.inputs(make_batch(n_global=1))
    assert targets.shape == (8, 4) and torch.allclose(targets.sum(-1), torch.ones(8))
    bad = make_batch(n_global=1)
    bad.labels[3] = 9
    with pytest.raises(UserError, match="img3"):  # checked on the host, before the step copies it to the device
        mixed.check_batch(bad)


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"method__drloc__mode": "ce"},
        {"method__drloc__mode": "gaussian", "method__drloc__exhaustive": True},
        {"method__drloc__every_block": True, "method__drloc__mode": "signed"},
    ],
)
def test_drloc_trains_on_swin(options):
    base = {"method__supervised__mixup": 0.0, "method__supervised__cutmix": 0.0}
    method = build(recipe("drloc", model="swin_nano", model__img_size=64, **base, **options))
    batch = make_batch(n_global=1, global_size=64)
    losses = train(method, batch, 12)
    assert_goes_down(losses)
    _, metrics = method.loss(batch, StepContext(0, 0, STEPS_PER_EPOCH, 1000))
    assert metrics["drloc_loss"] > 0 and metrics["ce_loss"] > 0
    if options.get("method__drloc__every_block"):
        assert len(method.student.drloc_heads) == len(method.student.backbone.block_modules())


def test_drloc_on_vit_pools_the_grid():
    method = build(
        recipe(
            "drloc",
            model__img_size=64,
            method__drloc__grid=2,
            method__supervised__mixup=0.0,
            method__supervised__cutmix=0.0,
        )
    )
    out = method.student(make_batch(n_global=1, global_size=64).crops[0], drloc_sampler=method.sampler)
    pos1, pos2, k = out["drloc_positions"][0]
    assert k == 2 and out["drloc"][0].shape == (8, 64, 2)


def test_unknown_kind_is_a_user_error():
    with pytest.raises(UserError, match="method.kind"):
        build(recipe("barlow"))
    with pytest.raises(UserError, match="method.kind: unknown method 'moco_v2'"):
        build(recipe("moco_v2"))


@pytest.mark.parametrize("kind", ["dino", "mocov3", "drloc"])
def test_methods_build_on_the_meta_device(kind):
    from scale.engine.materialize import materialize

    method = build_method(recipe(kind), STEPS_PER_EPOCH, 1000, device="meta")
    modules = [m for m in (method.student, method.teacher) if m is not None]
    assert all(p.is_meta for m in modules for p in m.parameters())
    for module in modules:  # the engine's init after sharding; fails if a head leaves a tensor uninitialised
        materialize(module, torch.device("cpu"))
    if kind == "dino":
        assert torch.all(method.student.head.last_layer.weight_g == 1)
        assert method.student.head.mlp[0].weight.std().item() == pytest.approx(0.02, rel=0.2)


@pytest.mark.parametrize("model", ["vit_nano", "vit_bn_nano"])
def test_per_view_bn_batching_is_one_view_at_a_time(model):
    method = build(recipe("mocov3", model=model))
    net, x = method.student, make_batch(batch=6).crops[0]
    per_view = net([x], [2], per_view_bn=True)["p"]
    one_at_a_time = torch.cat([net([v], [1], per_view_bn=True)["p"] for v in x.chunk(2)])
    assert torch.allclose(per_view, one_at_a_time, atol=1e-5)
    assert not torch.allclose(net([x], [2], per_view_bn=False)["p"], per_view, atol=1e-3)
