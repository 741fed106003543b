"""The measured-rows contract with the planner (scale/bench/measured.yaml, read by scale.bench.measured.load_rows):
one row per benchmarked setting, in one shape, written by the device check as `$OUT/measured_rows.yaml` and under
"measured_rows" in `$OUT/summary.json`, and appended to the package table by `tools/device-check --fold-rows FILE`."""

import datetime
from pathlib import Path

import yaml

SOURCE = "tools/device-check (issue 44 sweep)"
TABLE = Path(__file__).resolve().parents[2] / "scale" / "bench" / "measured.yaml"


def crops_text(counts_sizes: list[tuple[int, int]]) -> str:
    return "+".join(f"{n}x{size}" for n, size in counts_sizes)


def measured_row(row: dict, setting: dict, card: str, torch_version: str, commit: str | None, measured_tflops) -> dict:
    """A `scale bench --json` row and the setting it measured, in the contract's shape."""
    per_device = row["flops_per_step"] / row["step_s"] / row["world"]
    return {
        "date": datetime.date.today(),  # a YAML date, as the table's other rows
        "card": card,
        "torch": torch_version,
        "commit": commit,
        "setting": setting,
        "images_per_s": round(row["images_per_s"], 1),
        "step_s": round(row["step_s"], 4),
        "flops_per_image": round(row["flops_per_step"] / row["global_batch"], -6),
        "mfu_datasheet": round(per_device / row["peak_flops_per_device"], 4),
        "mfu_measured_peak": round(per_device / (measured_tflops * 1e12), 4) if measured_tflops else None,
        "peak_memory_gib": round(row["peak_bytes"] / 2**30, 2) if row.get("peak_bytes") else None,
        "source": SOURCE,
    }


def dump(rows: list[dict]) -> str:
    return yaml.safe_dump(rows, sort_keys=False, default_flow_style=None, width=120)


def fold(rows_file: Path, table: Path = TABLE) -> int:
    """Append the rows of a device check's measured_rows.yaml to the package table (text appended, so that the
    table's comments stay); the number of rows appended. A row already in the table (same date, card, commit and
    setting) is not appended twice."""
    rows = yaml.safe_load(Path(rows_file).read_text()) or []
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "setting" in r for r in rows):
        raise ValueError(f"{rows_file}: not a list of measured rows")
    existing = (yaml.safe_load(table.read_text()) or []) if table.is_file() else []

    def key(r):
        return (str(r.get("date")), r.get("card"), r.get("commit"), yaml.safe_dump(r.get("setting"), sort_keys=True))

    seen = {key(r) for r in existing}
    new = [r for r in rows if key(r) not in seen]
    if new:
        text = table.read_text() if table.is_file() else ""
        with open(table, "a") as f:
            f.write(("" if not text or text.endswith("\n") else "\n") + dump(new))
    return len(new)
