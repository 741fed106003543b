"""Each method kind owns its section of `method` (scale/methods/config.py); the sections of earlier releases that held
other kinds' settings (method.moco: five kinds', method.dino: EsViT's region fields) still load, read as today's, with
one deprecation line per file naming the old and the new keys, and a run saved with them still resumes."""

import pytest
from omegaconf import OmegaConf

from scale import errors
from scale.checkpoint.resume import check_resumable
from scale.config import load_recipe
from scale.config.load import from_dict
from scale.loop.rundir import RunDir
from scale.methods.config import MOCO_KINDS, OLD_MOCO

# method.moco as a run's config.yaml held it before each kind had its own section: every key, defaults included
OLD_MOCO_SECTION = {
    "dim": 256,
    "mlp_dim": 4096,
    "proj_layers": 3,
    "pred_layers": 2,
    "temperature": 0.2,
    "momentum": 0.99,
    "momentum_cosine": True,
    "bn_in_heads": True,
    "bn_batching": "per_view",
    "swav_prototypes": 3000,
    "swav_epsilon": 0.05,
    "swav_temperature": 0.1,
    "swav_freeze_prototypes_steps": 313,
    "sinkhorn_iters": 3,
    "queue_size": 65536,
}


@pytest.fixture
def recipes(tmp_path, monkeypatch):
    """A recipes folder of its own and fresh notices, said by this process (it speaks for the launch)."""
    monkeypatch.setenv("SCALE_RECIPES", str(tmp_path))
    monkeypatch.setattr(errors, "_NOTICES", set())
    for name in ("RANK", "SLURM_PROCID", errors.LAUNCH_MARK):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def notices(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("scale: ")]


def test_the_old_section_list_is_the_one_old_config_files_hold():
    assert list(OLD_MOCO_SECTION) == OLD_MOCO


def test_method_moco_is_read_as_the_kinds_own_section_with_one_line(recipes, capsys):
    (recipes / "row.yaml").write_text(
        "data: {views: {kind: two_view}}\n"
        "method: {kind: simclr, moco: {temperature: 0.5, dim: 64, queue_size: 8}}\n"
        "sources: {method.moco.temperature: [0.5, 'a paper'], method.moco.queue_size: [8, 'unread']}\n"
    )
    cfg = load_recipe("row")
    assert (cfg.method.simclr.temperature, cfg.method.simclr.dim) == (0.5, 64)
    assert cfg.method.mocov2.queue_size == 65536  # simclr never read it: not moved to another kind's section
    assert OmegaConf.to_container(cfg.sources) == {"method.simclr.temperature": [0.5, "a paper"]}
    assert notices(capsys) == [
        f"scale: {recipes / 'row.yaml'}: method.moco.{{temperature,dim}} is deprecated: write "
        "method.simclr.{temperature,dim} (read as such); method.moco.queue_size is not read by method.kind=simclr "
        "(ignored)"
    ]
    load_recipe("row")
    assert notices(capsys) == []  # once per process


def test_the_kind_a_later_file_sets_decides_where_a_base_value_goes(recipes, capsys):
    (recipes / "base.yaml").write_text(
        "data: {views: {kind: two_view}}\nmethod: {kind: mocov3, moco: {momentum: 0.9, swav_temperature: 0.3}}\n"
    )
    (recipes / "byol.yaml").write_text("base: base.yaml\nmethod: {kind: byol}\n")
    assert load_recipe("byol").method.byol.momentum == 0.9
    assert notices(capsys) == [
        f"scale: {recipes / 'base.yaml'}: method.moco.momentum is deprecated: write method.byol.momentum (read as "
        "such); method.moco.swav_temperature is not read by method.kind=byol (ignored)"
    ]
    swav = load_recipe("byol", ["method.kind=swav", "method.moco.temperature=0.7"])
    assert swav.method.swav.temperature == 0.3  # SwAV's own temperature, not the contrastive loss's
    assert notices(capsys) == [
        f"scale: {recipes / 'base.yaml'}: method.moco.momentum is not read by method.kind=swav (ignored); "
        "method.moco.swav_temperature is deprecated: write method.swav.temperature (read as such)",
        "scale: command line: method.moco.temperature is not read by method.kind=swav (ignored)",
    ]


def test_esvit_region_keys_move_out_of_method_dino(recipes, capsys):
    (recipes / "esvit.yaml").write_text("method: {kind: esvit, dino: {teacher_temp: 0.07, region_weight: 0.3}}\n")
    cfg = load_recipe("esvit", ["method.dino.region_from_epoch=5"])
    assert (cfg.method.esvit.region_weight, cfg.method.esvit.region_from_epoch) == (0.3, 5)
    assert cfg.method.dino.teacher_temp == 0.07  # the view loss's settings stay DINO's, which EsViT extends
    assert notices(capsys) == [
        f"scale: {recipes / 'esvit.yaml'}: method.dino.region_weight is deprecated: write method.esvit.region_weight "
        "(read as such)",
        "scale: command line: method.dino.region_from_epoch is deprecated: write method.esvit.region_from_epoch "
        "(read as such)",
    ]


def test_todays_spelling_says_nothing(recipes, capsys):
    (recipes / "row.yaml").write_text("data: {views: {kind: two_view}}\nmethod: {kind: swav, swav: {epsilon: 0.1}}\n")
    assert load_recipe("row").method.swav.epsilon == 0.1
    assert capsys.readouterr().err == ""


def older(cfg) -> dict:
    """`cfg` as a run's config.yaml held it before each kind had its own section."""
    saved = OmegaConf.to_container(cfg)
    method = saved["method"]
    kind = method["kind"]
    moco = dict(OLD_MOCO_SECTION)
    if kind in MOCO_KINDS:
        renamed = {"prototypes": "swav_prototypes", "epsilon": "swav_epsilon", "temperature": "swav_temperature"}
        renamed["freeze_prototypes_steps"] = "swav_freeze_prototypes_steps"
        for key, value in method[kind].items():
            moco[renamed.get(key, key) if kind == "swav" else key] = value
    method["dino"].update(method.pop("esvit"))
    for framework in MOCO_KINDS:
        del method[framework]
    method["moco"] = moco
    return saved


@pytest.mark.parametrize(
    "kind, settings",
    [
        ("simclr", "simclr: {dim: 64, temperature: 0.5, bn_in_heads: false}"),
        ("swav", "swav: {prototypes: 30, temperature: 0.3}"),
        ("esvit", "dino: {out_dim: 1024}, esvit: {region_weight: 0.3}"),
    ],
)
def test_a_run_saved_with_the_old_sections_resumes(recipes, tmp_path, capsys, kind, settings):
    views = "multicrop" if kind == "esvit" else "two_view"
    (recipes / "row.yaml").write_text(f"data: {{views: {{kind: {views}}}}}\nmethod: {{kind: {kind}, {settings}}}\n")
    cfg = load_recipe("row")
    run = RunDir(tmp_path / "run").create()
    run.config.write_text(OmegaConf.to_yaml(OmegaConf.create(older(cfg))))
    (run.checkpoints / "step_000000010").mkdir()
    capsys.readouterr()
    assert OmegaConf.to_container(from_dict(run.read_config(), str(run.config))) == OmegaConf.to_container(cfg)
    assert len(notices(capsys)) == 1  # the saved file's one line
    check_resumable(run, cfg)  # every FIXED field compares equal after the translation
    fixed = {"simclr": "method.simclr.dim=32", "swav": "method.swav.prototypes=31", "esvit": "method.dino.out_dim=512"}
    with pytest.raises(errors.ConfigError, match=fixed[kind].split("=")[0].replace(".", r"\.") + ": "):
        check_resumable(run, load_recipe("row", [fixed[kind]]))
