"""The planner's network bytes against the collectives of one real step: 4 gloo ranks play 2 nodes x 2 GPUs, every
collective of a training step (after a warm-up step) is counted with its group, and the bytes each rank sends inside
and across the simulated nodes (ring model, as the planner assumes) match the planner's DDP, FSDP2 and HSDP
predictions within 10%."""

import contextlib
import inspect
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from scale.bench.plan import Setting, ring, traffic
from scale.bench.trace import trace_step
from scale.cli import main
from scale.config import load_recipe
from tests.engine.engine_toy import all_ranks, spawn

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out

TINY_RECIPE = str(Path(__file__).with_name("tiny_dino.yaml"))
WORLD, GPUS_PER_NODE, IMAGES = 4, 2, 2  # images per rank
ENGINES = {"ddp": {"engine.kind": "ddp"}, "fsdp2": {"engine.kind": "fsdp2"}, "hsdp": {"engine.shard_size": 2}}


class Counter:
    """Bytes this rank sends in the counted collectives, by link (ring over each collective's group)."""

    def __init__(self):
        self.sent = None

    def add(self, op: str, tensor: torch.Tensor, group) -> None:
        ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
        nodes = [r // GPUS_PER_NODE for r in ranks]
        crossings = sum(a != b for a, b in zip(nodes, nodes[1:] + nodes[:1]))
        share = ring(op, tensor.numel() * tensor.element_size(), len(ranks), 1).total
        if self.sent is not None:
            self.sent[0] += share * (1 - crossings / len(ranks))
            self.sent[1] += share * crossings / len(ranks)

    @contextlib.contextmanager
    def counting(self):
        """Wrap the collectives the engines and losses call (FSDP2's all-gather and reduce-scatter, all-reduces);
        the full tensor of each: (ring op, the argument that holds it)."""
        full_tensor = {
            "all_reduce": ("all_reduce", "tensor"),
            "all_gather_single": ("all_gather", "output_tensor"),
            "reduce_scatter_single": ("reduce_scatter", "input"),
        }
        originals = {name: getattr(dist, name) for name in full_tensor}

        def counted(name):
            signature = inspect.signature(originals[name])

            def call(*args, **kwargs):
                bound = signature.bind(*args, **kwargs).arguments
                op, tensor = full_tensor[name]
                self.add(op, bound[tensor], bound.get("group"))
                return originals[name](*args, **kwargs)

            return call

        self.sent = [0.0, 0.0]
        for name in full_tensor:
            setattr(dist, name, counted(name))
        try:
            yield
        finally:
            for name, fn in originals.items():
                setattr(dist, name, fn)


def counted_step(overrides: dict) -> list:
    """One warm-up step, then one counted step; every rank's (intra, inter) bytes."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from scale.data.synthetic import random_batch
    from scale.engine import build_engine
    from scale.engine.dist import detect
    from scale.engine.parallel import parallel_context
    from scale.methods import build_method
    from scale.methods.base import StepContext

    cfg = load_recipe(TINY_RECIPE, [f"{k}={v}" for k, v in overrides.items()])
    cpu = torch.device("cpu")
    info = parallel_context(detect(), cpu, cfg.engine.shard_size)
    method = build_method(cfg, 2, 2, dp_group=info.dp_group)
    engine = build_engine(cfg.engine, cfg.optim, info, cpu)
    engine.setup(method)
    counter = Counter()
    if cfg.engine.kind == "ddp":  # DDP reduces in C++; its default hook does the same all-reduce through Python
        method.student.register_comm_hook(info.dp_group, allreduce_hook)
    for step in range(2):
        ctx = StepContext(step=step, epoch=0, steps_per_epoch=2, total_steps=2)
        batch = random_batch(cfg, IMAGES, torch.Generator().manual_seed(10 * step + info.rank))
        with counter.counting() if step == 1 else contextlib.nullcontext():
            loss, _ = method.loss(batch, ctx)
            engine.backward(loss)
            engine.step(method.frozen_params(ctx))
            engine.ema(method.ema_momentum(ctx))
    return all_ranks(counter.sent)


def jobs() -> dict:
    return {name: counted_step(overrides) for name, overrides in ENGINES.items()}


@pytest.fixture(scope="module")
def counted(tmp_path_factory):
    return spawn(jobs, world=WORLD, tmp_path=tmp_path_factory.mktemp("plan_network"))


@pytest.mark.parametrize("engine", list(ENGINES))
def test_planned_bytes_match_a_counted_step(counted, engine):
    trace = trace_step(load_recipe(TINY_RECIPE))
    setting = Setting("fsdp2" if engine == "hsdp" else engine, micro_batch=IMAGES)
    if engine == "hsdp":
        setting = Setting("hsdp", micro_batch=IMAGES, shard_size=GPUS_PER_NODE)
    planned = traffic(trace, setting, WORLD, GPUS_PER_NODE, "fp32")
    for rank, (intra, inter) in enumerate(counted[engine]):
        assert intra == pytest.approx(planned.intra, rel=0.1), (rank, intra, inter, planned)
        assert inter == pytest.approx(planned.inter, rel=0.1), (rank, intra, inter, planned)


def test_hsdp_keeps_the_parameter_traffic_inside_the_nodes(counted):
    # the point of HSDP: per step, only the gradient shards' all-reduce crosses nodes
    fsdp_inter, hsdp_inter = counted["fsdp2"][0][1], counted["hsdp"][0][1]
    assert hsdp_inter < fsdp_inter / 3


def test_plan_command_prints_bytes_per_link_for_nodes(capsys):
    args = ["plan", TINY_RECIPE, "--nodes", "2", "--gpus-per-node", "4", "--gpu-mem", "1", "--gpu-tflops", "10"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "intra GB" in out and "inter GB" in out and "2 node(s) x 4 GPU(s)" in out
    rows = {line.split()[0] for line in out.splitlines() if line[:1].isalpha()}
    assert {"ddp", "fsdp2", "hsdp/4", "zero1", "zero2", "zero3"} <= rows
    assert "proposed:" in out
    assert main(["plan", TINY_RECIPE, "--nodes", "2", "--gpu-mem", "1"]) == 2
