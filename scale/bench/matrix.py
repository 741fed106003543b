"""`--matrix key=v1,v2`: the settings to compare in one run (their cartesian product), as recipe overrides, and the
one table that compares them. One axis per flag (repeated); short-key axes may also follow one flag (`split_axes`).

Keys: engine (ddp, fsdp2, zero1, zero2, zero3), precision (fp32, bf16, fp16), ac (none, full, selective, every<N>),
compile (false, true: engine.compile), micro_batch (images per rank per forward: sets engine.grad_accum), crops
(e.g. 2x224+10x96), batch (global), or any dotted recipe key (e.g. model.name).
"""

import itertools
import re

from scale.config import load_recipe
from scale.engine.kinds import SETTINGS, describe, runs_as
from scale.engine.kinds import setting_overrides as engine_overrides
from scale.errors import UserError

SHORT_KEYS = ("engine", "precision", "ac", "compile", "micro_batch", "crops", "batch")
CROPS = re.compile(r"^(\d+)x(\d+)((?:\+\d+x\d+)*)$")


def parse_matrix(items: list[str]) -> list[tuple[str, list[str]]]:
    axes = []
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or not key or not values:
            raise UserError(f"--matrix '{item}': expected key=v1,v2 (keys: {', '.join(SHORT_KEYS)} or a recipe key)")
        if key not in SHORT_KEYS and "." not in key:
            raise UserError(f"--matrix key '{key}' is neither one of {', '.join(SHORT_KEYS)} nor a dotted recipe key")
        axes.append((key, [v for v in values.split(",") if v]))
    return axes


def split_axes(overrides: list[str]) -> tuple[list[str], list[str]]:
    """The recipe overrides and the matrix axes among them: a short key (`ac=none,full`) is never a recipe key, so
    `--matrix compile=false,true ac=none,full` (several axes after one flag) means two axes, while a dotted override
    after the flag (`optim.lr=0.1`) stays an override."""
    axes = [item for item in overrides if item.partition("=")[0] in SHORT_KEYS]
    return [item for item in overrides if item not in axes], axes


def combinations(axes: list[tuple[str, list[str]]]) -> list[dict[str, str]]:
    if not axes:
        return [{}]
    keys = [k for k, _ in axes]
    return [dict(zip(keys, values)) for values in itertools.product(*(v for _, v in axes))]


def crop_overrides(spec: str) -> list[str]:
    """'2x224+10x96' -> two global 224 px views and ten local 96 px views (several local sizes allowed)."""
    match = CROPS.match(spec.replace(" ", ""))
    if not match:
        raise UserError(f"--matrix crops '{spec}': expected GxSIZE[+LxSIZE...], e.g. 2x224+10x96")
    locals_ = [part.split("x") for part in match.group(3).split("+") if part]
    sizes = [int(s) for _, s in locals_] or [96]
    counts = [int(n) for n, _ in locals_] or [0]
    return [
        f"data.views.n_global={match.group(1)}",
        f"data.views.global_size={match.group(2)}",
        f"data.views.local_sizes=[{','.join(map(str, sizes))}]",
        f"data.views.n_local=[{','.join(map(str, counts))}]",
    ]


def setting_overrides(key: str, value: str) -> list[str]:
    if key == "engine":
        if value not in SETTINGS:
            raise UserError(f"--matrix engine '{value}' is not one of {', '.join(SETTINGS)}")
        return engine_overrides(value)
    if key == "precision":
        return [f"engine.precision={value}"]
    if key == "compile":
        return [f"engine.compile={value}"]
    if key == "ac":
        if value.startswith("every"):
            every = value[len("every") :].lstrip("_")
            if not every.isdigit():
                raise UserError(f"--matrix ac '{value}': expected none, full or every<N> (e.g. every2)")
            return ["engine.activation_checkpointing=every_n", f"engine.ac_every_n={every}"]
        return [f"engine.activation_checkpointing={value}"]
    if key == "crops":
        return crop_overrides(value)
    if key == "batch":
        return [f"train.global_batch={value}"]
    if key == "micro_batch":
        return []  # needs the per-rank batch: see load_setting
    return [f"{key}={value}"]


def load_setting(recipe: str, overrides: list[str], setting: dict[str, str], world_size: int):
    """The recipe with the base overrides and one setting of the matrix applied."""
    extra = [o for key, value in setting.items() for o in setting_overrides(key, value)]
    cfg = load_recipe(recipe, [*overrides, *extra])
    if "micro_batch" in setting:
        micro = int(setting["micro_batch"])
        per_rank = cfg.train.global_batch // world_size
        if micro < 1 or per_rank % micro:
            raise UserError(f"--matrix micro_batch {micro} does not divide the per-rank batch {per_rank}")
        cfg = load_recipe(recipe, [*overrides, *extra, f"engine.grad_accum={per_rank // micro}"])
    return cfg


def label(setting: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in setting.items()) or "recipe"


def mib(value) -> str:
    return "-" if value is None else f"{value / 2**20:.1f}"


def format_table(rows: list[dict]) -> str:
    """One line per setting: throughput, phases (s per step), communication, memory (MiB), MFU, and the seconds
    spent compiling (engine.compile; not part of the step time). The setting column is as wide as the longest
    setting: a cut one would hide the axes that tell rows apart."""
    width = max([32, *(len(row["label"]) for row in rows)])
    head = (
        f"{'setting':{width}s} {'step s':>8s} {'compile s':>9s} {'img/s':>8s} {'img/s/dev':>9s} {'crops/s/dev':>11s} "
        f"{'data':>6s} {'fwd':>7s} {'bwd':>7s} {'optim':>6s} {'other':>6s} {'comm':>6s} "
        f"{'peak MiB':>9s} {'RSS MiB':>8s} {'state MiB':>9s} {'MFU':>6s}"
    )
    lines = [head]
    for row in rows:
        p = row["phases"]
        mfu = f"{100 * row['mfu']:5.1f}%" if row.get("mfu") is not None else "-"
        lines.append(
            f"{row['label']:{width}s} {row['step_s']:8.3f} {row['compile_s']:9.1f} {row['images_per_s']:8.2f} "
            f"{row['images_per_s_per_device']:9.2f} {row['crops_per_s_per_device']:11.2f} {p['data']:6.3f} "
            f"{p['forward']:7.3f} {p['backward']:7.3f} {p['optimizer']:6.3f} {p['other']:6.3f} "
            f"{row['comm_s']:6.3f} {mib(row['peak_bytes']):>9s} {mib(row.get('rss_peak_bytes')):>8s} "
            f"{mib(row['state']['total']):>9s} {mfu:>6s}"
        )
    return "\n".join(lines)


def run_matrix(
    recipe: str, overrides: list[str], matrix: list[str], steps: int, warmup: int, synthetic: bool
) -> list[dict]:
    """Benchmark every setting in this process group (rank 0's rows are complete) and return the rows."""
    import gc

    from scale.bench.run import bench_config
    from scale.engine.dist import init_distributed
    from scale.engine.parallel import resolve_shard_size

    axes = parse_matrix(matrix)
    info, device = init_distributed()
    settings = combinations(axes)
    configs = [load_setting(recipe, overrides, s, info.world_size) for s in settings]  # fail before measuring
    rows, measured = [], {}  # the step each setting runs -> its row
    for setting, cfg in zip(settings, configs):
        ran = runs_as(cfg.engine.kind, info.world_size, resolve_shard_size(cfg.engine.shard_size, info.world_size),
                      cfg.engine.unsharded_ddp)  # fmt: skip
        why = "" if ran == cfg.engine.kind else f" [{describe(cfg.engine.kind, ran, info.world_size)}]"
        step = ran_step(cfg, ran)
        if step in measured:  # engine=ddp,fsdp2 on one GPU: one step, measured once, shown under both settings
            first = measured[step]
            rows.append({**first, "label": f"{label(setting)}{why} = {first['label']}", "setting": setting})
            continue
        row = bench_config(cfg, info, device, steps=steps, warmup=warmup, synthetic=synthetic)
        rows.append(measured.setdefault(step, {"label": label(setting) + why, "setting": setting, **row}))
        gc.collect()
    return rows


def ran_step(cfg, ran: str) -> str:
    """What identifies the step a setting runs: its whole config, with the engine that runs it (kinds.runs_as:
    engine.kind=fsdp2 on one rank runs DDP's step)."""
    from omegaconf import OmegaConf

    container = OmegaConf.to_container(cfg)
    container["engine"]["kind"] = ran
    return OmegaConf.to_yaml(container)
