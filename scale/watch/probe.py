"""The online linear probe (solo-learn's online classifier): a linear layer on the detached backbone features of
each training batch, with its own AdamW. The features are detached, so the backbone's gradients and update are
the same with or without it (its initialisation draws from a forked RNG, seeded alike on every rank: drop-path and the
augmentations see the same random numbers); its gradients are averaged over the data-parallel group so that every rank keeps
the same probe. Its accuracy on the batch (before its update) is a device tensor, read on log steps."""

import torch
import torch.distributed as dist
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn


class OnlineProbe:
    def __init__(self, cfg: DictConfig, dim: int, num_classes: int, device: torch.device, group=None):
        self.group = group
        with torch.random.fork_rng(devices=[]):  # built on the CPU: the CUDA RNG is not drawn from
            torch.manual_seed(0)  # the same probe on every rank (the ranks' RNGs are seeded apart)
            self.head = nn.Linear(dim, num_classes).to(device)
        # fused: the step count stays on the device (the unfused step reads it on the host every step)
        self.optimizer = torch.optim.AdamW(self.head.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, fused=True)

    def __call__(self, features: torch.Tensor, labels: torch.Tensor) -> dict:
        with torch.enable_grad():
            logits = self.head(features.detach().float())
            loss = F.cross_entropy(logits, labels)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
        if self.group is not None and dist.is_initialized() and dist.get_world_size(self.group) > 1:
            for param in self.head.parameters():  # SUM, then divide: gloo has no AVG
                dist.all_reduce(param.grad, group=self.group)
                param.grad /= dist.get_world_size(self.group)
        self.optimizer.step()
        top1 = (logits.detach().argmax(dim=1) == labels).float().mean() * 100
        return {"probe_loss": loss.detach(), "probe_top1": top1}

    def state_dict(self) -> dict:
        return {"head": self.head.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])
