"""Validation of runs with a class head: the lockstep split over ranks, the accuracy arithmetic, and
`scale eval finetune` (= `scale train` of a supervised recipe) whose recorded top-1 is the exported model's."""

import json
import sys

import pytest
import torch
from safetensors.torch import load_file

from scale.checkpoint.export import export
from scale.cli import main as cli
from scale.config import load_recipe
from scale.data.batch import Batch
from scale.data.evaluation import ShardSamples, eval_views_cfg, lockstep_batches
from scale.loop.validation import accuracy
from scale.methods import build_method
from tests import fork_server
from tests.helpers_run import FORKED_RANKS, clean_env

RECIPE = """
base: _base/drloc
model: {{name: vit_nano, img_size: 32, patch_size: 8, drop_path: 0.0, pooling: avg}}
method: {{kind: supervised, supervised: {{mixup: 0.0, cutmix: 0.0, label_smoothing: 0.0}}}}
data:
  train: {root}/digits/train
  val: {root}/digits/val
  num_classes: 10
  workers: 0
  views:
    {{global_size: 32, global_scale: [0.6, 1.0], eval_resize: 32, eval_crop: 32, auto_augment: '',
     random_erase_p: 0.0}}
optim: {{lr: 3.0e-3, ref_batch: 32, warmup_epochs: 0, weight_decay: 0.0, weight_decay_end: 0.0}}
engine: {{kind: fsdp2, precision: fp32}}
train: {{epochs: 2, global_batch: 32, samples_per_epoch: 256, log_every: 4}}
eval: {{batch_size: 50}}
"""


@pytest.fixture(scope="module")
def data(embedded_data, tmp_path_factory):
    root = embedded_data / "embedded"
    recipe = tmp_path_factory.mktemp("val_data") / "supervised.yaml"
    recipe.write_text(RECIPE.format(root=root))
    return root, str(recipe)


@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_lockstep_batches_give_every_rank_the_same_count_and_every_sample_once(data, world):
    root, recipe = data
    views = eval_views_cfg(load_recipe(recipe).data.views)
    total = len(ShardSamples(root / "digits" / "val", views))
    lengths, own_keys = set(), []
    for rank in range(world):
        batches, own = lockstep_batches(root / "digits" / "val", views, 64, rank, world)
        keys = [k for b in batches for k in b.keys]
        lengths.add((len(batches), len(keys)))
        own_keys += keys[:own]
    assert len(lengths) == 1  # same batches and samples on every rank
    assert sorted(own_keys) == sorted(set(own_keys)) and len(own_keys) == total


def test_accuracy_counts_only_own_samples_top1_and_top5():
    labels = torch.tensor([0, 1, 2, 3, 4, 5])
    scores = torch.zeros(6, 8)
    scores[torch.arange(6), labels] = 1.0  # rows 0-3 right at top-1
    scores[4, 7], scores[5, 7] = 2.0, 2.0  # rows 4, 5: the label is second (top-5 only)
    scores[3, :], scores[3, 3] = torch.arange(8.0), -1.0  # row 3: label 3 ranks last: neither top-1 nor top-5
    batches = [Batch([scores[:4]], [1], labels[:4], list("abcd")), Batch([scores[4:]], [1], labels[4:], list("ef"))]
    result = accuracy(lambda x: x, batches, own=5, device=torch.device("cpu"))  # row 5 is padding
    assert result == {"top1": pytest.approx(100 * 3 / 5), "top5": pytest.approx(100 * 4 / 5), "samples": 5}


@pytest.mark.slow  # spawns ranks
def test_finetune_is_a_training_run_whose_val_top1_is_the_exported_models(data, tmp_path):
    root, recipe = data
    run_dir, out = tmp_path / "run", tmp_path / "finetune.json"
    cmd = [
        sys.executable,
        str(FORKED_RANKS),  # forked by the fork server, its ranks from it (tests/fork_server.py)
        "eval",
        "finetune",
        recipe,
        "--random-init",
        "--nproc",
        "2",
        "--run-dir",
        str(run_dir),
        "--out",
        str(out),
    ]
    done = fork_server.run(cmd, env=clean_env(root), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [h["step"] for h in result["history"]] == [8, 16]  # every epoch (8 steps); the last one is the last step
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["val_top1"] for m in metrics if "val_top1" in m] == [h["top1"] for h in result["history"]]

    cfg = load_recipe(recipe)
    student = build_method(cfg, 8, 16).student
    weights = export(run_dir, "student", "safetensors", tmp_path / "student.safetensors")
    student.load_state_dict(load_file(str(weights)))
    samples = ShardSamples(root / "digits" / "val", eval_views_cfg(cfg.data.views))
    batch = samples.collate([samples[i] for i in range(len(samples))])
    with torch.no_grad():
        logits = student.eval()(batch.crops[0])["logits"]
    direct = 100.0 * float((logits.argmax(1) == batch.labels).float().mean())
    assert result["top1"] == pytest.approx(direct, abs=1e-6) and result["history"][-1]["samples"] == len(samples)
    # the equality means something only for a classifier whose answer depends on the image
    assert len(logits.argmax(1).unique()) >= 3


def test_validation_leaves_the_training_rng_untouched(data, tmp_path):
    from scale.engine.dist import detect
    from scale.engine.parallel import parallel_context
    from scale.loop.validation import Validation

    _, recipe = data
    cfg = load_recipe(recipe)
    method = build_method(cfg, 8, 16)
    validation = Validation(
        cfg, parallel_context(detect({}), torch.device("cpu")), torch.device("cpu"), tmp_path / "val.json"
    )
    before = torch.get_rng_state()
    metrics = validation(method, torch.no_grad, step=8, epoch=1.0)
    assert torch.equal(torch.get_rng_state(), before) and method.student.training
    assert json.loads((tmp_path / "val.json").read_text())["history"][0]["top1"] == metrics["val_top1"]


def test_each_validation_batch_is_a_generation_of_cuda_graph_trees(data, tmp_path, monkeypatch):
    """Compiled blocks that replay CUDA graphs: each validation batch marks a new generation before its logits
    (scale.engine.compile.begin_graph_step), as each training step does; none without them."""
    from scale.engine.dist import detect
    from scale.engine.parallel import parallel_context
    from scale.loop.validation import Validation

    events = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: events.append("mark"))
    _, recipe = data
    for mode, marked in (("reduce-overhead", True), ("default", False)):
        events.clear()
        cfg = load_recipe(recipe, ["engine.compile=true", f"engine.compile_mode={mode}"])
        method = build_method(cfg, 8, 16)
        method.val_logits = lambda images, logits=method.val_logits: events.append("logits") or logits(images)
        cpu = torch.device("cpu")
        Validation(cfg, parallel_context(detect({}), cpu), cpu, tmp_path / f"{mode}.json")(
            method, torch.no_grad, step=8, epoch=1.0
        )
        batches = events.count("logits")
        assert batches > 1 and events == (["mark", "logits"] * batches if marked else ["logits"] * batches)


def test_finetune_needs_a_recipe_with_a_class_head(capsys):
    assert cli(["eval", "finetune", "dino/table2/vit_s16", "--random-init"]) == 2
    assert "has no class head" in capsys.readouterr().err


def test_missing_val_shards_fail_before_any_rank_starts(data, tmp_path):
    """A config error raised before the process group exists (printed once, on rank 0), not on every rank."""
    from scale.errors import ConfigError
    from scale.loop.train import main

    _, recipe = data
    overrides = [f"data.val={tmp_path}/nowhere", "engine.kind=ddp"]
    with pytest.raises(ConfigError, match="data.val: shard manifest not found.*train.val_every_epochs=0"):
        main(recipe, overrides, run_dir=str(tmp_path / "run"), nproc=2)
