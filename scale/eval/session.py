"""What every `scale eval` run shares: the recipe, the process group, the backbone, the data passes and the output."""

import logging
from dataclasses import dataclass
from functools import cached_property

import torch
from omegaconf import DictConfig

from scale.checkpoint.weights import load_backbone
from scale.config import load_recipe
from scale.data.evaluation import eval_batches, eval_views_cfg
from scale.engine.dist import DistInfo
from scale.eval import features as feats

log = logging.getLogger(__name__)


@dataclass
class Session:
    cfg: DictConfig
    info: DistInfo
    device: torch.device
    weights: str | None

    @cached_property
    def backbone(self) -> torch.nn.Module:
        """The frozen backbone, built on first use (fine-tuning and saved features need none)."""
        torch.manual_seed(self.cfg.train.seed)  # a random-init baseline is the same network on every rank and run
        return load_backbone(self.cfg.model, self.weights, self.device)

    @property
    def is_main(self) -> bool:
        return self.info.is_main

    def batches(self, shard_dir: str, views_kind: str = "eval"):
        """This rank's share of every sample of shard_dir (one eval view per image)."""
        return eval_batches(
            shard_dir,
            eval_views_cfg(self.cfg.data.views, views_kind),
            self.cfg.eval.batch_size,
            self.info.rank,
            self.info.world_size,
            int(self.cfg.data.workers),
            self.cfg.train.seed,
        )

    def features(self, shard_dir: str, feature_fn: feats.FeatureFn = feats.pooled) -> feats.Features:
        """Features of every sample of shard_dir, gathered on every rank and sorted by key."""
        log.info("extracting features of %s", shard_dir)
        local = feats.extract(self.backbone, self.batches(shard_dir), feature_fn, self.device)
        return feats.gather(local, self.device)

    def describe(self) -> dict:
        return {
            "model": self.cfg.model.name,
            "weights": self.weights,
            "random_init": self.weights is None,
            "world_size": self.info.world_size,
        }


def build_config(recipe: str, overrides: list[str], model: str | None) -> DictConfig:
    return load_recipe(recipe, list(overrides) + ([f"model.name={model}"] if model else []))


def open_session(cfg: DictConfig, info: DistInfo, device: torch.device, weights: str | None) -> Session:
    return Session(cfg, info, device, weights)
