"""The calls whose form depends on the torch release (scale supports torch 2.11 to 2.14), each chosen by looking
at what the installed torch offers, never by its version string. Everything else in scale calls torch directly.

- DistributedDataParallel: torch 2.14 renamed `broadcast_buffers` to `forward_sync_buffers` (it still takes the old
  name, deprecated, with a warning: the new name is looked for first). The two differ at init too (2.14's
  `forward_sync_buffers=False` still broadcasts buffers there), which matters not to scale: it passes
  `init_sync=False`, and that skips the whole init sync on both.
- torch.compile: torch 2.14 takes `recompile_limit` per call; before, only the process-wide
  `torch._dynamo.config.recompile_limit` exists.
"""

import functools
import inspect

import torch
from torch.nn.parallel import DistributedDataParallel


@functools.cache
def accepts(fn, keyword: str) -> bool:
    return keyword in inspect.signature(fn).parameters


def ddp(module, *, sync_buffers: bool, **kwargs) -> DistributedDataParallel:
    """DistributedDataParallel(module, ...) with the forward buffer broadcast set by whichever keyword this torch has."""
    new = accepts(DistributedDataParallel.__init__, "forward_sync_buffers")
    key = "forward_sync_buffers" if new else "broadcast_buffers"
    return DistributedDataParallel(module, **{key: sync_buffers}, **kwargs)


def compile_fn(fn, *, recompile_limit: int, **kwargs):
    """torch.compile(fn, ...) allowing `recompile_limit` graphs per code object. On a torch without the keyword the
    process-wide limit is raised to it (never lowered: another caller may need more)."""
    if accepts(torch.compile, "recompile_limit"):
        return torch.compile(fn, recompile_limit=recompile_limit, **kwargs)
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, recompile_limit)
    return torch.compile(fn, **kwargs)
