"""The training loop's monitors, checkpointed with the run so that a resumed run reports what an uninterrupted one
would: MoCo v3's k-NN monitor (its queue of training features), the gradient spike detector (its history), the
online linear probe (its weights and optimizer) and the embeddings' spread the collapse alarm reads."""

import torch
import torch.distributed as dist
from omegaconf import DictConfig
from torch import nn

from scale.loop.knn_monitor import KnnMonitor
from scale.methods.grad_spikes import GradSpikeDetector
from scale.watch.collapse import embedding_std
from scale.watch.probe import OnlineProbe


class Monitors:
    def __init__(self, cfg: DictConfig, device: torch.device, group: dist.ProcessGroup | None = None):
        """`group`: the data-parallel group whose ranks' samples the k-NN monitor enqueues."""
        self.cfg, self.device, self.group = cfg, device, group
        self.knn: KnnMonitor | None = None  # built at the first step with features (their width is known then)
        self.grad = GradSpikeDetector()
        self.probe: OnlineProbe | None = None  # train.probe.enabled: built at the first step with features

    def after_backward(self, step: int, student: nn.Module) -> dict:
        """Per-layer gradient norms and spikes every train.grad_monitor_every steps (before the optimizer step)."""
        every = self.cfg.train.grad_monitor_every
        return self.grad(student) if every and (step + 1) % every == 0 else {}

    def after_step(self, step: int, features: torch.Tensor | None, labels: torch.Tensor, log: bool = True) -> dict:
        """The embeddings' spread (collapse alarm; on log steps, whose records it reads) and the online probe's
        step, on the device; enqueue this step's features, the k-NN accuracy every train.knn_monitor_every steps.
        Collectives."""
        if features is None:
            return {}
        spread = log and self.cfg.train.collapse.window_epochs and features.shape[0] > 1  # a std needs two samples
        out = {"embedding_std": embedding_std(features)} if spread else {}
        if labels.dim() != 1:  # mixed (soft) labels: no class per sample
            return out
        if self.cfg.train.probe.enabled:
            if self.probe is None:
                self.probe = self._new_probe(features.shape[1])
            out.update(self.probe(features, labels))
        every = self.cfg.train.knn_monitor_every
        if not every:
            return out
        if self.knn is None:
            self.knn = KnnMonitor.from_config(self.cfg, features.shape[1], self.device, self.group)
        self.knn.update(features.float(), labels)
        return {**out, "knn_monitor_top1": self.knn.accuracy()} if (step + 1) % every == 0 else out

    def _new_probe(self, dim: int) -> OnlineProbe:
        return OnlineProbe(self.cfg.train.probe, dim, self.cfg.data.num_classes, self.device, self.group)

    def state_dict(self) -> dict:
        """The same on every rank (a collective)."""
        return {
            "knn": None if self.knn is None else self.knn.state_dict(),
            "grad": self.grad.state_dict(),
            "probe": None if self.probe is None else self.probe.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.grad.load_state_dict(state["grad"])
        if state["knn"] is not None:
            self.knn = KnnMonitor.from_config(self.cfg, state["knn"]["features"].shape[1], self.device, self.group)
            self.knn.load_state_dict(state["knn"])
        if state.get("probe") is not None:  # checkpoints from before the probe lack it
            self.probe = self._new_probe(state["probe"]["head"]["weight"].shape[1])
            self.probe.load_state_dict(state["probe"])
