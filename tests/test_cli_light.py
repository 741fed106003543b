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
    out = subprocess.run(  # inherits $XDG_CACHE_HOME: the session's trace cache (tests/conftest.py)
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
    status read YAML and files: no torch (the schema declares its choices; scale/config/fields.py). Submit's verdict
    reads the step trace from the cache (scale.bench.trace_cache), warmed here as a first call would."""
    from scale.bench.trace_cache import cached_trace
    from scale.config import load_recipe

    recipe = "dino/table2/vit_s16"
    cached_trace(load_recipe(recipe))
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


def test_version_help_texts_and_defaults(capsys):
    """No `scale --version`; `scale --help` opened with a note on where sub-commands live in the source; defaults
    were not shown."""
    import pytest

    from scale.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    version = capsys.readouterr().out
    assert version.startswith("scale 0.") and "(git " in version  # the tests run from a checkout
    help_text = build_parser().format_help()
    assert "scale/commands" not in help_text and "DINO" in help_text
    submit = next(p for w, p in _parsers() if w == ("submit",)).format_help()
    assert "(default: 120)" not in submit and "default 120" in submit  # said once, by the help itself
    assert "nodes of the job (default: 1)" in " ".join(submit.split())
    plan = next(p for w, p in _parsers() if w == ("plan",)).format_help()
    assert "(default: 100.0)" in " ".join(plan.split())


def _parsers():
    from scale.cli import _command_parser

    parser = build_parser()
    return [(words, _command_parser(parser, list(words))) for words in command_parsers(parser)]


def test_unknown_paper_or_table_exits_2_naming_the_known_ones(capsys):
    from scale.cli import main

    assert main(["recipes", "list", "--paper", "dinov2"]) == 2
    assert "known: dino, drloc, esvit, mocov3" in capsys.readouterr().err
    assert main(["recipes", "check", "--paper", "dino", "--table", "table99"]) == 2
    assert "--table table99: no such table of dino; known: fig4" in capsys.readouterr().err


def test_recipes_show_prints_only_the_sections_the_method_reads(capsys):
    from scale.cli import main

    assert main(["recipes", "show", "dino/table2/vit_s16"]) == 0
    shown = capsys.readouterr().out
    assert "\n  dino:\n" in shown and "\n  mocov3:\n" not in shown and "\n  esvit:\n" not in shown
    assert main(["recipes", "show", "dino/table2/vit_s16", "--all"]) == 0
    assert "\n  mocov3:\n" in capsys.readouterr().out
    assert main(["recipes", "show", "esvit/table1/swin_t_w7_lvlr"]) == 0  # EsViT's own and DINO's, which it extends
    shown = capsys.readouterr().out
    assert "\n  esvit:\n" in shown and "\n  dino:\n" in shown and "\n  supervised:\n" not in shown
