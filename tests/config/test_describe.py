"""The recipe keys' descriptions read from the schema's comments (scale/config/describe.py) and `scale recipes
explain`, which prints them."""

from scale.cli import main
from scale.config.describe import describe, describe_all


def test_a_comment_beside_a_field_is_its_description():
    info = describe("train.max_steps", resolve_choices=False)
    assert info.description == "stop early (smoke runs, benchmarks)"
    assert (info.type, info.default, info.allowed, info.resume) == ("int | None", None, ">= 1", "free")


def test_a_comment_above_is_set_off_from_the_one_beside():
    info = describe("train.epochs", resolve_choices=False)
    assert info.description.startswith("length of the training in epochs")
    assert info.description.endswith("; extending a run stretches its schedules from here on")
    assert (info.type, info.default, info.allowed, info.resume) == ("int", 100, ">= 1", "noted")


def test_comment_lines_above_a_field_and_beside_its_closing_line_are_read():
    above = describe("train.samples_per_epoch", resolve_choices=False)
    assert above.description.startswith("None: the train manifest's sample count. Fixed:")
    assert above.type == "int | None" and above.resume == "fixed"
    wrapped = describe("eval.logreg_val_fraction", resolve_choices=False)
    assert wrapped.description.startswith("carved from train when")
    assert wrapped.allowed == ">= 0.0, <= 1.0"


def test_a_fields_description_never_takes_the_previous_fields_comment():
    # train.log_every follows a field with a comment beside it; it must not inherit it
    infos = {i.key: i for i in describe_all(resolve_choices=False)}
    assert infos["train.seed"].description != infos["train.max_steps"].description
    assert set(infos) >= {"meta.paper", "engine.kind", "eval.protocol", "train.tracker.tags"}


def test_explain_prints_a_key_and_its_registry_choices(capsys):
    assert main(["recipes", "explain", "engine.zero_stage"]) == 0
    out = capsys.readouterr().out
    assert "engine.zero_stage" in out and "one of: 1, 2, 3" in out and "must stay as saved" in out


def test_explain_of_a_section_lists_its_keys(capsys):
    assert main(["recipes", "explain", "optim"]) == 0
    out = capsys.readouterr().out
    keys = [line for line in out.splitlines() if not line.startswith(" ")]
    assert "optim.lr" in keys and "optim.name" in keys and all(k.startswith("optim.") for k in keys)


def test_explain_of_an_unknown_key_exits_2_with_a_suggestion(capsys):
    assert main(["recipes", "explain", "train.epoch"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no recipe key 'train.epoch'" in err and "train.epochs" in err


def test_every_recipe_key_is_described():
    # the reference page and `scale recipes explain` read these: a new field needs a comment beside or above it
    bare = [info.key for info in describe_all(resolve_choices=False) if not info.description]
    assert not bare, f"recipe keys without a comment in the schema: {', '.join(bare)}"
