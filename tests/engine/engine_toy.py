"""A toy method that satisfies the Method contract, a plain single-process reference loop, and a 2-process runner.

The toy is DINO-shaped: a student (backbone with blocks, BatchNorm and a 1-row token; head with a last layer; a
predictor the teacher lacks, as in MoCo), an EMA teacher, several student forwards per step (global and local
crops) and a frozen last layer in the first steps.
"""

import contextlib
import dataclasses
import faulthandler
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from scale.data.batch import Batch
from scale.engine.config import EngineConfig, OptimConfig
from scale.engine.dist import device_for, free_port
from scale.methods.base import Method, StepContext

IN_DIM, DIM, OUT_DIM = 8, 16, 12
GLOBAL_BATCH, N_GLOBAL, N_LOCAL = 8, 2, 3
STEPS, FROZEN_STEPS = 5, 2
LR, WD, MOMENTUM = 1e-2, 0.04, 0.9
MOMENTS = ("exp_avg", "exp_avg_sq")  # Adam's state per parameter that a resume must restore


class Block(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return x + F.gelu(self.fc(self.norm(x)))


class Backbone(nn.Module):
    def __init__(self, dim: int = DIM, depth: int = 3):
        super().__init__()
        self.embed = nn.Linear(IN_DIM, dim)
        self.token = nn.Parameter(torch.randn(1, dim) * 0.02)  # 1 row: an empty shard on rank 1 under FSDP2
        self.blocks = nn.ModuleList(Block(dim) for _ in range(depth))
        self.bn = nn.BatchNorm1d(dim)
        self.norm = nn.LayerNorm(dim)

    def reset_parameters(self):
        nn.init.normal_(self.token, std=0.02)

    def block_modules(self):
        return list(self.blocks)

    def forward(self, x):
        h = self.embed(x) + self.token
        for block in self.blocks:
            h = block(h)
        return self.norm(self.bn(h))


class Head(nn.Module):
    def __init__(self, dim: int = DIM):
        super().__init__()
        self.mlp = nn.Linear(dim, dim)
        self.last_layer = nn.Linear(dim, OUT_DIM)

    def forward(self, x):
        return self.last_layer(F.gelu(self.mlp(x)))


class Net(nn.Module):
    def __init__(self, predictor: bool, dim: int = DIM, depth: int = 3):
        super().__init__()
        self.backbone = Backbone(dim, depth)
        self.head = Head(dim)
        self.predictor = nn.Linear(OUT_DIM, OUT_DIM) if predictor else None

    def forward(self, x):
        out = self.head(self.backbone(x))
        return self.predictor(out) if self.predictor is not None else out


class ToyMethod(Method):
    def __init__(self, dim: int = DIM, depth: int = 3, frozen_steps: int = FROZEN_STEPS):
        self.frozen_steps = frozen_steps
        self.student = Net(predictor=True, dim=dim, depth=depth)
        self.teacher = Net(predictor=False, dim=dim, depth=depth)
        self.teacher.load_state_dict(self.student.state_dict(), strict=False)
        self.teacher.requires_grad_(False)

    def loss(self, batch: Batch, ctx: StepContext):
        global_crops, local_crops = batch.crops
        student_out = [self.student(global_crops).float(), self.student(local_crops).float()]
        with torch.no_grad():
            teacher_out = self.teacher(global_crops).float()
        targets = F.softmax(teacher_out / 0.05, dim=-1).chunk(N_GLOBAL)
        views = torch.cat(student_out).div(0.1).chunk(N_GLOBAL + N_LOCAL)
        terms = [
            torch.sum(-t * F.log_softmax(v, dim=-1), dim=-1).mean()
            for i, t in enumerate(targets)
            for j, v in enumerate(views)
            if i != j
        ]
        loss = sum(terms) / len(terms)
        return loss, {"loss": float(loss.detach())}

    def ema_momentum(self, ctx):
        return MOMENTUM

    def frozen_params(self, ctx):
        return (lambda name: "last_layer" in name) if ctx.step < self.frozen_steps else None


def make_batch(step: int) -> Batch:
    gen = torch.Generator().manual_seed(1000 + step)
    crops = [
        torch.randn(N_GLOBAL * GLOBAL_BATCH, IN_DIM, generator=gen),
        torch.randn(N_LOCAL * GLOBAL_BATCH, IN_DIM, generator=gen),
    ]
    return Batch(crops, [N_GLOBAL, N_LOCAL], torch.zeros(GLOBAL_BATCH, dtype=torch.long))


def shard_batch(batch: Batch, index: int, count: int) -> Batch:
    """Images index*B/count .. of every view: what rank `index` of `count` gets from the global batch."""
    size = batch.batch_size // count
    crops = []
    for crop, views in zip(batch.crops, batch.views_per_group):
        per_view = crop.reshape(views, batch.batch_size, *crop.shape[1:])
        crops.append(per_view[:, index * size : (index + 1) * size].reshape(views * size, *crop.shape[1:]))
    return Batch(crops, list(batch.views_per_group), batch.labels[index * size : (index + 1) * size])


def context(step: int) -> StepContext:
    return StepContext(step=step, epoch=0, steps_per_epoch=STEPS, total_steps=STEPS)


def optim_config(**kw) -> OptimConfig:
    return dataclasses.replace(OptimConfig(lr=LR, weight_decay=WD, clip_grad=0.0), **kw)


# --- the reference: one process, plain modules, the global batch as `splits` halves averaged
def dino_clip(params, clip: float) -> None:
    for p in params:
        norm = p.grad.norm(2)
        coef = clip / (norm + 1e-6)
        if coef < 1:
            p.grad.mul_(coef)


def reference_run(optim_kw: dict, splits: int = 2, steps: int = STEPS, method_kw: dict | None = None) -> dict:
    torch.manual_seed(0)
    method = ToyMethod(**(method_kw or {}))
    cfg = optim_config(**optim_kw)
    named = [(n, p) for n, p in method.student.named_parameters()]
    decay = [p for n, p in named if not n.endswith(".bias") and p.ndim > 1]
    no_decay = [p for n, p in named if n.endswith(".bias") or p.ndim <= 1]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
        lr=LR,
        betas=tuple(cfg.betas),
        eps=cfg.eps,
    )
    losses = []
    for step in range(steps):
        ctx = context(step)
        batch = make_batch(step)
        total = sum(method.loss(shard_batch(batch, i, splits), ctx)[0] for i in range(splits)) / splits
        total.backward()
        losses.append(float(total.detach()))
        params = [p for _, p in named if p.grad is not None]
        if cfg.clip_grad > 0 and cfg.clip_mode == "per_param":
            dino_clip(params, cfg.clip_grad)
        elif cfg.clip_grad > 0:
            torch.nn.utils.clip_grad_norm_(params, cfg.clip_grad)
        frozen = method.frozen_params(ctx)
        for n, p in named:
            if frozen is not None and frozen(n):
                p.grad = None
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            student = dict(method.student.named_parameters())
            for n, t in method.teacher.named_parameters():
                t.mul_(MOMENTUM).add_((1 - MOMENTUM) * student[n])
    return {
        "losses": losses,
        "moments": {n: {key: opt.state[p][key].clone() for key in MOMENTS} for n, p in named if p in opt.state},
        "student": {k: v.detach().clone() for k, v in method.student.state_dict().items()},
        "teacher": {k: v.detach().clone() for k, v in method.teacher.state_dict().items()},
    }


# --- engine runs
def build(engine_kw: dict, optim_kw: dict, method_kw: dict | None = None):
    """Inside a process group: the toy (seeded per rank: the engine must broadcast rank 0's) and its engine."""
    from scale.engine import build_engine
    from scale.engine.dist import detect
    from scale.engine.parallel import parallel_context

    info, engine_cfg = detect(), EngineConfig(**engine_kw)
    torch.manual_seed(info.rank)  # rank 0 builds what reference_run builds; other ranks differ
    method = ToyMethod(**(method_kw or {}))
    device = device_for(info)
    context = parallel_context(info, device, engine_cfg.shard_size)
    engine = build_engine(engine_cfg, optim_config(**optim_kw), context, device)
    engine.setup(method)
    return method, engine


def engine_run(
    engine_kw: dict,
    optim_kw: dict,
    steps: int = STEPS,
    start: int = 0,
    load_from: str | None = None,
    save_to: str | None = None,
    method_kw: dict | None = None,
    saved_world: int | None = None,
    keep_loaded: bool = False,
) -> dict:
    """Train steps start..steps-1 on this rank's share of each global batch; optionally resume from / save to a
    checkpoint as scale/checkpoint does (DCP state, or the engine's native files, written by `saved_world` ranks:
    by default this run's). `keep_loaded`: the result's "loaded" holds the student and teacher as loaded, before
    the steps (one process both checks the load and trains on from it)."""
    import torch.distributed.checkpoint as dcp

    from scale.checkpoint.state import load_engine_files, save_engine_files
    from scale.engine.dist import detect
    from scale.loop.step import read_record
    from scale.optim import apply_schedule

    info = detect()
    method, engine = build(engine_kw, optim_kw, method_kw)
    if load_from and engine.native_checkpoint:
        load_engine_files(engine, load_from, saved_world or info.world_size)
    elif load_from:
        state = engine.state_dict()
        dcp.load(state, checkpoint_id=load_from)
        engine.load_state_dict(state)
    loaded = None
    if keep_loaded:  # copies: an export may share the parameters' storage, which the steps then change
        loaded = {p: {k: v.clone() for k, v in engine.export_state_dict(p).items()} for p in ("student", "teacher")}
    accum = engine.cfg.grad_accum
    losses = []
    for step in range(start, steps):
        ctx = context(step)
        local = shard_batch(make_batch(step), info.rank, info.world_size).to(engine.device)
        step_loss = torch.zeros((), device=engine.device)
        for micro in range(accum):
            with engine.autocast():
                loss, _ = method.loss(shard_batch(local, micro, accum), ctx)
            engine.backward(loss)
            step_loss += loss.detach().float() / accum
        # the training loop's log-step read: the mean over the data-parallel ranks (reference_run's global mean)
        losses.append(read_record({"loss": step_loss}, engine.dist_info.dp_group)["loss"])
        apply_schedule(engine.optimizer.param_groups, engine.optim_cfg.lr, WD)
        engine.step(method.frozen_params(ctx))
        engine.ema(method.ema_momentum(ctx))
    if save_to and engine.native_checkpoint:
        save_engine_files(engine, save_to)
        dist.barrier()  # every rank's files written (the checkpointer's agreement, in a run)
    elif save_to:
        dcp.save(engine.state_dict(), checkpoint_id=save_to)
    return {
        "losses": losses,
        "student": engine.export_state_dict("student"),
        "teacher": engine.export_state_dict("teacher"),
        "memory": engine.memory(),
        **({"moments": deepspeed_moments(engine)} if engine.native_checkpoint else {}),
        **({"loaded": loaded} if keep_loaded else {}),
    }


def deepspeed_moments(engine) -> dict[str, dict[str, torch.Tensor]]:
    """ZeRO-1/2: Adam's moments of every student parameter, whole, read from the inner optimizer's state of the
    flat fp32 partitions through DeepSpeed's fragment map (as its safe_get_full_optimizer_state does, whose own
    map is linked only by DeepSpeed's step, which scale's engine does not call) and summed over the ranks (each
    holds its fragment, zeros elsewhere): what reference_run's `moments` holds. None for ZeRO-3."""
    if engine.stage == 3:
        return None
    zero = engine.ds.optimizer
    moments = {}
    for name, p in engine.ds.module.named_parameters():
        mapping, whole = p._hp_mapping, {}
        for key in MOMENTS:
            buffer = torch.zeros(p.numel(), dtype=torch.float32, device=p.device)  # NCCL reduces device tensors
            if mapping is not None:
                flat = zero.single_partition_of_fp32_groups[mapping.param_group_index]
                state = zero.optimizer.state[flat][key]
                lp, hp = mapping.lp_fragment_address, mapping.hp_fragment_address
                buffer.narrow(0, lp.start, lp.numel).copy_(state.narrow(0, hp.start, hp.numel))
            dist.all_reduce(buffer, group=engine.dist_info.dp_group)
            whole[key] = buffer.reshape(p.shape).cpu()
        moments[name] = whole
    return moments


def _worker(rank: int, world: int, port: int, fn, args, out: str) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    # this rank's stderr (Python and C++, with the Python stacks of a fatal signal) goes to a file that spawn()
    # quotes when a rank dies: pytest shows the captured output of a shared fixture only once
    log = open(rank_log(out, rank), "w", buffering=1)
    os.dup2(log.fileno(), 2)
    faulthandler.enable(all_threads=True)
    torch.set_num_threads(1)
    from scale.engine.dist import init_distributed, shutdown

    init_distributed(timeout_minutes=2)
    try:
        result = fn(*args)
        if rank == 0:
            torch.save(result, out)
    finally:
        shutdown()  # waits for rank 0's save on the success path
    # the work is done and saved: skip the interpreter's and the C++ runtime's teardown, where gloo has aborted
    # finished ranks ("terminate called without an active exception"); the product's own exit path is covered
    # by the end-to-end tests, which launch `scale train` with --nproc and under Slurm
    sys.stdout.flush()
    os._exit(0)


def rank_log(out: str, rank: int) -> str:
    return f"{out}.rank{rank}.log"


@contextlib.contextmanager
def rank_environment(device: str):
    """What the spawned ranks inherit: on "cpu" no visible GPU (on a GPU machine init_distributed would otherwise
    pick NCCL and CUDA, so the CPU tests stay CPU tests there); on "cuda" every GPU, and no DS_ACCELERATOR=cpu
    that a CPU DeepSpeed engine built in this process may have exported."""
    saved = {key: os.environ.get(key) for key in ("CUDA_VISIBLE_DEVICES", "DS_ACCELERATOR")}
    if device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    else:
        os.environ.pop("DS_ACCELERATOR", None)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def spawn(fn, *args, world: int = 2, tmp_path, device: str = "cpu") -> object:
    """Run fn(*args) on `world` processes (gloo on "cpu"; NCCL with one GPU per rank on "cuda"); returns rank 0's
    result. When a rank fails, the error quotes the end of every rank's stderr."""
    out = os.path.join(str(tmp_path), f"result_{fn.__name__}_{free_port()}.pt")
    try:
        with rank_environment(device):
            mp.spawn(_worker, args=(world, free_port(), fn, args, out), nprocs=world, join=True)
    except mp.ProcessExitedException as err:  # killed by a signal: no Python traceback came back
        tails = [f"--- rank {rank} stderr (end) ---\n{tail(rank_log(out, rank))}" for rank in range(world)]
        raise RuntimeError("\n".join([str(err), *tails])) from err
    return torch.load(out, weights_only=False)


def tail(path: str, chars: int = 4000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-chars:]
    except OSError as err:
        return f"(unreadable: {err})"


def run_jobs(jobs: list[tuple], run_kw: dict | None = None) -> dict:
    """Several engine runs (label, engine_kw, optim_kw[, run_kw]) in one process group (spawning is the slow
    part); run_kw: engine_run's other arguments, for all jobs or per job."""
    return {
        job[0]: engine_run(job[1], job[2], **{**(run_kw or {}), **(job[3] if len(job) > 3 else {})}) for job in jobs
    }


def resume_job(engine_kw: dict, folder: str, split: int, method_kw: dict | None = None) -> dict:
    """Steps 0..split-1, save, then a fresh method and engine load and run the remaining steps."""
    first = engine_run(engine_kw, {}, steps=split, save_to=folder, method_kw=method_kw)
    rest = engine_run(engine_kw, {}, start=split, load_from=folder, method_kw=method_kw)
    return {**rest, "losses": first["losses"] + rest["losses"]}


def load_and_finish(
    engine_kw: dict,
    folder: str,
    start: int,
    saved_world: int,
    method_kw: dict | None = None,
    steps: int = STEPS,
    keep_loaded: bool = False,
) -> dict:
    """A fresh method and engine load the checkpoint that `saved_world` ranks wrote after `start` steps and run
    steps start..steps-1 (none when steps == start: the loaded state; `keep_loaded`: engine_run's)."""
    return engine_run(
        engine_kw,
        {},
        steps=steps,
        start=start,
        load_from=folder,
        saved_world=saved_world,
        method_kw=method_kw,
        keep_loaded=keep_loaded,
    )


def all_ranks(value):
    """Every rank's value, in rank order (returned by rank 0)."""
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def ema_job() -> dict:
    """FSDP2 at 2 ranks: local shard shapes, teacher sharding after its forward, EMA on shards vs full tensors."""
    from torch.distributed.tensor import DTensor

    from scale.engine.dist import detect
    from scale.engine.params import local, named_parameters

    info = detect()
    method, engine = build({"kind": "fsdp2"}, {})
    loss, _ = method.loss(shard_batch(make_batch(0), info.rank, info.world_size), context(FROZEN_STEPS))
    teacher_sharded_after_forward = all(isinstance(p, DTensor) for p in method.teacher.parameters())
    engine.backward(loss)
    engine.step()  # the student moves away from the teacher
    student, teacher = engine.export_state_dict("student"), engine.export_state_dict("teacher")
    shapes = {
        "student": {n: tuple(local(p).shape) for n, p in named_parameters(method.student)},
        "teacher": {n: tuple(local(p).shape) for n, p in named_parameters(method.teacher)},
    }
    engine.ema(0.7)
    return {
        "student": student,
        "teacher": teacher,
        "teacher_after": engine.export_state_dict("teacher"),
        "shapes": all_ranks(shapes),
        "teacher_sharded_after_forward": all_ranks(teacher_sharded_after_forward),
    }


def meta_job(kind: str) -> dict:
    """Build the toy on the meta device; the engine materialises it after wrapping and trains one step."""
    from scale.engine import build_engine
    from scale.engine.dist import detect
    from scale.engine.parallel import parallel_context

    info, engine_cfg, cpu = detect(), EngineConfig(kind=kind), torch.device("cpu")
    with torch.device("meta"):
        method = ToyMethod()
    engine = build_engine(engine_cfg, optim_config(), parallel_context(info, cpu, engine_cfg.shard_size), cpu)
    engine.setup(method)
    student, teacher = engine.export_state_dict("student"), engine.export_state_dict("teacher")
    loss, _ = method.loss(shard_batch(make_batch(0), info.rank, info.world_size), context(FROZEN_STEPS))
    engine.backward(loss)
    engine.step()
    return {"loss": float(loss.detach()), "student": student, "teacher": teacher}


def memory_job(kinds: list[str], dim: int) -> dict:
    return {kind: build({"kind": kind}, {}, {"dim": dim, "depth": 2})[1].memory() for kind in kinds}


def many(calls: list[tuple]) -> list:
    """Several job functions (fn, *args) in one process group: spawning is the slow part."""
    return [fn(*args) for fn, *args in calls]


def error_of(fn, *args) -> str | None:
    """The message of the error fn(*args) raises, or None: a call expected to fail, among others in `many`."""
    try:
        fn(*args)
    except Exception as err:  # the caller asserts which error it was
        return str(err)
    return None
