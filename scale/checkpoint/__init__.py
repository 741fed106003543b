"""Checkpoints: the run's checkpointer and store, resume fitting, the layouts of published weights, the backbone
weights an evaluation or `train.init_weights` reads (weights.py), exports. Never imports eval/ or the loop."""

__all__ = ["Checkpointer", "CheckpointStore", "resolve"]


def __getattr__(name: str):
    """Imported on first use: the store (no torch) serves `scale ckpt info`'s checks and `scale status` without the
    checkpointer's torch.distributed.checkpoint."""
    if name == "Checkpointer":
        from scale.checkpoint.checkpointer import Checkpointer

        return Checkpointer
    if name in __all__:
        from scale.checkpoint import store

        return getattr(store, name)
    raise AttributeError(f"module 'scale.checkpoint' has no attribute '{name}'")
