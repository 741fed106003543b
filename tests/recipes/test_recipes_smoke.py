"""The smoke shrinker keeps what selects a code path and shrinks only sizes; every runnable recipe trains a few
steps on 2 gloo ranks (by default the fewest recipes that together bring every code path, see
tests/recipes/conftest.py; all with SCALE_ALL_RECIPES=1). The shrunk recipes train through `scale train` with its
ranks forked from the launcher (tests/helpers_run.py), as the other end-to-end tests of training do; the MoCo v2
test runs smoke_run itself, as `scale recipes check --smoke` does, its ranks each a new interpreter."""

import pytest
from omegaconf import OmegaConf

from scale.config import list_recipes, recipe_name
from scale.config.schema import Recipe
from scale.errors import UserError
from scale.recipes.check import missing_pieces
from scale.recipes.smoke import (
    PER_RANK_BATCH,
    RANKS,
    smoke_overrides,
    smoke_run,
    tiny_model_name,
    write_smoke_recipe,
)
from tests.helpers_recipes import loaded_recipe
from tests.helpers_run import run_train
from tests.recipes.conftest import smoke_params, smoke_skips

pytestmark = pytest.mark.slow  # multi-process or end-to-end: `make test-fast` leaves it out

RECIPES = [recipe_name(p) for p in list_recipes()]


@pytest.mark.parametrize("name", RECIPES)
def test_smoke_shrink_keeps_code_path(name, tmp_path):
    cfg = loaded_recipe(name)  # read-only: smoke_overrides writing to its input raises
    if missing_pieces(cfg):
        with pytest.raises(UserError, match="cannot smoke-run, needs"):
            smoke_overrides(cfg, tmp_path)
        return
    before = repr(OmegaConf.to_container(cfg))  # repr: 1, 1.0 and True differ
    small = smoke_overrides(cfg, tmp_path)
    assert repr(OmegaConf.to_container(cfg)) == before  # the input is not changed (nor made writable and changed)
    assert OmegaConf.is_readonly(cfg) and not OmegaConf.is_readonly(small)
    assert small.model.name == tiny_model_name(cfg.model.name)
    for key in (
        "method.kind",
        "method.dino.teacher",
        "method.dino.centering",
        "method.dino.loss",
        "method.dino.predictor",
        "method.mocov3.bn_in_heads",
        "method.mocov3.pred_layers",
        "method.simclr.bn_in_heads",
        "method.byol.bn_in_heads",
        "method.drloc.mode",
        "method.drloc.every_block",
        "method.drloc.exhaustive",
        "model.pos_embed",
        "model.pooling",
        "model.final_norm",
        "model.frozen_patch_embed",
        "model.window_size",
        "model.bn_mlp",
        "engine.kind",
        "engine.activation_checkpointing",
        "data.views.kind",
        "optim.name",
    ):
        assert OmegaConf.select(small, key) == OmegaConf.select(cfg, key), key
    assert [n > 0 for n in small.data.views.n_local] == [n > 0 for n in cfg.data.views.n_local]
    assert (small.method.esvit.region_from_epoch > 0) == (cfg.method.esvit.region_from_epoch > 0)
    assert small.engine.precision != "fp16"
    assert small.train.global_batch == PER_RANK_BATCH * RANKS * cfg.engine.grad_accum
    assert small.data.train == str(tmp_path / "train") and small.meta.devices == RANKS
    assert max(small.data.views.global_size, *small.data.views.local_sizes) <= 64
    assert small.method.dino.out_dim <= 64 and small.method.mocov3.mlp_dim <= 32
    # still a valid recipe: a copy typed by the schema, so each value smoke_overrides assigned was validated as it
    # was assigned (a wrong type or an unknown key raised there)
    assert OmegaConf.get_type(small) is Recipe


@pytest.mark.parametrize("name", smoke_params())
def test_smoke_run(name, smoke_data, tmp_path):
    if name in smoke_skips():
        pytest.skip(smoke_skips()[name])
    shrunk, run_dir = write_smoke_recipe(name, tmp_path, smoke_data)
    out = run_train(smoke_data, run_dir, [], nproc=RANKS, recipe=str(shrunk))
    assert out.returncode == 0, out.stderr[-3000:]


def test_mocov2_recipe_smoke_runs_in_fp32(smoke_data, tmp_path):
    """DINO Table 7's MoCo v2 row on 2 ranks (keys gathered into the queue) in fp32: there autocast does not cast
    the queue into a copy, so backward needs the queue itself as it was when the logits were computed."""
    assert smoke_run("dino/table7/row8_mocov2", tmp_path, smoke_data, overrides=["engine.precision=fp32"]) == 0
