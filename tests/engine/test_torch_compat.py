"""scale/engine/torch_compat.py: both forms of each version-dependent call, whichever torch is installed (CI runs this
module on the newest and on the oldest supported torch, so each branch also meets the real torch once)."""

import inspect

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from scale.engine import torch_compat


@pytest.fixture
def torch_offers(monkeypatch):
    """Make torch_compat see a torch that has (or lacks) the given keyword, whichever torch is installed."""

    def offers(keyword: str, present: bool) -> None:
        real = torch_compat.accepts
        monkeypatch.setattr(torch_compat, "accepts", lambda fn, k: present if k == keyword else real(fn, k))

    return offers


def test_feature_detection_reads_the_signature():
    assert torch_compat.accepts(DistributedDataParallel.__init__, "process_group")
    assert not torch_compat.accepts(DistributedDataParallel.__init__, "no_such_keyword")
    # torch 2.11 has only broadcast_buffers; 2.14 has forward_sync_buffers and broadcast_buffers deprecated
    params = inspect.signature(DistributedDataParallel.__init__).parameters
    assert "forward_sync_buffers" in params or "broadcast_buffers" in params


@pytest.fixture
def dynamo_config():
    """Dynamo's process-wide config with recompile_limit at its default, restored after the test (pytest's
    monkeypatch cannot restore a torch config module's entry: its undo leaves the entry missing)."""
    with torch._dynamo.config.patch(recompile_limit=8):
        yield torch._dynamo.config


@pytest.fixture
def compile_calls(monkeypatch) -> list[dict]:
    """The keywords of each torch.compile call, which returns its function uncompiled."""
    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: calls.append(kwargs) or fn)
    return calls


@pytest.mark.parametrize("has_new_keyword", [True, False])
def test_ddp_passes_the_buffer_setting_under_the_keyword_torch_has(monkeypatch, torch_offers, has_new_keyword):
    seen = {}
    torch_offers("forward_sync_buffers", has_new_keyword)
    monkeypatch.setattr(torch_compat, "DistributedDataParallel", lambda module, **kwargs: seen.update(kwargs))
    torch_compat.ddp(nn.Linear(2, 2), sync_buffers=False, init_sync=False)
    key = "forward_sync_buffers" if has_new_keyword else "broadcast_buffers"
    assert seen == {key: False, "init_sync": False}


def test_compile_without_the_keyword_raises_the_process_limit_and_never_lowers_it(
    torch_offers, dynamo_config, compile_calls
):
    config, calls = dynamo_config, compile_calls
    torch_offers("recompile_limit", False)

    def f(x):
        return x + 1

    assert torch_compat.compile_fn(f, recompile_limit=256, fullgraph=True) is f
    assert config.recompile_limit == 256 and calls == [{"fullgraph": True}]
    torch_compat.compile_fn(f, recompile_limit=16)
    assert config.recompile_limit == 256  # another caller's higher limit stays


def test_compile_with_the_keyword_passes_it_per_call_and_leaves_the_process_limit(
    torch_offers, dynamo_config, compile_calls
):
    config, calls = dynamo_config, compile_calls
    torch_offers("recompile_limit", True)
    torch_compat.compile_fn(len, recompile_limit=256, fullgraph=True)
    assert config.recompile_limit == 8 and calls == [{"recompile_limit": 256, "fullgraph": True}]


def test_compiled_function_runs_and_recompiles_up_to_the_limit():
    """The real torch.compile with whichever form this torch takes: 3 input shapes, 3 graphs, no fallback."""
    torch._dynamo.reset()
    compiled = torch_compat.compile_fn(
        lambda x: x * 2, recompile_limit=4, backend="eager", dynamic=False, fullgraph=True
    )
    for n in (1, 2, 3):
        torch.testing.assert_close(compiled(torch.ones(n)), torch.full((n,), 2.0))
    torch._dynamo.reset()
