"""The training loop's monitors, checkpointed with the run so that a resumed run reports what an uninterrupted one
would: MoCo v3's k-NN monitor (its queue of training features) and the gradient spike detector (its history)."""

import torch
import torch.distributed as dist
from omegaconf import DictConfig
from torch import nn

from scale.eval.monitor import KnnMonitor
from scale.methods.monitors import GradSpikeDetector


class Monitors:
    def __init__(self, cfg: DictConfig, device: torch.device, group: dist.ProcessGroup | None = None):
        """`group`: the data-parallel group whose ranks' samples the k-NN monitor enqueues."""
        self.cfg, self.device, self.group = cfg, device, group
        self.knn: KnnMonitor | None = None  # built at the first step with features (their width is known then)
        self.grad = GradSpikeDetector()

    def after_backward(self, step: int, student: nn.Module) -> dict:
        """Per-layer gradient norms and spikes every train.grad_monitor_every steps (before the optimizer step)."""
        every = self.cfg.train.grad_monitor_every
        return self.grad(student) if every and (step + 1) % every == 0 else {}

    def after_step(self, step: int, features: torch.Tensor | None, labels: torch.Tensor) -> dict:
        """Enqueue this step's features; the k-NN accuracy every train.knn_monitor_every steps. A collective."""
        every = self.cfg.train.knn_monitor_every
        if not every or features is None or labels.dim() != 1:
            return {}
        if self.knn is None:
            self.knn = KnnMonitor.from_config(self.cfg, features.shape[1], self.device, self.group)
        self.knn.update(features.float(), labels)
        return {"knn_monitor_top1": self.knn.accuracy()} if (step + 1) % every == 0 else {}

    def state_dict(self) -> dict:
        """The same on every rank (a collective)."""
        return {"knn": None if self.knn is None else self.knn.state_dict(), "grad": self.grad.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.grad.load_state_dict(state["grad"])
        if state["knn"] is not None:
            self.knn = KnnMonitor.from_config(self.cfg, state["knn"]["features"].shape[1], self.device, self.group)
            self.knn.load_state_dict(state["knn"])
