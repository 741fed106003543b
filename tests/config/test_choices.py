"""The schema declares each closed set of choices beside its field, so that loading a recipe imports no
implementation (tests/test_cli_light.py); the implementations keep their own tuple or table of the same
choices. Every declared list must equal its implementation's, in order: a choice added to one and not the other
fails here."""

import importlib

from scale.config.fields import Listed, listed_in
from scale.config.schema import Recipe
from scale.config.validate import schema_rules


def listed_rules() -> dict[str, Listed]:
    return {key: rule["choices"] for key, rule in schema_rules(Recipe) if isinstance(rule.get("choices"), Listed)}


def implemented(listed: Listed) -> list:
    module, name = listed.source
    return list(getattr(importlib.import_module(module), name))


def test_every_declared_list_is_its_implementations():
    rules = listed_rules()
    assert {"engine.precision", "optim.name", "model.pos_embed", "data.backend", "train.init_what"} <= set(rules)
    differ = {key: (list(listed), implemented(listed)) for key, listed in rules.items()}
    differ = {key: pair for key, pair in differ.items() if pair[0] != pair[1]}
    assert not differ, f"declared != implemented: {differ}"


def test_a_list_that_drifts_from_its_implementation_is_seen():
    drifted = listed_in("scale.engine.clip", "CLIP_MODES", ("per_param",))
    assert implemented(drifted) != list(drifted)
