"""`scale recipes check`: every recipe loads and builds, or names the part it is waiting for; parameter counts
against the papers' rounding; the README lists every recipe."""

from pathlib import Path

import pytest

from scale.cli import main
from scale.config import list_recipes, recipe_name
from scale.recipes.check import check_config, check_recipe, within_rounding
from scale.recipes.provenance import written_keys
from scale.resources import recipes_dir
from tests.helpers_recipes import loaded_recipe

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out

RECIPES = [recipe_name(p) for p in list_recipes()]


@pytest.mark.parametrize("name", RECIPES)
def test_recipe_passes_or_names_what_is_missing(name):
    # check_recipe's checks on the recipe the other every-recipe modules load too (one load per process)
    result = check_config(name, loaded_recipe(name), written_keys(name))
    assert result.ok or result.missing, result.message
    if not result.ok:  # only what is missing: no other failure (a value that differs from its source, ...)
        assert result.message == "needs " + "; ".join(result.missing)


@pytest.mark.parametrize(
    "ours, reported, ok",
    [
        (21.67, 21, True),  # DINO quotes ViT-S/16 rounded down
        (21.67, 22, True),  # MoCo v3 rounded up
        (21.67, 23, False),
        (85.80, 85, True),
        (85.80, 86, True),
        (85.80, 87, False),
        (27.52, 28, True),
        (27.52, 27, True),
        (27.52, 29, False),
        (23.51, 23.5, True),
        (23.51, 23.6, True),
        (23.51, 23.4, False),
    ],
)
def test_within_rounding(ours, reported, ok):
    assert within_rounding(ours, reported) is ok


def _recipe(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def test_wrong_param_count_fails_naming_the_key(tmp_path):
    path = _recipe(tmp_path, "bad", "meta: {paper: dino, reported: {params_m: 50}}\nmodel: {name: vit_small}\n")
    result = check_recipe(path)
    assert not result.ok and "meta.reported.params_m=50" in result.message and "21.67M" in result.message


def test_missing_backbone_and_missing_note_are_named(tmp_path):
    path = _recipe(tmp_path, "net", "model: {name: no_such_net}\n")
    result = check_recipe(path)  # an unregistered backbone fails at load time, naming the file and the choices
    assert not result.ok and "net.yaml: model.name='no_such_net' is not one of: " in result.message
    path = _recipe(tmp_path, "note", "meta: {notes: 'missing: train.init_weights (fine-tune)'}\n")
    result = check_recipe(path)
    assert not result.ok and "train.init_weights (fine-tune)" in result.message


def test_method_options_are_validated_on_the_meta_device(tmp_path):
    path = _recipe(tmp_path, "opt", "model: {name: vit_small}\nmethod: {dino: {loss: l2}}\n")
    result = check_recipe(path)
    assert not result.ok and "method.dino.loss" in result.message


def test_check_command_exits_1_listing_failures(tmp_path, monkeypatch, capsys):
    (tmp_path / "p" / "t").mkdir(parents=True)
    _recipe(tmp_path / "p" / "t", "good", "meta: {reported: {params_m: 21}}\nmodel: {name: vit_small}\n")
    _recipe(tmp_path / "p" / "t", "bad", "model: {name: no_such_net}\n")
    monkeypatch.setenv("SCALE_RECIPES", str(tmp_path))
    assert main(["recipes", "check", "--paper", "p"]) == 1
    out = capsys.readouterr().out
    assert "1 of 2 recipes pass" in out and "FAIL p/t/bad: " in out and "model.name='no_such_net'" in out
    assert main(["recipes", "check", "--table", "nothing"]) == 2  # an unknown filter names the known ones
    assert "--table nothing: no such table; known: t" in capsys.readouterr().err


def test_readme_lists_every_paper_recipe():
    readme = (recipes_dir() / "README.md").read_text()
    papers = [name for name in RECIPES if name.split("/")[0] in ("dino", "mocov3", "esvit", "drloc")]
    missing = [
        name for name in papers if f"| {name.split('/')[1]} |" not in readme or f"`{name.split('/')[-1]}`" not in readme
    ]
    assert not missing, f"recipes/README.md does not list {missing[:5]}"
