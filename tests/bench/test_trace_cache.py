"""The planner's trace cache (scale.bench.trace_cache): a hit judges as a fresh trace does, any change to what the
trace reads misses, a damaged or wrong-shaped entry is traced again and rewritten, and an unwritable cache is no
error. That a hit imports no torch: tests/test_cli_light.py (submit --dry-run on a warm cache)."""

import argparse
import dataclasses
import json
import os
import pickle
from pathlib import Path

import pytest

from scale.bench import trace_cache
from scale.bench.steptrace import StepTrace
from scale.bench.trace import trace_step
from scale.commands.plan import judge
from scale.config import load_recipe

TINY_RECIPE = str(Path(__file__).with_name("tiny_dino.yaml"))
GPU = argparse.Namespace(
    gpu="h100-80gb", gpu_mem=None, gpu_tflops=None, mfu=None, bandwidth=100.0, inter_bandwidth=25.0
)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "scale" / "traces"


def _judge(overrides: list[str]):
    return judge(load_recipe(TINY_RECIPE, overrides), TINY_RECIPE, overrides, 2, 4, GPU)


def test_a_hit_gives_the_verdict_of_a_fresh_trace(cache):
    fresh = _judge([])
    assert not fresh.cached and fresh.verdict().endswith("(traced)")
    assert [p.name for p in cache.iterdir()] == [f"{trace_cache.trace_key(load_recipe(TINY_RECIPE))}.json"]
    hit = _judge([])
    assert hit.cached and hit.verdict().endswith("(cached trace)")
    assert hit.trace == fresh.trace == trace_step(load_recipe(TINY_RECIPE))
    assert hit.verdict().removesuffix("(cached trace)") == fresh.verdict().removesuffix("(traced)")
    assert hit.own.memory == fresh.own.memory and hit.own.step_s == fresh.own.step_s


@pytest.mark.parametrize(
    "override",
    ["model.name=vit_small", "engine.precision=bf16", "data.views.n_local=[2]", "method.dino.out_dim=4096"],
)
def test_what_the_trace_reads_misses(override):
    assert trace_cache.trace_key(load_recipe(TINY_RECIPE, [override])) != trace_cache.trace_key(
        load_recipe(TINY_RECIPE)
    )


def test_what_the_trace_sets_itself_hits_and_the_verdict_follows_the_recipe(cache):
    """The trace runs without checkpointing at 2 images (the planner models checkpointing and the batch): these keys
    share one trace, and the judgement of the hit is that of a fresh trace of the changed recipe."""
    _judge([])
    for override in ("engine.activation_checkpointing=full", "train.global_batch=16", "meta.name=other"):
        hit = _judge([override])
        assert hit.cached
        fresh = trace_step(load_recipe(TINY_RECIPE, [override]))
        assert hit.trace == fresh
    full = _judge(["engine.activation_checkpointing=full"])
    assert full.own.memory["activations"] < _judge([]).own.memory["activations"]


def test_a_changed_source_file_misses(monkeypatch):
    key = trace_cache.trace_key(load_recipe(TINY_RECIPE))
    monkeypatch.setattr(trace_cache, "code_digest", lambda: "another scale")
    assert trace_cache.trace_key(load_recipe(TINY_RECIPE)) != key


def _entry(trace: StepTrace, key: str) -> dict:
    return {"format": trace_cache.FORMAT, "key": key, "trace": dataclasses.asdict(trace)}


def test_a_damaged_or_wrong_shaped_entry_is_traced_again_and_rewritten(cache):
    cfg = load_recipe(TINY_RECIPE)
    good, cached = trace_cache.cached_trace(cfg)
    key = trace_cache.trace_key(cfg)
    path = cache / f"{key}.json"
    wrong_block = _entry(good, key)
    wrong_block["trace"]["blocks"][0]["saved"] = "many"
    negative = _entry(good, key)
    negative["trace"]["net_saved"] = -1
    extra = _entry(good, key)
    extra["trace"]["surprise"] = 1
    damaged = [
        path.read_bytes()[:100],  # cut short
        b"\xff\xfe not text",
        pickle.dumps(good),  # never unpickled
        b"[]",
        json.dumps({**_entry(good, key), "key": "another"}).encode(),  # renamed onto another key
        json.dumps({**_entry(good, key), "format": trace_cache.FORMAT + 1}).encode(),
        json.dumps(wrong_block).encode(),
        json.dumps(negative).encode(),
        json.dumps(extra).encode(),
        json.dumps({**_entry(good, key), "trace": {"images": 2}}).encode(),
    ]
    for content in damaged:
        path.write_bytes(content)
        assert trace_cache.read(key) is None, content[:40]
        trace, cached = trace_cache.cached_trace(cfg)
        assert not cached and trace == good
        assert trace_cache.read(key) == good  # rewritten whole
    assert trace_cache.cached_trace(cfg) == (good, True)
    assert [p.name for p in cache.iterdir()] == [path.name]  # no temporary file left


def test_an_unwritable_cache_is_no_error(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    cfg = load_recipe(TINY_RECIPE)
    assert trace_cache.cached_trace(cfg) == (trace_step(cfg), False)
    assert trace_cache.cache_dir() == blocked / "scale" / "traces"


def test_the_cache_follows_xdg(monkeypatch):
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", "/home/someone")
    assert trace_cache.cache_dir() == Path("/home/someone/.cache/scale/traces")


def test_the_cache_keeps_its_most_recently_used_entries(cache, monkeypatch):
    """Beyond MAX_ENTRIES the least recently used entries go; a hit counts as a use."""
    monkeypatch.setattr(trace_cache, "MAX_ENTRIES", 3)
    monkeypatch.setattr(trace_cache, "trace_key", lambda key: key)  # here a recipe is its own key
    trace = StepTrace(images=2)
    for age, key in enumerate("abc"):
        trace_cache.write(key, trace)
        os.utime(cache / f"{key}.json", (1000 + age, 1000 + age))  # a is the oldest
    assert trace_cache.cached_trace("a") == (trace, True)  # a hit: now the most recently used
    trace_cache.write("d", trace)  # one too many: b, the least recently used, goes
    assert sorted(p.name for p in cache.iterdir()) == ["a.json", "c.json", "d.json"]


def test_a_write_removes_what_killed_writers_left(cache):
    cache.mkdir(parents=True)
    left, working = cache / ".gone.json.0123456789abcdef.tmp", cache / ".busy.json.fedcba9876543210.tmp"
    left.write_text("{")
    os.utime(left, (1000, 1000))  # written long ago
    working.write_text("{")  # a writer at work now
    trace_cache.write("e", StepTrace(images=2))
    assert sorted(p.name for p in cache.iterdir()) == [working.name, "e.json"]
