"""scale.bench.measured.calibrate: which measured rows set the planner's MFU."""

from scale.bench.measured import calibrate, compile_gain


def row(batch: int, mfu: float, compile: bool = False, card: str = "NVIDIA H200") -> dict:
    setting = {"recipe": "dino/table2/vit_s16", "precision": "bf16", "compile": compile, "batch_per_gpu": batch}
    setting |= {"activation_checkpointing": "none", "engine": "ddp"}
    return {"card": card, "date": "2026-11-28", "setting": setting, "mfu_datasheet": mfu}


def family_of(name: str):
    return ("dino", "vit_small")


def mfu_for(rows, batch, compile=False):
    return calibrate(rows, "H200", "dino/table2/vit_s16", ("dino", "vit_small"), "bf16", compile, family_of, batch).mfu


def test_the_rows_at_the_nearest_batch_per_gpu_by_ratio_set_the_mfu():
    """A host-bound step's MFU grows with the batch (the H200's DINO rows: 7.6% at 64, 15.5% at 256)."""
    rows = [row(64, 0.076), row(128, 0.128), row(256, 0.155)]
    assert mfu_for(rows, 64) == 0.076
    assert mfu_for(rows, 100) == 0.128  # 128 / 100 is nearer 1 than 100 / 64
    assert mfu_for(rows, 4096) == 0.155
    assert mfu_for(rows, None) == 0.128  # no batch given: the median of all


def test_the_compile_setting_and_card_come_before_the_batch():
    rows = [row(64, 0.076), row(256, 0.30, compile=True), row(64, 0.5, card="NVIDIA H100 80GB HBM3")]
    assert mfu_for(rows, 64, compile=True) == 0.30
    assert mfu_for(rows, 256, compile=False) == 0.076


def gain(rows, batch):
    return compile_gain(rows, "H200", "dino/table2/vit_s16", "bf16", batch)


def test_the_plan_names_the_compile_mode_measured_faster_at_the_nearest_batch_measured_both_ways():
    """The H200's rows (2026-11-28): at 64 images eager 7.6% and 10.9%, CUDA graphs 15.5%; at 256 eager 15.6%,
    compiled 21.4%. A planned 64 gets CUDA graphs, a planned 200 the default mode, a planned 128 (as near to both)
    the larger batch's."""
    graphs = row(64, 0.155, compile=True)
    graphs["setting"]["compile_mode"] = "reduce-overhead"
    rows = [row(64, 0.076), row(64, 0.109), graphs, row(256, 0.156), row(256, 0.214, compile=True)]
    at_64 = gain(rows, 64)
    assert "reduce-overhead mode" in at_64 and "1.68x" in at_64 and "under ddp at 64 images" in at_64
    assert "engine.compile=true engine.compile_mode=reduce-overhead" in at_64
    for planned in (128, 200):
        line = gain(rows, planned)
        assert (
            "(default mode): 1.37x" in line
            and "at 256 images" in line
            and line.endswith("pass engine.compile=true to `scale submit`")
        )


def test_no_compile_line_without_a_batch_measured_both_ways_or_a_gain():
    assert gain([row(64, 0.1), row(256, 0.3, compile=True)], 64) is None  # no batch measured both ways
    assert gain([row(64, 0.1), row(64, 0.09, compile=True)], 64) is None  # compiling measured slower
    assert gain([row(64, 0.1), row(64, 0.2, compile=True, card="NVIDIA H100 80GB HBM3")], 64) is None  # another card


def test_a_net_scope_row_names_its_scope_and_override():
    whole = row(64, 0.2, compile=True)
    whole["setting"] |= {"compile_mode": "reduce-overhead", "compile_scope": "net"}
    line = gain([row(64, 0.1), whole], 64)
    assert "(reduce-overhead, net scope mode): 2.00x" in line
    assert line.endswith(
        "engine.compile=true engine.compile_mode=reduce-overhead engine.compile_scope=net to `scale submit`"
    )
