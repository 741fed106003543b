"""`data.backend: dali`: the multi-crop views made by an NVIDIA DALI pipeline from the same shards (extra `dali`).

- index.py: DALI's index files, part of the shard directory (written without DALI, by `scale shards build` too).
- pipeline.py: the DALI graph (reader sharded by rank, one decode, one chain per view).
- loader.py: DaliLoader, a Loader (the loader protocol, scale/data/loader_protocol.py) over that pipeline.

Device: `data.dali_device` auto (the GPU when CUDA is available, else the CPU), gpu (fails without a GPU) or cpu
(every op on the CPU, `device_id=None`; what the tests run).
"""

from scale.extras import require


def require_dali():
    """The nvidia.dali module, or a UserError naming the extra to install."""
    return require("dali", "nvidia.dali", "data.backend=dali")


def build_dali_loader(spec):
    """DaliLoader(spec) (a scale.data.spec.LoaderSpec), after checking that DALI is installed."""
    require_dali()
    from scale.data.dali.loader import DaliLoader

    return DaliLoader(spec)
