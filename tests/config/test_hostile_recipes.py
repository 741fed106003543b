"""Hostile recipes and launch settings are refused with exit 2 and one message naming the file or key: a YAML bomb,
a recursive alias, a `base:` chain 1,200 files deep, optimizer settings torch would refuse on every rank, signals
no process can catch, `--nproc` below 1, a run directory whose config.yaml is damaged."""

import pytest

from scale.cli import main
from scale.config import load_recipe
from scale.config.load import MAX_BASE_DEPTH
from scale.errors import ConfigError

BASE = "meta: {paper: dino}\nmethod: {kind: dino}\nmodel: {name: vit_small}\ntrain: {epochs: 100, global_batch: 1024}\n"


@pytest.fixture
def recipes(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALE_RECIPES", str(tmp_path / "recipes"))
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "ok.yaml").write_text(BASE)
    return tmp_path / "recipes"


def billion_laughs() -> str:
    """Nine levels of nine aliases under meta.reported: 9**9 strings once expanded."""
    lines = ["meta:", "  reported:", '    a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"    {name}: &{name} [{', '.join([f'*{prev}'] * 9)}]")
    return "\n".join(lines) + "\n"


@pytest.mark.timeout(60)  # today's loader expanded it for hours
def test_yaml_bomb_is_refused_naming_the_file(recipes, capsys):
    (recipes / "bomb.yaml").write_text(BASE.replace("meta: {paper: dino}\n", "") + billion_laughs())
    assert main(["recipes", "show", "bomb"]) == 2
    err = capsys.readouterr().err
    assert err.count("scale: error:") == 1 and "bomb.yaml" in err and "YAML bomb" in err, err
    assert "Traceback" not in err


def test_recursive_alias_is_refused(recipes):
    (recipes / "loop.yaml").write_text(BASE + "eval: {knn_k: &k [1, *k]}\n")
    with pytest.raises(ConfigError, match=r"loop\.yaml: a YAML alias refers to a node that contains it"):
        load_recipe("loop")


def test_deep_base_chain_is_refused_with_a_message(recipes, capsys):
    depth = 1200
    for i in range(depth):
        (recipes / f"r{i}.yaml").write_text(f"base: r{i + 1}\n")
    (recipes / f"r{depth}.yaml").write_text(BASE)
    assert main(["recipes", "show", "r0"]) == 2
    err = capsys.readouterr().err
    assert f"more than {MAX_BASE_DEPTH} files deep" in err and "r0.yaml" in err and "Traceback" not in err, err
    assert load_recipe(f"r{depth - MAX_BASE_DEPTH + 1}").model.name == "vit_small"  # as deep as allowed: loads


@pytest.mark.parametrize(
    "override,message",
    [
        ("optim.lr=nan", "optim.lr=nan must be a finite number"),
        ("optim.lr=.inf", "optim.lr=inf must be a finite number"),
        ("optim.eps=-1", "optim.eps=-1.0 must be greater than 0.0"),
        ("optim.eps=0", "optim.eps=0.0 must be greater than 0.0"),
        ("optim.betas=[2.0,5.0]", "must be at least 0.0 and less than 1.0"),
        ("optim.betas=[1.0,1.0]", "must be at least 0.0 and less than 1.0"),
        ("optim.momentum=-0.5", "optim.momentum=-0.5 must be at least 0.0"),
        ("optim.weight_decay=nan", "must be a finite number"),
        ("train.preempt_signals=[SIGKILL]", "SIGKILL cannot be caught by a process"),
        ("train.preempt_signals=[SIGTERM,SIGSTOP]", "SIGSTOP cannot be caught by a process"),
        ("train.preempt_signals=[SIGFOO]", "'SIGFOO' is not a signal name"),
    ],
)
def test_settings_every_rank_would_fail_on_are_refused_at_load(recipes, override, message):
    with pytest.raises(ConfigError, match="command line: .*" + message.replace("[", r"\[").replace(".", r"\.")):
        load_recipe("ok", [override])


def test_valid_optimizer_settings_load(recipes):
    cfg = load_recipe("ok", ["optim.betas=[0.0,0.99]", "optim.eps=1e-6", "train.preempt_signals=[SIGHUP]"])
    assert list(cfg.optim.betas) == [0.0, 0.99]


@pytest.mark.parametrize("nproc", ["-1", "0", "two"])
def test_nproc_below_one_is_a_usage_error(recipes, capsys, nproc):
    with pytest.raises(SystemExit) as exit_:
        main(["train", "ok", "--nproc", nproc, "--synthetic-data"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --nproc" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "content,problem",
    [(b"\xff\xfe not text", "not UTF-8 text"), (b"- a\n- list\n", "a list, not an object")],
)
def test_damaged_run_dir_config_is_named_with_what_to_do(recipes, tmp_path, capsys, content, problem):
    run = tmp_path / "run"
    (run / "checkpoints" / "step_000000002").mkdir(parents=True)
    (run / "config.yaml").write_bytes(content)
    assert main(["train", "ok", "--run-dir", str(run), "--synthetic-data"]) == 2
    err = capsys.readouterr().err
    assert err.count("scale: error:") == 1 and f"{run / 'config.yaml'}: {problem}" in err, err
    assert "delete it" in err and "Traceback" not in err
