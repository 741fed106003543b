"""`scale models table`: JSON rows for the requested models; bad specs are user errors."""

import json

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
