"""Engines: how a method's modules are wrapped (DDP, FSDP2, DeepSpeed ZeRO), run in mixed precision, stepped and
checkpointed. Entry point: `scale.engine.factory.build_engine` (also importable as `scale.engine.build_engine`).
Never imports the training loop (scale/loop/) or the benchmarks (scale/bench/)."""


def __getattr__(name):
    # lazy, so that importing the config schema (scale.engine.config) does not import torch.distributed and DeepSpeed
    if name == "build_engine":
        from scale.engine.factory import build_engine

        return build_engine
    raise AttributeError(f"module 'scale.engine' has no attribute '{name}'")
