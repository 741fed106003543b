from scale.checkpoint.checkpointer import Checkpointer
from scale.checkpoint.store import CheckpointStore, resolve

__all__ = ["Checkpointer", "CheckpointStore", "resolve"]
