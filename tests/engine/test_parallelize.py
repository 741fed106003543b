"""One parallelize path in one order: conversions, activation checkpointing, compile, then the engine's wrap."""

from types import SimpleNamespace

import torch
from omegaconf import OmegaConf

import scale.engine.parallelize as parallelize_module
from scale.engine.parallelize import parallelize
from scale.engine.precision import resolve_precision


def test_conversions_then_checkpointing_then_compile_then_wrap(monkeypatch):
    calls = []
    monkeypatch.setattr(parallelize_module, "convert_modules", lambda *a: calls.append("convert"))
    monkeypatch.setattr(parallelize_module, "apply_activation_checkpointing", lambda *a: calls.append("checkpoint"))
    monkeypatch.setattr(parallelize_module, "apply_compile", lambda _, *a: calls.append(("compile", *a)))
    method = SimpleNamespace(student=None, teacher=None)
    cfg = OmegaConf.create({"activation_checkpointing": "full", "ac_every_n": 1, "sync_bn": True})
    cfg.update(compile=True, compile_backend="x", compile_mode="y", compile_scope="z")
    parallelize(method, cfg, resolve_precision("fp32", torch.device("cpu")), None, lambda: calls.append("wrap"))
    assert calls == ["convert", "checkpoint", ("compile", True, "x", "y", "z"), "wrap"]
