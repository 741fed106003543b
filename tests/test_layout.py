"""tests/ mirrors scale/: the tests of scale/PKG/ (a package, its subpackages included) are in tests/PKG/, those of
scale's top-level modules (cli.py, nofollow.py, report.py, ...) are tests/test_*.py at the top level. A few folders
test something other than a package, each named below with what it tests; any other folder mirrors nothing."""

from pathlib import Path

import scale

PACKAGE = Path(scale.__file__).parent
TESTS = Path(__file__).parent

# the folders that mirror no scale/ package, and what they test instead
NOT_A_PACKAGE = {
    "demo": "`scale demo` end to end (scale/demo.py, commands/demo.py)",
    "docs": "the runnable code blocks of docs/",
    "gpu": "the GPU tier (make test-gpu): every package's GPU paths",
    "slurm": "the sbatch template (scale/share/slurm) and launch/slurm.py against a local Slurm cluster",
    "tools": "tools/ (device-check)",
}


def packages(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}


def folders_with_tests(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if p.is_dir() and any(p.glob("test_*.py"))}


def missing_and_stray(package: Path, tests: Path) -> tuple[list[str], list[str]]:
    pkgs, folders = packages(package), folders_with_tests(tests)
    missing = sorted(f"scale/{name}/ has no tests/{name}/" for name in pkgs - folders)
    stray = sorted(f"tests/{name}/ mirrors no scale/ package" for name in folders - pkgs - NOT_A_PACKAGE.keys())
    return missing, stray


def test_every_package_has_its_test_folder_and_every_folder_mirrors_something():
    missing, stray = missing_and_stray(PACKAGE, TESTS)
    assert not missing + stray, missing + stray


def test_the_check_names_a_package_without_tests_and_a_folder_without_a_package(tmp_path):
    package, tests = tmp_path / "scale", tmp_path / "tests"
    for folder in (package / "loop", package / "newpkg", package / "share"):
        folder.mkdir(parents=True)
    (package / "loop" / "__init__.py").touch()
    (package / "newpkg" / "__init__.py").touch()
    for name in ("loop", "foundation", "gpu"):
        (tests / name).mkdir(parents=True)
        (tests / name / "test_x.py").touch()
    (tests / "empty").mkdir()  # no test file: not a test folder (e.g. __pycache__)
    assert missing_and_stray(package, tests) == (
        ["scale/newpkg/ has no tests/newpkg/"],
        ["tests/foundation/ mirrors no scale/ package"],
    )


def test_the_folders_that_mirror_no_package_exist():
    # an entry outlives its folder only by mistake: the list says what each folder tests
    assert set(NOT_A_PACKAGE) <= folders_with_tests(TESTS)


def test_the_paths_the_scheduler_names_exist():
    # tests/conftest.py orders and groups units by path: a moved test file would silently lose its place
    from tests.conftest import EVERY_RECIPE, LONGEST_FIRST, SHARED_SCOPES

    root = TESTS.parent
    stale = [
        unit for unit in (*LONGEST_FIRST, *SHARED_SCOPES, *EVERY_RECIPE) if not (root / unit.split("::")[0]).exists()
    ]
    assert not stale, stale
