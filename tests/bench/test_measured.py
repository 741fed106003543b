"""scale.bench.measured.calibrate: which measured rows set the planner's MFU."""

from scale.bench.measured import calibrate


def row(batch: int, mfu: float, compile: bool = False, card: str = "NVIDIA H200") -> dict:
    setting = {"recipe": "dino/table2/vit_s16", "precision": "bf16", "compile": compile, "batch_per_gpu": batch}
    setting["activation_checkpointing"] = "none"
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
