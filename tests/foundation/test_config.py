"""Recipes: inheritance, overrides and the error messages of every user mistake."""

import pytest

from scale.cli import main
from scale.config import load_recipe
from scale.errors import UserError


@pytest.fixture
def recipes(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALE_RECIPES", str(tmp_path))
    (tmp_path / "_base").mkdir()
    (tmp_path / "_base" / "dino.yaml").write_text(
        "meta: {paper: dino}\nmethod: {kind: dino}\ntrain: {epochs: 100, global_batch: 1024}\noptim: {lr: 0.0005}\n"
    )
    (tmp_path / "dino").mkdir()
    (tmp_path / "dino" / "vit_s16.yaml").write_text(
        "base: ../_base/dino.yaml\nmeta: {table: table2, row: ViT-S/16}\nmodel: {name: vit_small}\n"
        "train: {epochs: 300}\n"
    )
    return tmp_path


def test_inheritance_child_wins_and_base_fills_in(recipes):
    cfg = load_recipe("dino/vit_s16")
    assert cfg.train.epochs == 300 and cfg.train.global_batch == 1024
    assert cfg.meta.paper == "dino" and cfg.meta.table == "table2" and cfg.meta.name == "dino/vit_s16"
    assert cfg.optim.lr == 0.0005 and cfg.model.name == "vit_small"
    assert cfg.engine.kind == "fsdp2"  # schema default


def test_inheritance_by_recipe_name(recipes):
    (recipes / "dino" / "vit_s16_long.yaml").write_text("base: dino/vit_s16\ntrain: {epochs: 800}\n")
    cfg = load_recipe("dino/vit_s16_long")
    assert cfg.train.epochs == 800 and cfg.model.name == "vit_small"


def test_overrides_are_typed(recipes):
    cfg = load_recipe(
        "dino/vit_s16",
        ["train.epochs=5", "optim.lr=1e-3", "data.views.n_local=[2,4]", "engine.kind=ddp", "train.max_steps=7"],
    )
    assert cfg.train.epochs == 5 and isinstance(cfg.train.epochs, int)
    assert cfg.optim.lr == pytest.approx(1e-3)
    assert list(cfg.data.views.n_local) == [2, 4]
    assert cfg.engine.kind == "ddp" and cfg.train.max_steps == 7


def test_unknown_key_names_key_file_and_closest(recipes):
    (recipes / "bad.yaml").write_text("train:\n  epoch: 3\n")
    with pytest.raises(UserError) as err:
        load_recipe("bad")
    message = str(err.value)
    assert "bad.yaml" in message and "'train.epoch'" in message and "did you mean 'train.epochs'" in message


def test_unknown_section(recipes):
    with pytest.raises(UserError, match=r"unknown key 'engin'.*did you mean 'engine'"):
        load_recipe("dino/vit_s16", ["engin.kind=ddp"])


def test_wrong_type_names_key_expected_type_and_value(recipes):
    (recipes / "typo.yaml").write_text("base: dino/vit_s16\ntrain:\n  epochs: three\n")
    with pytest.raises(UserError) as err:
        load_recipe("typo")
    message = str(err.value)
    assert "typo.yaml" in message and "'train.epochs'" in message and "expected int" in message
    assert "'three'" in message


def test_wrong_type_on_command_line(recipes):
    with pytest.raises(UserError, match=r"command line: 'optim.lr': expected float, got 'fast'"):
        load_recipe("dino/vit_s16", ["optim.lr=fast"])


def test_missing_recipe_and_missing_base_name_the_path(recipes):
    with pytest.raises(UserError, match="recipe not found: 'nope'"):
        load_recipe("nope")
    (recipes / "orphan.yaml").write_text("base: ../_base/missing.yaml\n")
    with pytest.raises(UserError, match="missing.yaml"):
        load_recipe("orphan")


def test_bad_override_syntax(recipes):
    for bad in ["train.epochs", "=3", "train..epochs=3", "1train=2"]:
        with pytest.raises(UserError, match="bad override"):
            load_recipe("dino/vit_s16", [bad])


def test_circular_base(recipes):
    (recipes / "a.yaml").write_text("base: b\n")
    (recipes / "b.yaml").write_text("base: a\n")
    with pytest.raises(UserError, match="circular"):
        load_recipe("a")


def test_cli_exit_code_2_without_traceback(recipes, capsys):
    assert main(["recipes", "show", "dino/vit_s16", "train.epohcs=3"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'train.epochs'" in err and "Traceback" not in err


def test_cli_list_json_and_show(recipes, capsys):
    import json

    assert main(["recipes", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows == [
        {
            "name": "dino/vit_s16",
            "paper": "dino",
            "table": "table2",
            "row": "ViT-S/16",
            "model": "vit_small",
            "method": "dino",
            "engine": "fsdp2",
            "global_batch": 1024,
            "epochs": 300,
        }
    ]
    assert main(["recipes", "show", "dino/vit_s16", "train.epochs=9"]) == 0
    assert "epochs: 9" in capsys.readouterr().out
