"""Recipes: inheritance, overrides and the error messages of every user mistake."""

import pytest
from omegaconf import OmegaConf

from scale.checkpoint.resume import check_resumable
from scale.cli import main
from scale.config import load_recipe
from scale.config.validate import check_launch
from scale.errors import ConfigError, UserError
from scale.loop.rundir import RunDir


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
        [
            "train.epochs=5",
            "optim.lr=1e-3",
            "data.views.local_sizes=[96,64]",
            "data.views.n_local=[2,4]",
            "engine.kind=ddp",
            "train.max_steps=7",
        ],
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
    with pytest.raises(UserError, match="recipe not found: 'nope'.*; `scale recipes list` lists them$"):
        load_recipe("nope")
    with pytest.raises(UserError, match=r"recipe not found: 'dino/vit_s61'.*; did you mean 'dino/vit_s16'\?$"):
        load_recipe("dino/vit_s61")
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


# --- the whole recipe is checked at load time: closed choices, ranges, cross-field rules ---


def test_choice_typo_names_source_key_value_and_choices(recipes):
    with pytest.raises(ConfigError) as err:
        load_recipe("dino/vit_s16", ["engine.kind=fsdp"])
    message = str(err.value)
    assert message.startswith("command line: engine.kind='fsdp' is not one of: ddp, fsdp2, deepspeed")
    assert "did you mean 'fsdp2'" in message


def test_choice_typo_in_a_recipe_file_names_the_file(recipes):
    (recipes / "typo.yaml").write_text("base: dino/vit_s16\noptim:\n  name: adamw2\nmethod:\n  kind: dino\n")
    with pytest.raises(ConfigError, match=r"typo\.yaml: optim\.name='adamw2' is not one of: adamw, lars, lamb, sgd"):
        load_recipe("typo")


@pytest.mark.parametrize(
    "override",
    [
        "method.kind=moco",
        "engine.precision=fp8",
        "engine.activation_checkpointing=selective_typo",
        "optim.lr_scaling=cubic",
        "optim.clip_mode=norm",
        "data.backend=ffcv",
        "data.views.kind=multi",
        "model.pos_embed=rope",
        "model.pooling=max",
        "model.weight_init=xavier",
        "optim.name=adam",
        "engine.zero_stage=4",
        "data.mode=stream",
        "data.views.interpolation=nearest",
        "method.drloc.mode=l2",
        "method.drloc.pool=max",
        "method.dino.teacher=frozen",
        "method.dino.centering=none",
        "method.mocov3.bn_batching=shared",
    ],
)
def test_every_choice_field_is_a_closed_set(recipes, override):
    key, value = override.split("=")
    with pytest.raises(ConfigError, match=rf"command line: {key}='?{value}'? is not one of: "):
        load_recipe("dino/vit_s16", [override])


def test_model_name_is_checked_against_the_registry(recipes):
    with pytest.raises(ConfigError, match=r"model\.name='vit_smal' is not one of: .*vit_small.*did you mean"):
        load_recipe("dino/vit_s16", ["model.name=vit_smal"])
    assert load_recipe("dino/vit_s16", ["model.name=swin_tiny"]).model.name == "swin_tiny"


@pytest.mark.parametrize(
    "override, bound",
    [
        ("train.epochs=0", "at least 1"),
        ("train.max_steps=-1", "at least 1"),
        ("train.global_batch=0", "at least 1"),
        ("train.log_every=0", "at least 1"),
        ("train.ckpt_every_steps=-5", "at least 0"),
        ("data.workers=-1", "at least 0"),
        ("engine.grad_accum=0", "at least 1"),
        ("data.views.n_local=[2,-1]", "at least 0"),
        ("data.views.flip_p=1.5", "between 0.0 and 1.0"),
    ],
)
def test_counts_and_sizes_are_range_checked(recipes, override, bound):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"command line: {key}=.* must be {bound}"):
        load_recipe("dino/vit_s16", [override])


def test_views_must_suit_the_method(recipes):
    with pytest.raises(ConfigError, match=r"data\.views\.kind='multicrop': method\.kind=drloc trains on views"):
        load_recipe("dino/vit_s16", ["method.kind=drloc"])
    with pytest.raises(ConfigError, match=r"data\.views\.n_global=3: method\.kind=mocov3 needs 2 global views"):
        load_recipe("dino/vit_s16", ["method.kind=mocov3", "data.views.n_global=3"])
    with pytest.raises(ConfigError, match=r"data\.views\.n_local=\[2, 2\]: needs one count per entry"):
        load_recipe("dino/vit_s16", ["data.views.n_local=[2,2]"])
    assert load_recipe("dino/vit_s16", ["method.kind=mocov3", "data.views.kind=two_view"]).method.kind == "mocov3"


def test_compile_is_refused_under_zero3_only(recipes, capsys):
    zero3 = ["engine.kind=deepspeed", "engine.zero_stage=3", "engine.compile=true"]
    with pytest.raises(ConfigError, match=r"command line: engine\.compile=True: needs engine\.zero_stage 1 or 2"):
        load_recipe("dino/vit_s16", zero3)
    assert main(["recipes", "show", "dino/vit_s16", *zero3]) == 2
    assert "engine.compile" in capsys.readouterr().err
    assert load_recipe("dino/vit_s16", [*zero3[:1], "engine.zero_stage=2", zero3[2]]).engine.compile
    assert load_recipe("dino/vit_s16", ["engine.kind=fsdp2", "engine.compile=true"]).engine.compile


def test_a_compile_mode_needs_inductor(recipes):
    mode = ["engine.compile=true", "engine.compile_mode=reduce-overhead"]
    with pytest.raises(ConfigError, match=r"engine\.compile_mode='reduce-overhead': is inductor's"):
        load_recipe("dino/vit_s16", [*mode, "engine.compile_backend=aot_eager"])
    assert load_recipe("dino/vit_s16", mode).engine.compile_mode == "reduce-overhead"


def test_override_value_that_is_not_yaml(recipes):
    for bad in ["train.max_steps=[1,", 'meta.notes="open', "meta.notes=@x"]:
        with pytest.raises(ConfigError, match=r"command line: override '.*': the value is not valid YAML"):
            load_recipe("dino/vit_s16", [bad])


def test_recipe_file_that_is_not_text(recipes):
    (recipes / "binary.yaml").write_bytes(b"train:\n  epochs: \xff\xfe\x00\n")
    with pytest.raises(ConfigError, match=r"binary\.yaml: not a text file"):
        load_recipe("binary")


def test_launch_rules(recipes, tmp_path):
    cfg = load_recipe("dino/vit_s16", [f"data.train={tmp_path}", "train.global_batch=12", "engine.grad_accum=2"])
    check_launch(cfg, world_size=3)  # 12 = 3 ranks x 2 accumulation steps x 2 images
    with pytest.raises(ConfigError, match=r"train\.global_batch=12 is not divisible by 4 ranks x"):
        check_launch(cfg, world_size=4)
    cfg.data.train = str(tmp_path / "missing")
    with pytest.raises(ConfigError, match=r"data\.train=.*missing: no such directory"):
        check_launch(cfg, world_size=1)


def test_bad_choice_fails_before_the_run_directory_is_made(recipes, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "dino/vit_s16", "engine.kind=fsdp", "--run-dir", str(run), "--nproc", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("scale: error:") == 1 and "engine.kind='fsdp'" in err and "Traceback" not in err
    assert not run.exists()


def test_config_errors_are_printed_by_rank_0_only(recipes, monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    assert main(["recipes", "show", "dino/vit_s16", "engine.kind=fsdp"]) == 2
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("RANK", "0")
    assert main(["recipes", "show", "dino/vit_s16", "engine.kind=fsdp"]) == 2
    assert "engine.kind='fsdp'" in capsys.readouterr().err


def test_a_run_without_checkpoint_takes_any_recipe(recipes, tmp_path):
    run = RunDir(tmp_path / "run").create()
    run.write_config(load_recipe("dino/vit_s16", ["train.seed=1"]))  # a start that failed after writing it
    corrected = load_recipe("dino/vit_s16", ["train.seed=0"])
    check_resumable(run, corrected)
    (run.checkpoints / "step_000000010").mkdir()
    with pytest.raises(ConfigError, match=r"train\.seed: 1 -> 0"):
        check_resumable(run, corrected)


def test_unwritable_run_directory_is_one_clear_error(recipes, tmp_path, capsys):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(ConfigError, match=r"run directory .*a_file/run: cannot write there"):
        RunDir(blocker / "run").check_writable()
    RunDir(tmp_path / "ok").check_writable()
    assert (tmp_path / "ok" / "checkpoints").is_dir() and not list((tmp_path / "ok").glob(".write-probe*"))


def test_train_checks_the_launch_before_spawning(recipes, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "dino/vit_s16", "train.global_batch=3", "--run-dir", str(run), "--nproc", "2"]) == 2
    assert "train.global_batch=3 is not divisible by 2 ranks" in capsys.readouterr().err


# rows of the tree that share bases, restate a base's sourced value (demo), with the
# overrides other tests load them with
KEPT_MERGE_LOADS = [
    ("dino/table2/vit_s16", []),
    ("dino/table2/vit_s16", ["optim.lr=0.001", "engine.precision=bf16"]),
    ("dino/table2/vit_b16", []),
    ("demo/dino_tiny", []),
    ("mocov3/table1/vit_bn_l7", ["engine.activation_checkpointing=full"]),
    ("esvit/table1/swin_b_w7_lvlr", []),
    ("drloc/table3/cvt_flowers102_drloc", []),
    ("drloc/table3/swin_cifar100_baseline", []),
]


def test_a_kept_merge_of_a_chain_loads_what_merging_it_again_does(monkeypatch):
    """load_recipe keeps the merge of a chain's files it merged twice and copies it on the next load
    (scale.config.load._merge_layers): the config, its `sources` (restated values named file:line) byte for byte."""
    import scale.config.load as load

    monkeypatch.setattr(load, "_kept", type(load._kept)())
    monkeypatch.setattr(load, "_seen", set())
    with monkeypatch.context() as merging:
        merging.setattr(load, "_keep", lambda *args: None)
        fresh = [OmegaConf.to_yaml(load_recipe(name, overrides)) for name, overrides in KEPT_MERGE_LOADS]
    for _ in range(2):  # seen, then kept
        [load_recipe(name, overrides) for name, overrides in KEPT_MERGE_LOADS]
    assert len(load._kept) >= len({name for name, _ in KEPT_MERGE_LOADS})
    for (name, overrides), expected in zip(KEPT_MERGE_LOADS, fresh, strict=True):
        assert OmegaConf.to_yaml(load_recipe(name, overrides)) == expected, name


def test_a_kept_merge_follows_its_files(recipes):
    """A base edited after it was kept is merged again (its text is in the key): its new value, the new line of a
    value a row restates, and a value that does not fit still names the file."""
    row = "base: ../_base/dino.yaml\nmodel: {name: vit_small}\noptim: {lr: 0.001}\n"
    (recipes / "dino" / "row.yaml").write_text(row)
    sourced = "sources: {optim.lr: [0.0005, 'DINO Sec. 4.1']}\n"
    base = recipes / "_base" / "dino.yaml"
    base.write_text(base.read_text() + sourced)
    for _ in range(3):
        cfg = load_recipe("dino/row")
    assert cfg.sources["optim.lr"] == [0.001, f"set in {recipes / 'dino' / 'row.yaml'}:3"]
    assert cfg.train.global_batch == 1024
    (recipes / "dino" / "row.yaml").write_text("# the row\n" + row)  # the same values, a line lower
    assert load_recipe("dino/row").sources["optim.lr"] == [0.001, f"set in {recipes / 'dino' / 'row.yaml'}:4"]
    base.write_text(base.read_text().replace("global_batch: 1024", "global_batch: 512"))
    assert load_recipe("dino/row").train.global_batch == 512
    (recipes / "dino" / "row.yaml").write_text(row + "train: {epochs: three}\n")
    with pytest.raises(UserError, match=r"row.yaml: 'train.epochs': expected int, got 'three'"):
        load_recipe("dino/row")
