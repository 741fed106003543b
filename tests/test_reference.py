"""The generated reference pages under docs/reference/ are what the code generates now (scale/reference.py)."""

from pathlib import Path

import pytest

from scale.reference import bench_parsers, pages

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return pages()


def test_generated_pages_are_up_to_date(generated):
    stale = [rel for rel, text in generated.items() if (DOCS / rel).read_text(encoding="utf-8") != text]
    assert not stale, f"out of date: {', '.join(stale)}; run `python -m scale.reference` and commit the pages"


def test_pages_cover_every_command_and_key(generated):
    from scale.cli import build_parser, command_parsers
    from scale.config.describe import describe_all

    for words in command_parsers(build_parser()):
        assert f"`{' '.join(('scale', *words))}`" in generated["reference/cli.md"]
    for name, make in bench_parsers().items():
        options = [o for action in make()._actions for o in action.option_strings if o not in ("-h", "--help")]
        section = generated["reference/cli.md"].split(f"### `scale bench {name}`\n")[1].split("\n#")[0]
        assert options and all(f"`{o}`" in section for o in options), name
    for info in describe_all(resolve_choices=False):
        assert f"| `{info.key}` |" in generated["reference/recipe-keys.md"]
