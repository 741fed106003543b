"""The training step never makes the host wait for the device between log steps: no `.item()`, `.tolist()`,
`bool(tensor)` or host copy (each of them calls aten._local_scalar_dense, counted here), for every method under
DDP and FSDP2 (one gloo process), multi-crop included, and with engine.compile, whose compiled steps also reuse the
first step's graphs."""

import pytest
import torch
from torch._dynamo.utils import counters

from scale.bench.host import SyncCounter
from scale.config import load_recipe
from scale.data.synthetic import SyntheticLoader
from scale.loop.step import TrainStep, read_record

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out

TINY = {
    "dino": ["data.views.n_local=[2]"],
    "esvit": ["data.views.n_local=[2]", "method.esvit.region_from_epoch=0"],
    "mocov3": [],
    "drloc": ["method.supervised.mixup=0.0"],
}


def build_step(group, method: str, engine: str, *extra: str) -> TrainStep:
    info, device = group
    overrides = [
        "train.global_batch=4",
        f"engine.kind={engine}",
        "engine.unsharded_ddp=false",  # fsdp2: FSDP2 itself, which one rank would run as DDP (kinds.runs_as)
        "train.knn_monitor_every=0",
        "train.grad_monitor_every=0",
        *TINY[method],
        *extra,
    ]
    cfg = load_recipe(f"demo/{method}_tiny", overrides)
    return TrainStep(cfg, info, device, lambda: SyntheticLoader(cfg, info.rank, info.world_size))


@pytest.mark.parametrize("engine", ["ddp", "fsdp2"])
@pytest.mark.parametrize("method", ["dino", "esvit", "mocov3", "drloc"])
def test_no_host_sync_in_a_step(group, method, engine):
    step = build_step(group, method, engine)
    batches = step.batches()
    step(0, step.next_batch(batches)[0])  # warm-up: lazily built state (DINO's center on the device, ...)
    batch = step.next_batch(batches)[0]
    with SyncCounter() as counter:
        record = step(1, batch)
    assert not counter.places, f"{len(counter.places)} host syncs in one step, first at:\n{counter.places[0]}"
    assert step.guard.read() is None
    assert torch.isfinite(torch.tensor(read_record(record)["loss"]))


@pytest.mark.parametrize("engine", ["ddp", "fsdp2"])
def test_selective_checkpointing_trains_as_without(group, engine):
    """Selective activation checkpointing composed with the engine and multi-crop: the same losses and weights."""
    runs = []
    for mode in ("none", "selective"):
        step = build_step(group, "dino", engine, f"engine.activation_checkpointing={mode}")
        batches = step.batches()
        losses = [read_record(step(i, step.next_batch(batches)[0]))["loss"] for i in range(2)]
        weights = {n: p.detach().clone() for n, p in step.method.student.named_parameters()}
        runs.append((losses, weights))
    (plain_losses, plain), (selective_losses, selective) = runs
    assert selective_losses == pytest.approx(plain_losses, abs=1e-6)
    for name, value in plain.items():
        torch.testing.assert_close(selective[name], value, rtol=0, atol=1e-6, msg=name)


# aot_eager: the graphs inductor would compile, run on eager kernels (each op still dispatches, so a host read in a
# graph is counted), at a fraction of inductor's compile time on a CPU
COMPILE = ["engine.compile=true", "engine.compile_backend=aot_eager", "model.drop_path=0.1"]
# multi-crop: ViT with 2 global (16 px) + 2 local crops of each of two sizes, Swin with 2 global + 2 local
CROPS = {"dino": ["data.views.local_sizes=[8,12]", "data.views.n_local=[2,2]"], "esvit": []}


@pytest.mark.parametrize(
    "method,engine,scope",
    [*((m, e, "blocks") for m in ("dino", "esvit") for e in ("ddp", "fsdp2")), ("dino", "ddp", "net")],
)
def test_compiled_steps_reuse_the_first_steps_graphs_and_do_not_sync(group, method, engine, scope):
    """engine.compile: the first step compiles a graph per distinct block (drop-path rate) and crop resolution, for
    the student, the teacher and the heads (engine.compile_scope=net: per net and call shape); the next steps run
    them again without recompiling, without a graph break and without a host sync."""
    torch._dynamo.reset()
    counters.clear()
    step = build_step(group, method, engine, *COMPILE, *CROPS[method], f"engine.compile_scope={scope}")
    batches = step.batches()
    step(0, step.next_batch(batches)[0])
    graphs = counters["stats"]["unique_graphs"]
    if scope == "net":  # the student's call over every crop group, the teacher's over the global crops
        assert graphs == 2
    else:
        assert graphs >= len(step.cfg.data.views.local_sizes) + 1  # at least one per resolution
    for index in (1, 2, 3):
        batch = step.next_batch(batches)[0]
        with SyncCounter() as counter:
            record = step(index, batch)
        assert not counter.places, f"{len(counter.places)} host syncs in step {index}, first at:\n{counter.places[0]}"
        assert counters["stats"]["unique_graphs"] == graphs, f"step {index} recompiled"
    assert not counters["graph_break"]
    assert torch.isfinite(torch.tensor(read_record(record)["loss"]))


@pytest.mark.parametrize("mode,marks", [("reduce-overhead", 3), ("max-autotune", 3), ("default", 0)])
def test_each_step_is_one_generation_of_cuda_graph_trees(group, monkeypatch, mode, marks):
    """engine.compile_mode with CUDA graphs: every step begins by marking a new generation of inductor's CUDA graph
    trees (scale.engine.compile.begin_graph_step), so that no output of the step's no-grad teacher blocks is
    overwritten before the loss reads it (which failed DINO ViT-S/16 on an H200); none in the other modes. The
    marking is what this tests: torch.compile is the identity here (the graphs themselves: tests/gpu)."""
    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: calls.append(len(calls)))
    step = build_step(group, "dino", "ddp", "engine.compile=true", f"engine.compile_mode={mode}")
    batches = step.batches()
    for index in range(3):
        step(index, step.next_batch(batches)[0])
    assert len(calls) == marks


def test_a_batchnorm_backbone_under_full_checkpointing_compiles_whole_and_trains_as_eager(group):
    """MoCo v3's ViT-BN with full activation checkpointing: per block, its checkpointed BatchNorm blocks stay eager
    (scale/engine/compile.py); engine.compile_scope=net compiles each net whole, BatchNorm blocks included (issue
    44: ViT-BN-L/7 compiled whole): one graph for the student and one for the momentum encoder, no break, no
    recompile, and the eager step's losses and weights."""
    bn = ["model.name=vit_bn_nano", "engine.activation_checkpointing=full"]
    runs = []
    for compiled in (False, True):
        torch._dynamo.reset()
        counters.clear()
        extra = ["engine.compile=true", "engine.compile_backend=aot_eager", "engine.compile_scope=net"]
        step = build_step(group, "mocov3", "ddp", *bn, *(extra if compiled else []))
        batches = step.batches()
        losses = [read_record(step(i, step.next_batch(batches)[0]))["loss"] for i in range(3)]
        runs.append((losses, {n: p.detach().clone() for n, p in step.method.student.named_parameters()}))
        assert counters["stats"]["unique_graphs"] == (2 if compiled else 0) and not counters["graph_break"]
    (eager_losses, eager), (compiled_losses, compiled) = runs
    assert compiled_losses == pytest.approx(eager_losses, abs=1e-6)
    for name, value in eager.items():
        torch.testing.assert_close(compiled[name], value, rtol=0, atol=1e-6, msg=name)
