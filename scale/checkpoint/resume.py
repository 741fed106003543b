"""What may change between a run and its continuation, as each schema field declares it (scale/config/fields.py):
a FIXED field (a checkpointed shape, the trained parameters, what the saved position means) is refused, a NOTED one
is logged, any other changes freely."""

from omegaconf import DictConfig, OmegaConf

from scale.checkpoint.store import CheckpointStore
from scale.config.fields import FIXED, NOTED
from scale.config.load import from_dict
from scale.config.schema import Recipe
from scale.config.validate import get_key, schema_rules
from scale.errors import ConfigError


def keys_with(resume: str) -> list[str]:
    """The dotted keys whose schema rule is `resume` (FIXED or NOTED)."""
    return [dotted for dotted, rule in schema_rules(Recipe) if rule.get("resume") == resume]


def _changes(saved: DictConfig, new: DictConfig, keys: list[str]) -> list[str]:
    def plain(value):
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value

    found = []
    for key in keys:
        old, value = plain(get_key(saved, key)), plain(get_key(new, key))
        if old != value:
            found.append(f"{key}: {old!r} -> {value!r}")
    return found


def check_compatible(saved: DictConfig, new: DictConfig, where: str) -> list[str]:
    """Fail naming every FIXED key that differs between the saved config and the new one; the NOTED changes, for
    the resumed run to log."""
    fixed = _changes(saved, new, keys_with(FIXED))
    if fixed:
        raise ConfigError(
            f"{where} cannot be resumed with this recipe; these settings are fixed on resume and changed: "
            + "; ".join(fixed)
            + ". Restore them, or start a new run (another --run-dir, train.init_weights for its weights)."
        )
    return _changes(saved, new, keys_with(NOTED))


def check_resumable(run, cfg: DictConfig) -> list[str]:
    """A run directory with a checkpoint continues only with a compatible recipe (the changes it allowed but
    notes are returned); one without (a start that failed before its first checkpoint) takes any recipe."""
    if run.config.exists() and CheckpointStore(run.checkpoints).step_dirs():
        saved = from_dict(run.read_config(), str(run.config))
        return check_compatible(saved, cfg, str(run.root))
    return []
