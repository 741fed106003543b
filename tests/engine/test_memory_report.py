"""The memory report runs the training step itself (scale.loop.step.TrainStep) in the recipe's own crop layout."""

from scale.bench.memory_report import measure
from scale.config import load_recipe


def test_memory_report_of_a_recipe_without_local_crops(group):
    cfg = load_recipe("demo/esvit_tiny", [])  # n_local: [0]: no group of local crops at all
    report = measure(cfg, ["ddp", "fsdp2"])
    for held in report.values():
        assert held["params"] > 0 and held["teacher"] > 0
        assert held["optimizer"] >= 2 * held["params"]  # AdamW's two moments (and step counts), one rank
    assert report["ddp"]["total"] == report["fsdp2"]["total"]  # one rank: nothing to shard
