"""tests/ mirrors scale/: the tests of scale/PKG/ (a package, its subpackages included) are in tests/PKG/, those of
scale's top-level modules (cli.py, nofollow.py, report.py, ...) are tests/test_*.py at the top level. A few folders
test something other than a package, each named below with what it tests; any other folder mirrors nothing. And one
file name holds one thing: two modules share a name only for a role every package may have (config.py...), or as a
pair listed with why."""

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


# File names any package may use for the same role in each (issue 51: one name, one meaning)
ROLE_NAMES = {
    "__init__.py": "Python's: the package itself",
    "__main__.py": "Python's: `python -m` of the package",
    "config.py": "the package's recipe section (the schema reads each package's config.py)",
    "base.py": "the package's abstract interface (engine/base.py: Engine, methods/base.py: Method)",
    "registry.py": "the package's registry of names to classes (methods, models)",
    "factory.py": "the package's build_* that picks an implementation from the recipe (engine, data)",
}
# `scale X` is commands/X.py, a thin layer over the module that does X, which may bear the same name
COMMANDS = "commands"
# pairs that share a name and are kept, each with why; any other pair fails (knn.py, monitors.py, flops.py,
# activation.py and bench.py were renamed by issue 51)
KEPT_PAIRS = {
    "loader.py": (
        {"data/loader.py", "data/dali/loader.py"},
        "two implementations of the one loader protocol (data/loader_protocol.py), DALI's in its backend's package",
    ),
    "layout.py": (
        {"data/shards/layout.py", "launch/layout.py"},
        "the files of a shard directory and the setting a recipe runs with on given nodes: each package's layout",
    ),
    "reference.py": (
        {"reference.py", "data/reference.py"},
        "the generated reference pages and the official DINO augmentation that `scale bench data` measures against",
    ),
    "tables.py": (
        {"bench/tables.py", "eval/tables.py"},
        "the papers' cost tables that bench measures and the tables `scale eval` prints: each package's tables",
    ),
}


def shared_names(root: Path) -> dict[str, set[str]]:
    """File names that two or more modules under `root` share, less role names and commands/X.py beside the
    module it drives; each with its paths relative to `root`."""
    paths: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        relative = path.relative_to(root)
        if path.name not in ROLE_NAMES:
            paths.setdefault(path.name, set()).add(relative.as_posix())
    shared = {}
    for name, where in paths.items():
        others = {p for p in where if not p.startswith(f"{COMMANDS}/")}
        if len(others) > 1:
            shared[name] = where
    return shared


def test_no_two_modules_share_a_name_for_different_things():
    shared = shared_names(PACKAGE)
    unexplained = {name: sorted(where) for name, where in shared.items() if KEPT_PAIRS.get(name, (None,))[0] != where}
    assert not unexplained, f"modules sharing a file name (rename one, or list why in KEPT_PAIRS): {unexplained}"
    stale = set(KEPT_PAIRS) - set(shared)
    assert not stale, f"KEPT_PAIRS entries no longer shared: {stale}"


def test_the_name_check_finds_a_name_shared_across_packages(tmp_path):
    for path in ("watch/knn.py", "eval/knn.py", "eval/config.py", "loop/config.py", "plan.py", "commands/plan.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).touch()
    assert shared_names(tmp_path) == {"knn.py": {"watch/knn.py", "eval/knn.py"}}
    (tmp_path / "commands" / "knn.py").touch()  # a command beside two modules of its name does not hide them
    assert shared_names(tmp_path)["knn.py"] == {"watch/knn.py", "eval/knn.py", "commands/knn.py"}
