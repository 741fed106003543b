"""Top-1 / top-5 accuracy of a classifier over every sample of a shard directory, every rank in lockstep.

The validation of supervised training (DRLoc, fine-tuning rows): the training loop runs it on its wrapped student,
which may be sharded, so every rank runs the same number of forwards (`lockstep_batches`) and only its own samples
are counted.
"""

import logging
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from scale.data.evaluation import dataset_info, eval_views_cfg, lockstep_batches
from scale.engine.compile import begin_graph_step, replays_cuda_graphs
from scale.engine.parallel import ParallelContext
from scale.errors import ConfigError, UserError
from scale.loop.rundir import write_json
from scale.readback import VAL_RESULT, BadFile, read_json

log = logging.getLogger(__name__)

LogitsFn = Callable[[torch.Tensor], torch.Tensor]  # images [B, 3, H, W] -> logits [B, classes]


@torch.no_grad()
def accuracy(
    logits_fn: LogitsFn, batches, own: int, device: torch.device, group: dist.ProcessGroup | None = None
) -> dict:
    """Top-1 / top-5 (%) over the first `own` samples of this rank's batches, summed over the ranks of `group`
    (the training run's data-parallel group; None: every rank, or one process)."""
    counts = torch.zeros(3, dtype=torch.float64, device=device)
    seen = 0
    for batch in batches:
        logits = logits_fn(batch.crops[0].to(device, non_blocking=True)).float()
        keep = max(0, min(logits.shape[0], own - seen))
        seen += logits.shape[0]
        labels = batch.labels[:keep].to(device)
        if labels.dim() != 1:
            raise UserError(
                f"validation needs one class index per image, got labels of shape {tuple(batch.labels.shape)}"
            )
        top = logits[:keep].topk(min(5, logits.shape[1]), dim=1).indices
        counts += torch.stack(
            [(top[:, 0] == labels).sum(), (top == labels[:, None]).any(1).sum(), torch.tensor(keep, device=device)]
        ).to(torch.float64)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(counts, group=group)
    if counts[2] == 0:
        raise UserError("validation: no samples")
    return {
        "top1": 100.0 * float(counts[0] / counts[2]),
        "top5": 100.0 * float(counts[1] / counts[2]),
        "samples": int(counts[2]),
    }


def check_val_data(cfg) -> None:
    """data.val of a run that validates, checked before any rank starts (an error found on the ranks once their
    process group is up could end one rank while a slower peer is still in a collective)."""
    try:
        data = dataset_info(cfg.data.val)
    except UserError as err:
        raise ConfigError(
            f"data.val: {err}. Runs with a class head report validation accuracy: build the val "
            f"shards, or set train.val_every_epochs=0"
        ) from None
    if data["label_kind"] != "single":
        raise ConfigError(
            f"data.val ({cfg.data.val}): validation needs one class per image, the shards hold "
            f"'{data['label_kind']}' labels"
        )
    if len(data["classes"]) > cfg.data.num_classes:
        raise ConfigError(
            f"data.val ({cfg.data.val}) has {len(data['classes'])} classes, more than "
            f"data.num_classes={cfg.data.num_classes}"
        )


class Validation:
    """The validation of a run whose method classifies (data.val checked by `check_val_data` before the launch):
    evaluated every `train.val_every_epochs` epochs and after the last step (when: scale.loop.cadence); each result
    goes to the step's metrics (val_top1, val_top5) and is appended to eval/val.json in the run directory."""

    def __init__(self, cfg, info: ParallelContext, device: torch.device, out: Path):
        self.cfg, self.info, self.device, self.out = cfg, info, device, out

    def logits_fn(self, method) -> LogitsFn:
        """The method's logits; each batch a step of its own where compiled blocks replay CUDA graphs (their
        outputs stay valid until the next batch: scale.engine.compile.begin_graph_step)."""
        if not replays_cuda_graphs(self.cfg.engine):
            return method.val_logits

        def logits(images: torch.Tensor) -> torch.Tensor:
            begin_graph_step()
            return method.val_logits(images)

        return logits

    def __call__(self, method, autocast, step: int, epoch: float) -> dict[str, float]:
        cfg = self.cfg
        batches, own = lockstep_batches(
            cfg.data.val,
            eval_views_cfg(cfg.data.views),
            int(cfg.eval.batch_size),
            self.info.dp_rank,
            self.info.dp_size,
            int(cfg.data.workers),
            cfg.train.seed,
        )
        method.student.eval()
        # the loader draws its seed from the global RNG: fork it, so that validating leaves training's draws
        # (drop path, mixup) as they would be without it
        devices = [self.device] if self.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices), autocast():
                result = accuracy(self.logits_fn(method), batches, own, self.device, self.info.dp_group)
        finally:
            method.student.train()
        log.info(
            "validation at step %d: top-1 %.2f%%, top-5 %.2f%% (%d images of %s)",
            step,
            result["top1"],
            result["top5"],
            result["samples"],
            cfg.data.val,
        )
        if self.info.is_main:
            self._append({"step": step, "epoch": epoch, **result})
        return {"val_top1": result["top1"], "val_top5": result["top5"]}

    def _append(self, entry: dict) -> None:
        try:
            history = read_json(self.out, VAL_RESULT)["history"] if self.out.exists() else []
        except (OSError, BadFile) as err:  # a results file, rewritten whole below: its history is what is lost
            log.warning("%s; its history of earlier validations starts over", err)
            history = []
        history = [h for h in history if h["step"] < entry["step"]] + [entry]  # a resumed run redoes later steps
        write_json(self.out, {"eval": "val", "val": self.cfg.data.val, **entry, "history": history})
