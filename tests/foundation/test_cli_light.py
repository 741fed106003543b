"""The command line answers at once: `scale --help`, every command's and sub-command's `--help` and every usage
error import nothing heavy (torch, timm, DeepSpeed, matplotlib, ...): the parsers are built from light modules and
the heavy imports happen inside the command functions. Measured as the set of modules imported, not as a time."""

import json
import subprocess
import sys

from scale.cli import build_parser, command_parsers

HEAVY = ("torch", "timm", "torchvision", "numpy", "PIL", "cv2", "omegaconf", "jinja2", "scipy")
HEAVY += ("deepspeed", "nvidia", "matplotlib", "sklearn", "skimage", "tensorboard")  # the extras' libraries

# runs every argv through scale.cli.main in one fresh interpreter and prints the heavy top-level modules it imported
PROBE = """
import contextlib, io, json, sys
from scale.cli import main
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(argv)
        except SystemExit:
            pass
heavy = json.loads(sys.argv[2])
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & set(heavy))))
"""


def _heavy_imports(argvs: list[list[str]], heavy: tuple[str, ...] = HEAVY) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(argvs), json.dumps(heavy)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return json.loads(out.stdout.splitlines()[-1])


def _every_help() -> list[list[str]]:
    """`--help` of scale, of every command, of every (sub-)sub-command and of every `scale bench` benchmark."""
    from scale.commands.bench import BENCHES

    argvs = [[*words, "--help"] for words in command_parsers(build_parser())]
    return argvs + [["bench", name, "--help"] for name in BENCHES]


def test_every_help_imports_nothing_heavy():
    argvs = _every_help()
    assert ["train", "--help"] in argvs and ["ckpt", "info", "--help"] in argvs and len(argvs) > 30
    assert _heavy_imports(argvs) == []


def test_usage_errors_import_nothing_heavy():
    words = [w for w in command_parsers(build_parser()) if w and w != ("bench",)]  # bench: a recipe or a benchmark
    argvs = [[], ["no-such-command"], ["train"], ["ckpt"], ["ckpt", "info"], ["eval", "knn"], ["plan"], ["submit"]]
    argvs += [[*w, "--no-such-option"] for w in words]
    argvs += [["bench"], ["bench", "table"], ["bench", "table", "no-such-table"], ["bench", "data"], ["bench", "ac"]]
    argvs += [["bench", "ckpt"], ["bench", "data", "R", "--no-such-option"]]
    assert _heavy_imports(argvs) == []


# what a recipe's commands must not import: loading, merging, validating and showing a recipe needs none of these
RECIPE_HEAVY = ("torch", "timm", "torchvision", "webdataset", "deepspeed", "numpy", "PIL", "wandb", "mlflow")


def test_recipe_commands_import_nothing_heavy(tmp_path):
    """Show, submit's dry run, plan's argument checks, a misspelt recipe name, ckpt info of a path that is no run and
    status read YAML and files: no torch (the schema declares its choices; scale/config/fields.py)."""
    recipe = "dino/table2/vit_s16"
    argvs = [["recipes", "show", recipe], ["submit", recipe, "--nodes", "2", "--gpus-per-node", "8", "--dry-run"]]
    argvs += [["train", "dino/table2/vit_s17"], ["plan", recipe, "--nodes", "2"], ["plan", recipe, "--gpus", "7"]]
    argvs += [["recipes", "show", recipe, "model.name=vit_smal"], ["ckpt", "info", str(tmp_path / "none")]]
    argvs += [["status", str(tmp_path)]]
    assert _heavy_imports(argvs, RECIPE_HEAVY) == []


def test_recipes_list_builds_no_model():
    """The listing reads the YAML files: no torch, no timm (it took 20-30 CPU-seconds through the loader)."""
    assert _heavy_imports([["recipes", "list", "--paper", "dino"]], ("torch", "timm", "torchvision")) == []


def test_recipes_list_matches_the_loader_and_keeps_names_whole(capsys):
    from scale.cli import main
    from scale.commands.recipes import _section_defaults, quick_summary, summary
    from scale.config import list_recipes

    paths = list_recipes()
    defaults = _section_defaults()
    for path in paths[:: max(1, len(paths) // 12)]:  # a dozen recipes across the papers through the full loader
        assert quick_summary(path, defaults) == summary(path)
    assert main(["recipes", "list", "--paper", "dino"]) == 0  # captured: not a terminal, as when piped
    out = capsys.readouterr().out
    names = [summary(p)["name"] for p in paths if "/table2/" in str(p) and "dino" in str(p)]
    assert names and all(f" {name} " in out for name in names)  # one line each, not cut at 80 columns


def test_bench_table_parser_names_every_table():
    from scale.bench.tables import TABLES
    from scale.commands.bench import TABLE_NAMES

    assert sorted(TABLE_NAMES) == sorted(TABLES)
