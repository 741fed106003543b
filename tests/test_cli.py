"""The command line: options and overrides in any order, for every sub-command."""

import pytest

from scale.cli import build_parser, main, parse_args


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "R", "a.b=1", "--nproc", "2", "c.d=2", "--run-dir", "x"],
        ["train", "R", "--nproc", "2", "a.b=1", "c.d=2", "--run-dir", "x"],
        ["train", "--run-dir", "x", "R", "a.b=1", "--nproc", "2", "c.d=2"],
    ],
)
def test_train_takes_options_and_overrides_in_any_order(argv):
    args = parse_args(build_parser(), argv)
    assert (args.recipe, args.overrides, args.nproc, args.run_dir) == ("R", ["a.b=1", "c.d=2"], 2, "x")


def test_nested_subcommand_and_unknown_option():
    args = parse_args(build_parser(), ["recipes", "show", "R", "a.b=1", "c.d=2"])
    assert args.overrides == ["a.b=1", "c.d=2"]
    with pytest.raises(SystemExit):
        parse_args(build_parser(), ["train", "R", "--nproc", "2", "--no-such-option"])
    with pytest.raises(SystemExit):  # a command without overrides takes no extra words
        parse_args(build_parser(), ["status", "runs/x", "a.b=1"])


def test_bench_override_after_an_option_reaches_the_recipe(capsys):
    # the override is read (and rejected by the recipe check, exit 2) instead of "unrecognized arguments"
    assert main(["bench", "demo/dino_tiny", "--synthetic-data", "train.epochs=0", "--steps", "1"]) == 2
    assert "command line: train.epochs=0 must be at least 1" in capsys.readouterr().err


def test_report_takes_run_directories_around_options(tmp_path):
    args = parse_args(build_parser(), ["report", "a", "--out", str(tmp_path), "b"])
    assert args.run_dirs == ["a", "b"] and args.out == str(tmp_path)


def test_bench_help_lists_the_recipe_benchmarks_options(capsys):
    """`scale bench --help` names the options of `scale bench RECIPE` (its REMAINDER argument hides them otherwise)
    and how to get the other benchmarks' options."""
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for option in ("--steps STEPS", "--warmup WARMUP", "--synthetic-data", "--matrix KEY=V1,V2", "--json", "--nproc"):
        assert option in text
    assert "default 5" in text and "scale bench NAME --help" in text


def test_every_option_of_every_command_has_a_help_text():
    """Every option says what it does in `--help` (and so on the generated reference page), every benchmark's too."""
    from scale.cli import _command_parser, command_parsers
    from scale.commands.bench import PARSERS

    parser = build_parser()
    parsers = {" ".join(words): _command_parser(parser, list(words)) for words in command_parsers(parser)}
    parsers |= {f"bench {name}": make() for name, make in PARSERS.items()}
    bare = [
        f"{name} {action.option_strings[-1]}"
        for name, sub in parsers.items()
        for action in sub._actions
        if action.option_strings and not action.help and "-h" not in action.option_strings
    ]
    assert not bare, f"options without a help text: {', '.join(bare)}"
