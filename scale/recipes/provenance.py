"""Where each stated value of a recipe comes from, and a check that the recipe still says it.

A recipe (or the base it inherits) records its sources in a `sources:` block keyed by dotted config key:

    sources:
      optim.lr: [5.0e-4, "DINO Sec. 4.1; main_dino.py --lr 0.0005"]
      train.epochs: [100, "assumption: the paper gives no epochs for fine-tuning"]

Each entry is [value as the source states it, the source]; a source that starts with `assumption:` marks a value no
paper or official command states. `check_sources` fails a paper's recipe whose resolved value differs from its
entry, and a stated value (`stated_keys`) that has no entry. Entries are lists so that a row's entry replaces its
base's whole (OmegaConf merges mappings key by key).
"""

from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from scale.config.load import SET_IN, _load_chain, recipe_path
from scale.methods.config import method_sections

PAPERS = ("dino", "mocov3", "esvit", "drloc")
ASSUMPTION = "assumption:"

# the hyper-parameters every recipe of a paper must source (issue 19, item 4), where the resolved recipe has them
COMMON = [
    "train.epochs",
    "train.global_batch",
    "optim.name",
    "optim.lr",
    "optim.lr_scaling",
    "optim.ref_batch",
    "optim.warmup_epochs",
    "optim.warmup_endpoint",
    "optim.warmup_prefix",
    "optim.lr_step",
    "optim.lr_lag",
    "optim.min_lr",
    "optim.weight_decay",
    "optim.weight_decay_end",
    "optim.clip_grad",
    "model.drop_path",
    "data.views.kind",
    "data.views.global_scale",
    "data.views.interpolation",
]
PER_METHOD = {
    "dino": [
        "method.dino.out_dim",
        "method.dino.norm_last_layer",
        "method.dino.student_temp",
        "method.dino.teacher_temp",
        "method.dino.warmup_teacher_temp",
        "method.dino.warmup_teacher_temp_epochs",
        "method.dino.momentum_teacher",
        "method.dino.freeze_last_layer",
        "data.views.n_local",
        "data.views.local_scale",
    ],
    "drloc": [
        "method.drloc.pairs",
        "method.drloc.weight",
        "method.drloc.mode",
        "method.drloc.grid",
        "method.drloc.pool",
        "method.drloc.normalize_targets",
        "method.drloc.use_abs",
        "method.drloc.l1_reduction",
        "method.drloc.gaussian_log",
        "method.drloc.gaussian_alpha",
        "method.drloc.class_head_extra_linear",
        "method.drloc.weight_schedule",
        "method.drloc.weight_warmup_epochs",
        "method.drloc.weight_total_epochs",
        "method.supervised.label_smoothing",
        "method.supervised.mixup",
        "method.supervised.cutmix",
    ],
    "supervised": [
        "method.supervised.label_smoothing",
        "method.supervised.mixup",
        "method.supervised.cutmix",
        "data.views.auto_augment",
        "data.views.random_erase_p",
    ],
}
# the frameworks of MoCo v3 Table 4 and DINO Table 7 source which one the row runs and the settings of its own section
# that set its loss's temperature and its momentum encoder
FRAMEWORK = {
    "mocov3": ["temperature", "momentum", "momentum_cosine"],
    "mocov2": ["temperature", "momentum", "momentum_cosine"],
    "simclr": ["temperature"],
    "byol": ["momentum", "momentum_cosine"],
    "swav": [],
}
PER_METHOD.update({kind: ["method.kind"] + [f"method.{kind}.{k}" for k in keys] for kind, keys in FRAMEWORK.items()})
PER_METHOD["esvit"] = PER_METHOD["dino"] + ["method.esvit.region_weight", "method.esvit.region_from_epoch"]
# what a recipe file writes that names the row rather than a hyper-parameter: not sourced key by key
IDENTITY = (
    "meta.",
    "engine.",
    "sources",
    "data.train",
    "data.val",
    "data.num_classes",
    "data.workers",
    "data.shuffle_buffer",
    "model.name",
    "model.patch_size",
    "model.img_size",
    "model.window_size",
    "model.num_heads",
    "method.kind",
    "train.",
)
# the evaluation protocol each recipe carries (its paper's; EvalConfig.protocol), key by key
PROBE = [
    "eval.linear_feature",
    "eval.linear_lrs",
    "eval.linear_epochs",
    "eval.linear_batch",
    "data.views.eval_interpolation",
]
BLOCKS = ["eval.linear_n_last_blocks", "eval.linear_avgpool"]  # only for the last_blocks feature
KNN = ["eval.knn_k", "eval.knn_temperature"]
EVAL_KEYS = {"dino": PROBE + BLOCKS + KNN, "esvit": PROBE + BLOCKS + KNN, "mocov3": PROBE, "finetune": []}
ROW_KEYS = ("train.epochs", "train.global_batch")


@dataclass
class Source:
    key: str
    value: object
    source: str

    @property
    def assumption(self) -> bool:
        return self.source.strip().lower().startswith(ASSUMPTION)


def _leaves(node: dict, prefix: str = ""):
    for key, value in node.items():
        if isinstance(value, dict):
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}"


def written_keys(name_or_path: str) -> set[str]:
    """The dotted keys the recipe's files (it and its bases) write, less those that name the row."""
    keys = set()
    for _, raw in _load_chain(recipe_path(name_or_path)):
        for key in _leaves(raw):
            if key in ROW_KEYS or not key.startswith(IDENTITY):
                keys.add(key)
    return keys


def _exists(cfg: DictConfig, key: str) -> bool:
    return OmegaConf.select(cfg, key, default="__absent__") != "__absent__"


def stated_keys(cfg: DictConfig, written: set[str] = frozenset()) -> list[str]:
    """The keys this recipe must source: the common hyper-parameters, its method's, its evaluation protocol's and
    every other value its files write."""
    keys = list(COMMON) + PER_METHOD.get(cfg.method.kind, [])
    if cfg.optim.clip_grad:
        keys.append("optim.clip_mode")
    if cfg.optim.lr_schedule_epochs is not None:
        keys.append("optim.lr_schedule_epochs")
    keys.append("eval.protocol")
    keys += [k for k in EVAL_KEYS.get(cfg.eval.protocol, []) if cfg.eval.linear_feature != "pooled" or k not in BLOCKS]
    keys += sorted(written)
    return [k for k in dict.fromkeys(keys) if _exists(cfg, k) and _read(cfg, k)]


def _read(cfg: DictConfig, key: str) -> bool:
    """Whether the recipe's method reads `key`: a key of another kind's section of `method` (a base's, written for
    the kind the base sets) is not one this row states."""
    parts = key.split(".")
    return parts[0] != "method" or len(parts) < 3 or parts[1] in method_sections(cfg.method.kind)


def sources_of(cfg: DictConfig) -> dict[str, Source]:
    entries = OmegaConf.to_container(cfg.sources) if "sources" in cfg else {}
    return {key: Source(key, entry[0], str(entry[1])) for key, entry in entries.items()}


def _same(ours, stated) -> bool:
    if isinstance(ours, bool) or isinstance(stated, bool):
        return ours is stated
    if isinstance(ours, int | float) and isinstance(stated, int | float):
        return abs(ours - stated) <= 1e-9 * max(abs(ours), abs(stated), 1e-30)
    if isinstance(ours, list) and isinstance(stated, list):
        return len(ours) == len(stated) and all(_same(a, b) for a, b in zip(ours, stated, strict=True))
    return ours == stated


def source_errors(cfg: DictConfig, written: set[str] = frozenset()) -> list[str]:
    """Every stated value that differs from its source or has none; every entry that names no key of the recipe."""
    if cfg.meta.paper not in PAPERS:
        return []
    errors = []
    bad = [e for e in (OmegaConf.to_container(cfg.sources) or {}).items() if not _is_entry(e[1])]
    errors += [f"sources.{key}: expected [value, source], got {entry!r}" for key, entry in bad]
    if bad:
        return errors
    if cfg.eval.protocol not in EVAL_KEYS:
        errors.append(f"eval.protocol: expected one of {', '.join(EVAL_KEYS)}, got '{cfg.eval.protocol}'")
    sources = sources_of(cfg)
    for key in stated_keys(cfg, written):
        ours = _value(cfg, key)
        entry = sources.get(key)
        if entry is None:
            errors.append(f"{key}={ours!r} has no source (add sources.{key}: [value, 'where it is stated'])")
        elif entry.source.startswith(SET_IN) and entry.source != SET_IN + "command line":
            errors.append(f"{key}={ours!r} is {entry.source} without a source (add sources.{key} there)")
        elif not _same(ours, entry.value):
            errors.append(f"{key}={ours!r} but {entry.source} states {entry.value!r}")
    errors += [f"sources.{key} names no key of the recipe" for key in sources if not _exists(cfg, key)]
    return errors


def _is_entry(entry) -> bool:
    return isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], str) and entry[1].strip() != ""


def _value(cfg: DictConfig, key: str):
    value = OmegaConf.select(cfg, key)
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def source_table(cfg: DictConfig, written: set[str] = frozenset()) -> list[dict]:
    """Rows of `scale recipes show NAME --sources`: each stated key, its value, its source or that it is an
    assumption (or that it has none)."""
    sources = sources_of(cfg)
    rows = []
    for key in stated_keys(cfg, written):
        entry = sources.get(key)
        kind = "none" if entry is None else "assumption" if entry.assumption else "source"
        kind = "set" if entry is not None and entry.source.startswith(SET_IN) else kind
        rows.append({"key": key, "value": _value(cfg, key), "kind": kind, "source": entry.source if entry else ""})
    return rows
