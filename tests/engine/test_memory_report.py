"""The memory report runs the training step itself (scale.loop.step.TrainStep) in the recipe's own crop layout."""

from omegaconf import OmegaConf

from scale.bench.memory_report import format_report, measure
from scale.config import load_recipe


def test_memory_report_of_a_recipe_without_local_crops(group):
    cfg = load_recipe("demo/esvit_tiny", [])  # n_local: [0]: no group of local crops at all
    report = measure(cfg, ["ddp", "fsdp2"])
    # one rank: fsdp2 runs as DDP (scale.engine.kinds.runs_as), and the report says so
    assert (report["ddp"]["engine"], report["fsdp2"]["engine"]) == ("ddp", "ddp (fsdp2 on one rank)")
    assert format_report(report, 1).splitlines()[-1].endswith("runs as ddp (fsdp2 on one rank)")
    kept = measure(OmegaConf.merge(cfg, {"engine": {"unsharded_ddp": False}}), ["fsdp2"])["fsdp2"]
    assert kept["engine"] == "fsdp2"
    for held in [*report.values(), kept]:
        assert held["params"] > 0 and held["teacher"] > 0
        assert held["optimizer"] >= 2 * held["params"]  # AdamW's two moments (and step counts), one rank
    assert report["ddp"]["total"] == kept["total"]  # FSDP2 on one rank: nothing to shard
