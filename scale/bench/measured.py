"""Measured device rows (scale/bench/measured.yaml): what the device check measured on real GPUs, by card and bench
setting, and the planner's calibration from them.

Each row: {date, card, torch, commit, setting: {recipe, engine, batch_per_gpu, precision, compile,
activation_checkpointing, crops}, images_per_s, step_s, flops_per_image, mfu_datasheet, mfu_measured_peak,
peak_memory_gib, source} (the shape tools/device-check emits). The planner takes the MFU of the rows of the same card
and model family (the recipe itself, else its method and backbone, else its method), so that its predicted step time
is the measured one where a row exists, and says which rows it used."""

import math
import statistics
from dataclasses import dataclass
from pathlib import Path

import yaml

from scale.bench.mfu import card_key
from scale.errors import UserError

MEASURED = Path(__file__).with_name("measured.yaml")
ROW_KEYS = ("date", "card", "setting", "images_per_s", "step_s", "flops_per_image", "mfu_datasheet", "source")
SETTING_KEYS = ("recipe", "engine", "batch_per_gpu", "precision", "compile", "activation_checkpointing")
DEFAULT_MFU = 0.4  # without a measured row: a well-tuned large-model step (torchtitan's reports), stated as such


def load_rows(path: Path = MEASURED) -> list[dict]:
    """The rows of `path`, each checked for the keys the planner reads (UserError naming the file and row)."""
    try:
        rows = yaml.safe_load(path.read_text()) or []
    except (OSError, yaml.YAMLError) as err:
        raise UserError(f"{path}: cannot read the measured rows: {err}") from None
    if not isinstance(rows, list):
        raise UserError(f"{path}: expected a YAML list of measured rows")
    for index, row in enumerate(rows):
        missing = [k for k in ROW_KEYS if not isinstance(row, dict) or k not in row]
        missing += [f"setting.{k}" for k in SETTING_KEYS if not missing and k not in (row["setting"] or {})]
        if missing:
            raise UserError(f"{path}: row {index}: missing {', '.join(missing)}")
    return rows


def family(cfg) -> tuple[str, str]:
    """A recipe's model family: (method kind, backbone name)."""
    return str(cfg.method.kind), str(cfg.model.name)


def nearest_batch(rows: list[dict], batch_per_gpu: int) -> list[dict]:
    """The rows whose batch per GPU is nearest `batch_per_gpu` by ratio (64 is as far from 128 as 256 is)."""

    def distance(row):
        return abs(math.log(int(row["setting"]["batch_per_gpu"]) / batch_per_gpu))

    best = min(map(distance, rows))
    return [r for r in rows if distance(r) == best]


@dataclass(frozen=True)
class Calibration:
    mfu: float  # model FLOPs / step time / datasheet peak, as the rows measure it
    ac: str  # the activation checkpointing of the rows (their step time includes its recomputation)
    note: str  # which assumption: the rows used, or the default


def calibrate(
    rows: list[dict],
    card: str,
    recipe: str,
    fam: tuple[str, str],
    precision: str,
    compile: bool,
    family_of,
    batch_per_gpu: int | None = None,
) -> Calibration:
    """The MFU of the rows of this card (`card`: scale.bench.mfu.card_key of the planned GPU) and precision
    that are closest to the recipe: the recipe itself, else its method and backbone, else its method; among those,
    the rows with the same compile setting if any, then those whose batch per GPU is nearest `batch_per_gpu` (a
    host-bound step's MFU grows with the batch: DINO ViT-S/16 on an H200, 7.6% at 64 images, 15.5% at 256);
    their median. `family_of(recipe name)`: a row's family."""
    same_card = [r for r in rows if card_key(r["card"]) == card and r["setting"]["precision"] == precision]
    levels = (
        ("the recipe", lambda r: r["setting"]["recipe"] == recipe),
        (f"{fam[0]} {fam[1]}", lambda r: family_of(r["setting"]["recipe"]) == fam),
        (f"{fam[0]}", lambda r: family_of(r["setting"]["recipe"])[0] == fam[0]),
    )
    for what, match in levels:
        chosen = [r for r in same_card if match(r)]
        chosen = [r for r in chosen if bool(r["setting"]["compile"]) == compile] or chosen
        if chosen and batch_per_gpu:
            chosen = nearest_batch(chosen, batch_per_gpu)
        if chosen:
            mfu = statistics.median(float(r["mfu_datasheet"]) for r in chosen)
            acs = [r["setting"]["activation_checkpointing"] for r in chosen]
            ac = max(set(acs), key=acs.count)
            names = sorted({f"{r['setting']['recipe']} {r['date']}" for r in chosen})
            note = (
                f"MFU {mfu:.1%} measured ({what}: {len(chosen)} row(s) on {chosen[0]['card']}: {', '.join(names)}; "
                f"scale/bench/measured.yaml)"
            )
            return Calibration(mfu, ac, note)
    return Calibration(DEFAULT_MFU, "none", f"MFU {DEFAULT_MFU:.0%} assumed (no measured row for this card and model)")


def compile_gain(rows: list[dict], card: str, recipe: str, precision: str, batch_per_gpu: int) -> str | None:
    """For a recipe that runs eager: where this card's rows of the recipe measured one batch per GPU both eager and
    compiled (the batch nearest `batch_per_gpu` by ratio, the larger of two as near), a line naming the fastest
    compile mode there, its gain over eager and the overrides that run it; None where no batch was measured both
    ways or compiling measured no faster. Rows of other batches or recipes say little: a host-bound step gains
    most from CUDA graphs at a small batch, a device-bound one from fused kernels at a large one (the H200, 2026-11-28)."""
    mine = [
        r
        for r in rows
        if card_key(r["card"]) == card and r["setting"]["recipe"] == recipe and r["setting"]["precision"] == precision
    ]
    by_batch: dict[int, dict[tuple[str, str] | None, list[float]]] = {}  # mode (compile_mode, scope); None: eager
    for r in mine:
        setting = r["setting"]
        mode = (
            (setting.get("compile_mode", "default"), setting.get("compile_scope", "blocks"))
            if setting["compile"]
            else None
        )
        by_batch.setdefault(int(setting["batch_per_gpu"]), {}).setdefault(mode, []).append(float(r["mfu_datasheet"]))
    both = [b for b, modes in by_batch.items() if None in modes and len(modes) > 1]
    if not both:
        return None
    batch = min(both, key=lambda b: (abs(math.log(b / batch_per_gpu)), -b))
    modes = {mode: statistics.median(values) for mode, values in by_batch[batch].items()}
    eager = modes.pop(None)
    (compile_mode, scope), best = max(modes.items(), key=lambda kv: kv[1])
    if best <= eager:
        return None
    overrides = "engine.compile=true" + ("" if compile_mode == "default" else f" engine.compile_mode={compile_mode}")
    overrides += " engine.compile_scope=net" if scope == "net" else ""
    label = compile_mode + (", net scope" if scope == "net" else "")
    engines = sorted({r["setting"].get("engine", "?") for r in mine if int(r["setting"]["batch_per_gpu"]) == batch})
    return (
        f"compiled ({label} mode): {best / eager:.2f}x the eager step, measured on {mine[0]['card']} under "
        f"{'/'.join(engines)} at {batch} images "
        f"per GPU (MFU {best:.1%} against {eager:.1%}; scale/bench/measured.yaml); to run it, pass {overrides} to "
        f"`scale submit`"
    )
