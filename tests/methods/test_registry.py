"""The method registry: every kind that registry.KINDS declares is one Method class of scale/methods/<kind>.py and
nothing else is, each kind has its own settings section, the schema's choices are the registry's, every kind builds,
and the old `method.kind=mocov3` +
`method.moco.variant` spelling still loads (recipes, the command line, a run directory's config.yaml) with one
deprecation notice."""

import pytest
from omegaconf import OmegaConf

from scale import errors
from scale.checkpoint.resume import check_resumable
from scale.config import load_recipe
from scale.config.load import from_dict
from scale.config.schema import Recipe
from scale.config.validate import schema_rules
from scale.loop.rundir import RunDir
from scale.methods import build_method, has_class_head
from scale.methods.base import Method
from scale.methods.config import SECTION_TYPES, method_sections
from scale.methods.registry import KINDS, kinds, method_class, methods
from scale.recipes.provenance import PER_METHOD

FRAMEWORKS = ("mocov3", "mocov2", "simclr", "byol", "swav")  # the kinds that were method.moco.variant values


def rule(dotted: str) -> dict:
    return dict(schema_rules(Recipe))[dotted]


def test_each_kind_is_one_class_that_names_itself():
    assert set(kinds()) >= {"dino", "esvit", "drloc", "supervised", *FRAMEWORKS}
    assert len({id(cls) for cls in methods().values()}) == len(kinds())
    assert all(cls.kind == kind and issubclass(cls, Method) for kind, cls in methods().items())
    assert [kind for kind in kinds() if method_class(kind).classifies] == ["drloc", "supervised"]


def test_each_kind_owns_one_section_and_reads_those_of_the_kind_it_extends():
    assert set(SECTION_TYPES) == set(kinds())  # method.<kind> for each kind, and no section shared by several
    assert len(set(SECTION_TYPES.values())) == len(kinds())
    for kind, cls in methods().items():
        extends = KINDS[kind].extends
        parent = cls.__mro__[1]  # the class it extends: Method, or another kind's class
        assert extends == (parent.kind if parent is not Method else None), kind
        assert method_sections(kind) == (kind, *(method_sections(extends) if extends else ()))


def test_a_second_class_with_a_taken_kind_is_refused():
    with pytest.raises(TypeError, match="method kind 'simclr' is declared by both SimCLR and Impostor"):

        class Impostor(Method):
            kind = "simclr"

            def loss(self, batch, ctx):
                raise AssertionError

    assert method_class("simclr").__name__ == "SimCLR"


def test_a_class_with_an_undeclared_kind_is_refused():
    with pytest.raises(TypeError, match="method kind 'novel' of Novel is not declared"):

        class Novel(Method):
            kind = "novel"

            def loss(self, batch, ctx):
                raise AssertionError


def test_the_schema_choices_are_the_registry():
    choices = rule("method.kind")["choices"]
    assert list(choices) == kinds()
    view_kinds = rule("data.views.kind")["choices"]
    for cls in methods().values():  # each declares views the data section can make
        assert cls.views and set(cls.views) <= set(view_kinds)


def test_every_kind_has_the_keys_its_recipes_source():
    assert set(PER_METHOD) == set(kinds())


def tiny(kind: str):
    cfg = OmegaConf.structured(Recipe)
    cfg.method.kind = kind
    cfg.model.name, cfg.model.img_size, cfg.data.num_classes = "vit_nano", 32, 4
    cfg.method.dino.out_dim, cfg.method.dino.hidden_dim, cfg.method.dino.bottleneck_dim = 64, 32, 16
    for framework in FRAMEWORKS:
        cfg.method[framework].dim, cfg.method[framework].mlp_dim = 16, 32
    cfg.method.swav.prototypes, cfg.method.mocov2.queue_size = 8, 16
    cfg.method.drloc.hidden_dim = 32
    return cfg


@pytest.mark.parametrize("kind", kinds())
def test_every_kind_builds_on_a_tiny_config(kind):
    method = build_method(tiny(kind), 10, 100)
    assert type(method) is method_class(kind)
    assert sum(p.numel() for p in method.student.parameters()) > 0
    assert has_class_head(tiny(kind)) == method.classifies
    # the collapse alarm watches the entropy of a teacher distribution where there is one
    assert method.teacher_classes == (64 if kind in ("dino", "esvit") else None)


@pytest.fixture
def recipes(tmp_path, monkeypatch):
    """An old-style MoCo v3 base and a row that picks its framework with method.moco.variant; fresh notices."""
    monkeypatch.setenv("SCALE_RECIPES", str(tmp_path))
    monkeypatch.setattr(errors, "_NOTICES", set())
    for name in ("RANK", "SLURM_PROCID", errors.LAUNCH_MARK):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "base.yaml").write_text(
        "data: {views: {kind: two_view}}\nmethod: {kind: mocov3, moco: {variant: mocov3, temperature: 0.2}}\n"
    )
    (tmp_path / "row.yaml").write_text("base: base.yaml\nmethod: {moco: {variant: simclr}}\n")
    return tmp_path


def test_old_spelling_maps_to_the_kind_with_one_notice(recipes, capsys):
    cfg = load_recipe("row")
    assert cfg.method.kind == "simclr" and cfg.method.simclr.temperature == 0.2 and "moco" not in cfg.method
    err = capsys.readouterr().err
    assert err.count("variant is deprecated") == 2  # one per file that spells it
    assert f"{recipes / 'row.yaml'}: method.moco.variant is deprecated: write method.kind=simclr" in err
    assert f"{recipes / 'base.yaml'}: method.moco.variant is deprecated: write method.kind=mocov3" in err
    load_recipe("row")
    assert capsys.readouterr().err == ""  # once per process
    assert load_recipe("row", ["method.moco.variant=byol"]).method.kind == "byol"
    assert capsys.readouterr().err.count("command line: method.moco.variant is deprecated") == 1
    assert load_recipe("row", ["method.kind=dino", "data.views.kind=multicrop"]).method.kind == "dino"


def test_only_the_process_that_speaks_for_the_launch_says_it(recipes, monkeypatch, capsys):
    monkeypatch.setenv("RANK", "1")
    assert load_recipe("row").method.kind == "simclr"
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv(errors.LAUNCH_MARK, "1")  # a rank that `--nproc` spawned: its launcher said it
    assert load_recipe("row").method.kind == "simclr"
    assert capsys.readouterr().err == ""


def test_a_run_saved_with_the_old_spelling_resumes(recipes, tmp_path):
    run = RunDir(tmp_path / "run").create()
    saved = OmegaConf.to_container(load_recipe("row"))
    saved["method"]["kind"], saved["method"]["moco"] = "mocov3", {"variant": "simclr"}  # as an older scale wrote it
    run.config.write_text(OmegaConf.to_yaml(OmegaConf.create(saved)))
    (run.checkpoints / "step_000000010").mkdir()
    assert from_dict(run.read_config(), str(run.config)).method.kind == "simclr"
    check_resumable(run, load_recipe("row"))  # method.kind is FIXED: compared after the mapping
    with pytest.raises(errors.ConfigError, match=r"method\.kind: 'simclr' -> 'byol'"):
        check_resumable(run, load_recipe("row", ["method.kind=byol"]))
