"""Checkpoints: the run's checkpointer and store, resume fitting, the layouts of published weights, the backbone
weights an evaluation or `train.init_weights` reads (weights.py), exports. Never imports eval/ or the loop."""

from scale.checkpoint.checkpointer import Checkpointer
from scale.checkpoint.store import CheckpointStore, resolve

__all__ = ["Checkpointer", "CheckpointStore", "resolve"]
