"""Provenance: every paper recipe's stated values match their recorded sources; `scale recipes check` fails a
planted wrong value and an unsourced one, naming recipe, key, value and source; `show --sources` lists assumptions."""

import json
from pathlib import Path

from scale.cli import main
from scale.config import load_recipe
from scale.recipes.check import check_recipe
from scale.recipes.provenance import stated_keys, written_keys
from scale.resources import recipes_dir

DINO_BASE = recipes_dir() / "_base" / "dino.yaml"
# every recipe of the tree passes its sources: tests/recipes/test_recipes_check.py (check_recipe includes them)


def _row(tmp_path: Path, text: str) -> Path:
    (tmp_path / "dino" / "t").mkdir(parents=True, exist_ok=True)
    path = tmp_path / "dino" / "t" / "row.yaml"
    path.write_text(f"base: {DINO_BASE}\nmeta: {{paper: dino, reported: {{params_m: 21}}}}\n{text}")
    return path


def test_the_dino_base_row_passes(tmp_path):
    result = check_recipe(_row(tmp_path, ""))
    assert result.ok, result.message


def test_planted_wrong_value_fails_naming_key_value_and_source(tmp_path, monkeypatch, capsys):
    path = _row(tmp_path, "optim: {min_lr: 2.0e-6}\n")
    result = check_recipe(path)
    assert not result.ok
    # the row changes the base's sourced value without a source of its own: named with the row's file and line
    assert f"optim.min_lr=2e-06 is set in {path}:3 without a source" in result.message
    monkeypatch.setenv("SCALE_RECIPES", str(tmp_path))
    assert main(["recipes", "check", "--paper", "dino"]) == 1
    assert "FAIL dino/t/row: optim.min_lr=2e-06 is set in" in capsys.readouterr().out


def test_a_value_set_after_its_source_carries_its_own_origin(capsys):
    """`recipes show dino/table2/vit_s16 optim.lr=0.001 --sources` said `0.001 | DINO Sec. 3.2: lr = 0.0005 ...`;
    the demo recipe's own values showed the base's paper sources (15 of its 40), in the card and the trackers too."""
    from scale.recipes.provenance import source_table

    rows = {r["key"]: r for r in source_table(load_recipe("dino/table2/vit_s16", ["optim.lr=0.001"]))}
    assert rows["optim.lr"]["value"] == 0.001 and rows["optim.lr"]["source"] == "set in command line"
    assert rows["optim.lr"]["kind"] == "set" and not rows["optim.min_lr"]["source"].startswith("set in")
    demo = load_recipe("demo/dino_tiny")
    value, origin = demo.sources["optim.min_lr"]
    where, line = origin.removeprefix("set in ").rsplit(":", 1)
    assert value == demo.optim.min_lr and where.endswith("demo/dino_tiny.yaml")
    assert "min_lr" in Path(where).read_text().splitlines()[int(line) - 1]
    assert load_recipe("dino/table2/vit_s16").sources["optim.lr"][1].startswith("DINO")  # unchanged: kept


def test_unsourced_value_fails(tmp_path):
    result = check_recipe(_row(tmp_path, "data: {views: {blur_p: [1.0, 0.5]}}\n"))
    assert not result.ok and "data.views.blur_p=[1.0, 0.5] has no source" in result.message


def test_a_row_that_cites_its_own_value_passes(tmp_path):
    text = "optim: {min_lr: 2.0e-6}\nsources:\n  optim.min_lr: [2.0e-6, 'the released ViT-B/16 args']\n"
    assert check_recipe(_row(tmp_path, text)).ok


def test_malformed_and_dangling_entries_fail(tmp_path):
    bad = check_recipe(_row(tmp_path, "sources: {optim.lr: 5.0e-4}\n"))
    assert not bad.ok and "sources.optim.lr: expected [value, source]" in bad.message
    dangling = check_recipe(_row(tmp_path, "sources: {optim.no_such_key: [1, 'x']}\n"))
    assert not dangling.ok and "sources.optim.no_such_key names no key of the recipe" in dangling.message


def test_stated_keys_follow_the_method_and_the_protocol():
    moco = load_recipe("mocov3/table1/vit_b")
    keys = stated_keys(moco)
    assert "method.mocov3.temperature" in keys and "eval.linear_batch" in keys
    assert "method.dino.out_dim" not in keys and "eval.knn_k" not in keys  # MoCo v3 has no k-NN protocol
    assert "eval.linear_n_last_blocks" not in keys  # the pooled feature has no blocks to choose
    drloc = stated_keys(load_recipe("drloc/table3/t2t_cifar10_drloc"))
    assert {"method.drloc.l1_reduction", "method.drloc.pool", "method.drloc.weight_schedule"} <= set(drloc)
    assert {"optim.lr_step", "optim.lr_lag", "optim.warmup_prefix", "optim.lr_schedule_epochs"} <= set(drloc)
    assert "optim.lr_schedule_epochs" not in keys  # unset: the schedule spans train.epochs
    assert "data.views.eval_interpolation" in keys  # every probe's test view (main_lincls.py: bilinear)
    # the fine-tuning rows' sampler and test view (DeiT main.py, MoCo v3 transfer/datasets.py) are sourced
    for row in (
        "dino/table6/vit_s16_cifar10",
        "mocov3/table5/vit_b_pets_mocov3",
        "mocov3/table5/vit_h_pets_random_init",
    ):
        finetune = stated_keys(load_recipe(row), written_keys(row))
        assert {"data.repeated_aug", "data.views.eval_interpolation", "data.views.random_erase_p"} <= set(finetune)


def test_a_schedule_longer_than_training_needs_a_source(tmp_path):
    result = check_recipe(_row(tmp_path, "optim: {lr_schedule_epochs: 300}\n"))
    assert not result.ok and "optim.lr_schedule_epochs=300 has no source" in result.message


def test_show_sources_lists_assumptions(capsys):
    assert main(["recipes", "show", "dino/table2/vit_s16", "--sources", "--json"]) == 0
    rows = {r["key"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["optim.lr"]["kind"] == "source" and "DINO Sec. 3.2" in rows["optim.lr"]["source"]
    assert rows["eval.linear_lrs"]["kind"] == "assumption"
    assert main(["recipes", "show", "dino/table2/vit_s16", "--sources"]) == 0
    assert "ASSUMPTION eval.linear_lrs" in capsys.readouterr().out
