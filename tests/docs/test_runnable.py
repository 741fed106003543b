"""Every code block of the README and docs/ marked runnable is checked, so that a renamed command, option or recipe
key fails here rather than for the reader. A block is marked by an HTML comment on the line before its fence:

    <!-- run -->    each command runs, in-process on the settings written (keep them tiny: recipes, explain, plan)
    <!-- parse -->  each command is parsed by its own parser, and its recipe loaded with its overrides (Slurm, GPU
                    and long runs); `make X` must name a Makefile target

A line the test cannot check (another program) fails too: a marked block holds only commands it can check."""

import re
import shlex
from pathlib import Path

import pytest

from scale.cli import build_parser, main, parse_args
from scale.commands.bench import BENCHES, PARSERS
from scale.config import load_recipe

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^<!-- (run|parse) -->\n```[\w-]*\n(.*?)^```", re.S | re.M)
ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")  # VAR=value before a command


def commands(text: str) -> list[str]:
    """The commands of a block: continuation lines joined, comments and blank lines left out."""
    lines = text.replace("\\\n", " ").splitlines()
    return [re.sub(r"\s+#\s.*$", "", line).strip() for line in lines if line.strip() and not line.startswith("#")]


def marked() -> list[tuple[str, str, str]]:
    found = []
    for page in PAGES:
        for mode, body in BLOCK.findall(page.read_text(encoding="utf-8")):
            found += [(f"{page.relative_to(ROOT)}: {cmd}", mode, cmd) for cmd in commands(body)]
    return found


def scale_argv(words: list[str]) -> list[str] | None:
    """The `scale` arguments of a command line: `scale ...`, `torchrun ... -m scale.cli ...`, after VAR=value."""
    while words and ENV.match(words[0]):
        words = words[1:]
    if words[:1] == ["scale"]:
        return words[1:]
    if words[:1] == ["torchrun"] and "scale.cli" in words:
        return words[words.index("scale.cli") + 1 :]
    return None


def make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


def parse(argv: list[str]) -> None:
    """Parse as the command would, and load the recipe with its overrides where the command takes one."""
    try:
        args = parse_args(build_parser(), argv)
    except SystemExit as stop:
        pytest.fail(f"the parser refused it (exit {stop.code})")
    if argv[0] == "bench":  # each benchmark parses its own arguments
        name = args.target if args.target in BENCHES else "RECIPE"
        rest = args.args if args.target in BENCHES else [args.target, *args.args]
        try:
            args = PARSERS[name]().parse_intermixed_args(rest)
        except SystemExit as stop:
            pytest.fail(f"`scale bench {name}` refused it (exit {stop.code})")
    if isinstance(getattr(args, "recipe", None), str):
        load_recipe(args.recipe, getattr(args, "overrides", None) or [])


@pytest.mark.parametrize("where, mode, command", [pytest.param(*m, id=m[0]) for m in marked()])
def test_marked_command(where, mode, command, tmp_path, monkeypatch):
    words = shlex.split(command)
    if words[:1] == ["srun"]:  # srun's own options, then the command
        words = words[next((i for i, w in enumerate(words) if w in ("make", "scale")), len(words)) :]
    if words[:1] == ["make"]:
        assert mode == "parse", "make targets are not run by the tests"
        assert set(words[1:]) <= make_targets(), f"no such Makefile target in {words[1:]}"
        return
    argv = scale_argv(words)
    assert argv is not None, f"{where}: a marked block holds a command the test cannot check"
    if mode == "parse":
        parse(argv)
    else:
        monkeypatch.chdir(tmp_path)
        assert main(argv) == 0, where


def test_the_marks_are_found():
    # the README's examples and the docs' tutorials carry marks; a change to the marking breaks this, not silently
    found = marked()
    assert len(found) > 20
    assert any(w.startswith("README.md") for w, _, _ in found) and any(m == "run" for _, m, _ in found)
