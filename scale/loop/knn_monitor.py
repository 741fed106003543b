"""The k-NN monitor of MoCo v3 (appendix): k-NN accuracy during pre-training, cheap enough for every few tens of steps.

A memory bank (a queue, 10% of ImageNet in the paper) holds the class-token features of recent training samples
(augmented views, so no extra forward pass is needed). Every step, each rank first classifies its own new samples
against the bank as it is (weighted k-NN, Wu et al. 2018: k=200, T=0.07), then the samples of all ranks are
enqueued. `accuracy()` returns the share classified correctly since its previous call, over all ranks.
"""

import torch
import torch.distributed as dist
import torch.nn.functional as F

from scale.errors import UserError
from scale.methods.distributed import active
from scale.watch.weighted_knn import gather_rows, nearest, vote


class KnnMonitor:
    def __init__(
        self,
        size: int,
        dim: int,
        num_classes: int,
        k: int = 200,
        temperature: float = 0.07,
        device: torch.device | str = "cpu",
        group: dist.ProcessGroup | None = None,
    ):
        """`group`: the data-parallel group whose ranks' samples are enqueued and counted (None: one process)."""
        if size < 1 or k < 1:
            raise ValueError(f"k-NN monitor: queue size ({size}) and k ({k}) must be positive")
        self.k, self.temperature, self.num_classes = k, temperature, num_classes
        self.features = torch.zeros(size, dim, device=device)
        self.labels = torch.zeros(size, dtype=torch.long, device=device)
        self.filled = 0  # valid rows (the queue is full once filled == size)
        self.head = 0  # next row to overwrite
        self.counts = torch.zeros(2, dtype=torch.float64, device=device)  # correct, scored since accuracy()
        self.group = group

    @classmethod
    def from_config(
        cls, cfg, dim: int, device: torch.device | str = "cpu", group: dist.ProcessGroup | None = None
    ) -> "KnnMonitor":
        """The monitor of a recipe: eval.knn_monitor_queue rows of `dim` features, data.num_classes classes."""
        return cls(
            int(cfg.eval.knn_monitor_queue),
            dim,
            int(cfg.data.num_classes),
            int(cfg.eval.knn_monitor_k),
            float(cfg.eval.knn_temperature),
            device,
            group,
        )

    @torch.no_grad()
    def update(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        """Score this rank's samples against the bank, then enqueue the samples of every rank.

        A collective under torch.distributed: every rank calls it every step. Unlabelled samples (label -1) are
        skipped; multi-label batches are not supported.
        """
        if labels.ndim != 1:
            raise ValueError("the k-NN monitor needs single-label data (labels of shape [B])")
        features = F.normalize(features.detach().float(), dim=1).to(self.features.device)
        labels = labels.to(self.features.device)
        keep = labels >= 0
        features, labels = features[keep], labels[keep]
        if self.filled and labels.numel():
            sim, idx = nearest(features, self.features[: self.filled], self.k)
            scores = vote(sim, self.labels[: self.filled][idx], self.num_classes, self.temperature)
            self.counts[0] += (scores.argmax(1) == labels).sum()
            self.counts[1] += labels.numel()
        if self.distributed():
            features, labels = gather_rows(features, self.group), gather_rows(labels, self.group)
        self._enqueue(features, labels)

    def distributed(self) -> bool:
        return active(self.group)

    def _enqueue(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        size = self.features.shape[0]
        features, labels = features[-size:], labels[-size:]  # a batch larger than the queue keeps its newest rows
        rows = (self.head + torch.arange(labels.numel(), device=labels.device)) % size
        self.features[rows] = features
        self.labels[rows] = labels
        self.head = (self.head + labels.numel()) % size
        self.filled = min(size, self.filled + labels.numel())

    def state_dict(self) -> dict:
        """The queue (the same on every rank: it takes the samples of all ranks) and the counts since the last
        accuracy(), summed over ranks: one copy resumes the run on any number of ranks. A collective. The tensors
        are the live ones, on the run's device: save them at once (only the saving rank copies them to the host)."""
        counts = self.counts.clone()
        if self.distributed():
            dist.all_reduce(counts, group=self.group)
        return {
            "features": self.features,
            "labels": self.labels,
            "filled": self.filled,
            "head": self.head,
            "counts": counts,
        }

    def load_state_dict(self, state: dict) -> None:
        if tuple(state["features"].shape) != tuple(self.features.shape):
            raise UserError(
                f"k-NN monitor: the checkpointed queue is {tuple(state['features'].shape)}, this run's "
                f"is {tuple(self.features.shape)} (eval.knn_monitor_queue, feature width)"
            )
        self.features.copy_(state["features"])
        self.labels.copy_(state["labels"])
        if not self.distributed() or dist.get_rank(self.group) == 0:  # the sum over ranks, counted once
            self.counts.copy_(state["counts"])
        else:
            self.counts.zero_()
        self.filled, self.head = int(state["filled"]), int(state["head"])

    @torch.no_grad()
    def accuracy(self) -> float | None:
        """Top-1 accuracy (%) since the previous call, over all ranks (a collective); None if nothing was scored."""
        counts = self.counts.clone()
        if self.distributed():
            dist.all_reduce(counts, group=self.group)
        self.counts.zero_()
        return None if counts[1] == 0 else 100.0 * float(counts[0] / counts[1])
