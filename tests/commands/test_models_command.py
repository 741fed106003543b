"""`scale models table`: JSON rows for the requested models; bad specs are user errors."""

import json
from dataclasses import replace

from scale.cli import main


def test_models_table_json(capsys):
    assert main(["models", "table", "--json", "--models", "vit_nano,resnet_nano"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["model"] for r in rows] == ["vit_nano", "resnet_nano"]
    assert rows[0]["global_tokens"] == "28x28" and rows[0]["local_tokens"] == "12x12"
    assert rows[0]["params_M"] > 0 and rows[0]["global_GMACs"] > rows[0]["local_GMACs"] > 0


def test_models_table_human_readable(capsys):
    assert main(["models", "table", "--models", "swin_nano/w14"]) == 0
    assert "swin_nano/w14" in capsys.readouterr().out


def test_bad_model_spec_is_a_user_error(capsys):
    assert main(["models", "table", "--models", "vit_small/x9"]) == 2
    assert "vit_small/x9" in capsys.readouterr().err
    assert main(["models", "table", "--models", "vit_enormous"]) == 2
    assert "unknown backbone" in capsys.readouterr().err


def test_models_table_builds_patch_5_at_a_multiple_of_5(capsys):
    """DINO Fig. 5's ViT-S/5 does not accept 224 px: the row is built at 225 (global) and 95 px (local) and says so."""
    assert main(["models", "table", "--json", "--models", "vit_small/5"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["global_px"], row["global_tokens"]) == (225, "45x45")
    assert (row["local_px"], row["local_tokens"]) == (95, "19x19")


def test_one_row_per_backbone_however_spelt():
    """A default left unset (patch 16), a name that spells an option (vit_bn_ = model.bn_mlp) and the heads a
    family has anyway are one backbone: one row, whose recipe count adds them up."""
    from scale.models.table import build, parse_spec, signature

    def sig(spec: str, **options):
        cfg, model = build(replace(parse_spec(spec), **options))
        return signature(cfg, model)

    assert sig("vit_small") == sig("vit_small/16") == sig("vit_small/16/h6")
    assert sig("vit_bn_small/16") == sig("vit_small/16", bn_mlp=True)
    assert (
        len({sig("vit_small/16"), sig("vit_small/8"), sig("vit_small/16/h12"), sig("vit_small/16", pooling="avg")}) == 4
    )


def test_a_forward_is_counted_once_for_backbones_that_compute_the_same():
    from scale.models.table import describe, parse_spec

    counted: dict = {}
    learned = describe(parse_spec("vit_nano/16"), None, counted)
    sincos = describe(replace(parse_spec("vit_nano/16"), pos_embed="sincos"), None, counted)
    assert len(counted) == 2 and sincos["global_GMACs"] == learned["global_GMACs"]  # 224 and 96 px, once each
    assert sincos["params_M"] < learned["params_M"]  # a buffer, not a parameter
    w7, w14 = (describe(parse_spec(spec), None, counted) for spec in ("swin_nano", "swin_nano/w14"))
    assert len(counted) == 6 and w14["global_GMACs"] > w7["global_GMACs"]  # the window shapes the attention


def test_recipes_model_sections_read_as_the_loader_reads_them():
    from scale.config import list_recipes, load_recipe, recipe_name
    from scale.models.table import recipe_models

    models = dict(recipe_models())
    assert len(models) == len(list_recipes())
    for path in list_recipes()[::25]:  # a dozen across the papers through the full loader
        loaded = load_recipe(str(path)).model
        assert {k: getattr(models[recipe_name(path)], k) for k in loaded} == dict(loaded)


def test_rows_print_as_they_are_counted(monkeypatch, capsys):
    import scale.models.table

    def rows(specs):
        counts = {"params_M": 1.0, "global_GMACs": 1.0, "local_GMACs": 0.1, "global_px": 224, "local_px": 96}
        yield {"model": "vit_nano", **counts, "global_tokens": "28x28", "local_tokens": "12x12", "recipes": ["a"]}
        raise KeyboardInterrupt  # the next backbone is still being counted

    monkeypatch.setattr(scale.models.table, "table", rows)
    assert main(["models", "table"]) == 130
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["model", "params", "(M)"] and out[1].startswith("vit_nano ")
