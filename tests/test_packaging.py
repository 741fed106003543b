"""scale as a package: the recipes and the Slurm template ship inside it and are found through importlib.resources
($SCALE_RECIPES replaces the recipe tree), and a library from an extra is imported only where it is needed, failing
with one message naming the extra (exit 2 from the CLI). That the wheel holds every file of scale/ is checked where
the wheel is built once for CI, in tools/test-wheel (`make test-wheel`)."""

import json
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import pytest
import setuptools

import scale
from scale.cli import main
from scale.config import list_recipes, load_recipe, recipe_name
from scale.extras import MissingExtra, require
from scale.resources import recipes_dir, slurm_template

REPO = Path(__file__).resolve().parents[1]
PACKAGE = Path(scale.__file__).parent
# modules that need an extra by design: importing them without it is the MissingExtra naming that extra
EXTRA_MODULES = {
    "scale.report": "viz",
    "scale.viz.figures": "viz",
    "scale.viz.correspondence_picture": "viz",
    "scale.eval.davis_metrics": "eval",
    "scale.eval.video_segmentation": "eval",  # scores with davis_metrics
    "scale.demo": "viz",  # `scale demo` asks for the whole demo extra before importing it
}
# DALI's graph and loader are imported only after scale.data.dali.require_dali() has named the extra
AFTER_REQUIRE = {"scale.data.dali.pipeline", "scale.data.dali.loader"}
BLOCKED = ["sklearn", "skimage", "matplotlib", "wandb", "mlflow", "deepspeed", "nvidia.dali"]


def test_shipped_recipes_and_template_are_package_resources(monkeypatch):
    monkeypatch.delenv("SCALE_RECIPES", raising=False)
    shipped = Path(str(files("scale"))) / "share"
    assert recipes_dir() == shipped / "recipes" and slurm_template() == shipped / "slurm" / "train.sbatch.j2"
    assert slurm_template().is_file() and (recipes_dir() / "README.md").is_file()
    names = [recipe_name(p) for p in list_recipes()]
    assert "demo/dino_tiny" in names and "dino/table2/vit_s16" in names and len(names) > 300
    assert load_recipe("demo/dino_tiny").meta.name == "demo/dino_tiny"
    # the checkout's recipes/ and slurm/ are the same files, for the paths the docs and tests use
    assert (REPO / "recipes").resolve() == recipes_dir().resolve()
    assert (REPO / "slurm").resolve() == slurm_template().parent.resolve()


def test_scale_recipes_replaces_the_shipped_tree_and_a_path_still_loads(tmp_path, monkeypatch):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "tiny.yaml").write_text("meta: {paper: dino}\nmethod: {kind: dino}\n")
    monkeypatch.setenv("SCALE_RECIPES", str(tmp_path))
    assert [recipe_name(p) for p in list_recipes()] == ["mine/tiny"]
    assert load_recipe("mine/tiny").meta.paper == "dino"
    with pytest.raises(Exception, match="recipe not found: 'demo/dino_tiny'"):
        load_recipe("demo/dino_tiny")  # the shipped tree is replaced, not searched too
    shipped = PACKAGE / "share" / "recipes" / "demo" / "dino_tiny.yaml"
    assert load_recipe(str(shipped)).model.name == "vit_nano"


def test_scale_recipes_that_is_not_a_folder_is_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SCALE_RECIPES", str(tmp_path / "missing"))
    assert main(["recipes", "list"]) == 2
    err = capsys.readouterr().err
    assert err.count("$SCALE_RECIPES=") == 1 and "not a folder" in err and "Traceback" not in err


def test_every_python_folder_is_a_package_setuptools_finds():
    """A folder without __init__.py is left out of the wheel by `packages = find:` (scale.data once was)."""
    folders = {p.parent for p in PACKAGE.rglob("*.py") if "share" not in p.relative_to(PACKAGE).parts}
    expected = {".".join(f.relative_to(PACKAGE.parent).parts) for f in folders}
    found = set(setuptools.find_packages(str(PACKAGE.parent), include=["scale", "scale.*"]))
    assert expected - found == set()


def test_require_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # what an import of an uninstalled package does
    with pytest.raises(MissingExtra, match=r"the probe needs sklearn, .*pip install 'scale\[eval\]'"):
        require("eval", "sklearn", "the probe")
    assert require("viz", "json") is json


def test_demo_without_its_extra_is_exit_2_naming_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["demo", "--run-dir", str(tmp_path / "demo")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'scale[demo]'" in err and "Traceback" not in err
    assert not (tmp_path / "demo").exists()  # refused before any work


# imports every scale module with the extras' libraries blocked; prints {module: error} for those that failed
PROBE = """
import importlib, json, pkgutil, sys
for name in json.loads(sys.argv[1]):
    sys.modules[name] = None
import scale
failed = {}
for info in pkgutil.walk_packages(scale.__path__, "scale."):
    try:
        importlib.import_module(info.name)
    except Exception as err:
        failed[info.name] = f"{type(err).__name__}: {err}"
print(json.dumps(failed))
"""


@pytest.mark.slow
def test_core_imports_no_extra_and_extra_modules_name_theirs():
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(BLOCKED)], capture_output=True, text=True, check=True, timeout=300
    )
    failed = json.loads(out.stdout.splitlines()[-1])
    assert set(failed) == set(EXTRA_MODULES) | AFTER_REQUIRE, failed
    for module, extra in EXTRA_MODULES.items():
        assert failed[module].startswith("MissingExtra") and f"pip install 'scale[{extra}]'" in failed[module]
