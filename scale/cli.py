"""The `scale` command. Each sub-command lives in scale/commands/<name>.py and is found here by its module name
(a module whose name starts with `_` serves one and is no command)."""

import argparse
import faulthandler
import importlib
import logging
import os
import pkgutil
import sys

import scale.commands
from scale.errors import ConfigError, UserError

DESCRIPTION = (
    "Train self-supervised vision transformers (DINO, MoCo v3, EsViT, DRLoc) from the papers' recipes, on one CPU "
    "process or hundreds of GPUs; plan, submit and follow the jobs; evaluate and export the weights."
)
EPILOG = "`scale COMMAND --help` lists a command's options and their defaults; `scale recipes list` the recipes."


class HelpFormatter(argparse.HelpFormatter):
    """Each option's default after its help, where it has one worth saying (not None or False) and the help does
    not say it already."""

    def _get_help_string(self, action):
        text = action.help or ""
        if not action.option_strings or action.default in (None, False, argparse.SUPPRESS) or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


class VersionAction(argparse.Action):
    """`scale --version`: the package's version, and the git commit when scale runs from a checkout (looked up only
    when asked: no subprocess on every start)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print scale's version (and git commit) and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        from scale import __version__
        from scale.trackers import git_commit

        commit = git_commit()
        print(f"scale {__version__}" + (f" (git {commit[:12]})" if commit else ""))
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scale", description=DESCRIPTION, epilog=EPILOG, formatter_class=HelpFormatter
    )
    parser.add_argument("--version", action=VersionAction)
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also show libraries' warnings that scale keeps off the console (see scale/verbosity.py)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(scale.commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        importlib.import_module(f"scale.commands.{info.name}").register(sub)
    for words in command_parsers(parser):
        _command_parser(parser, list(words)).formatter_class = HelpFormatter
    return parser


def parse_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Options and positional arguments in any order: `scale train R --nproc 2 key=value` gives the command's list
    of positionals (the overrides, run directories) the words argparse leaves over once that list is closed."""
    args, extras = parser.parse_known_args(argv)
    if extras:
        lists = [a for a in _command_parser(parser, argv)._actions if not a.option_strings and a.nargs in ("*", "+")]
        if not lists or any(word.startswith("-") for word in extras):
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        getattr(args, lists[0].dest).extend(extras)
    return args


def command_parsers(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The words of every command and (sub-)sub-command, e.g. ("ckpt",), ("ckpt", "info"), ...; () is scale."""
    found = [words]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += command_parsers(child, (*words, name))
    return found


def _command_parser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The parser of the (sub-)sub-command that argv names."""
    for word in argv:
        commands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if commands and word in commands[0].choices:
            parser = commands[0].choices[word]
    return parser


def main(argv: list[str] | None = None) -> int:
    # a crash in native code (a NCCL or gloo abort, a segfault) prints every thread's Python stack to the rank's
    # log, so that the step that died can be found (the process's own stderr: sys.stderr may be a redirection)
    faulthandler.enable(file=sys.__stderr__, all_threads=True)
    parser = build_parser()
    args = parse_args(parser, sys.argv[1:] if argv is None else argv)
    from scale.verbosity import set_verbose

    set_verbose(args.verbose)
    try:
        return args.func(args) or 0
    except UserError as err:
        logging.getLogger("scale").debug("user error", exc_info=True)
        if not (isinstance(err, ConfigError) and _rank() != 0):  # every rank found the same: rank 0 says it
            print(f"scale: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("scale: interrupted", file=sys.stderr)
        return 130


def _rank() -> int:
    """This process's rank under torchrun, srun or `--nproc`; 0 when not launched as one of several."""
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", 0)))


if __name__ == "__main__":
    sys.exit(main())
