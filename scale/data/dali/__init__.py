"""`data.backend: dali`: the multi-crop views made by an NVIDIA DALI pipeline from the same shards (extra `dali`).

- DALI's index files are part of the shard directory: scale/data/shards.py writes them (no DALI needed).
- pipeline.py: the DALI graph (reader sharded by rank, one decode, one chain per view).
- loader.py: DaliLoader, the loader interface of scale/data/loader.py over that pipeline.

Device: `data.dali_device` auto (the GPU when CUDA is available, else the CPU), gpu (fails without a GPU) or cpu
(every op on the CPU, `device_id=None`; what the tests run).
"""

from scale.errors import UserError

INSTALL = "pip install 'scale[dali]'"


def require_dali():
    """The nvidia.dali module, or a UserError naming the extra to install."""
    try:
        import nvidia.dali
    except ImportError as err:
        raise UserError(
            f"data.backend=dali needs NVIDIA DALI, which is not importable here ({err}); install it with: {INSTALL}"
        ) from None
    return nvidia.dali


def build_dali_loader(*args, **kwargs):
    """DaliLoader(*args, **kwargs) (the arguments of scale.data.factory.build_loader), after checking that DALI is
    installed."""
    require_dali()
    from scale.data.dali.loader import DaliLoader

    return DaliLoader(*args, **kwargs)
