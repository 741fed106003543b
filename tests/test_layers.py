"""The layers of scale/, read from the source: every import statement of every module (those inside functions
too), resolved to the package it names. The training loop (scale/loop/) sits above engine/, methods/, data/ and
checkpoint/; eval/ and the loop never import each other; engine/ imports neither the loop nor bench/. Between
packages there are no cycles, except the schema (scale/config/) reading each package's own config section and
registry."""

import ast
from pathlib import Path

import pytest

import scale

ROOT = Path(scale.__file__).parent
FORBIDDEN = [("eval", "loop"), ("loop", "eval"), ("checkpoint", "eval"), ("engine", "loop"), ("engine", "bench")]


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(tree: ast.AST, name: str, is_package: bool) -> set[str]:
    """The scale modules a module's source imports: `import a.b`, `from a import b` (b may be a module: a.b is
    counted as well as a), relative imports resolved."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {m for m in found if m == "scale" or m.startswith("scale.")}


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the scale modules it imports (names that are no module of scale/ are dropped)."""
    sources = {module_name(p, root): p for p in root.rglob("*.py")}
    return {
        name: {m for m in imported(ast.parse(p.read_text()), name, p.name == "__init__.py") if m in sources}
        for name, p in sources.items()
    }


def package(module: str) -> str:
    """scale.X or scale.X.anything -> X (a sub-package or a loose module at the root); scale itself -> ''."""
    return module.split(".")[1] if "." in module else ""


def reads_config_section(source: str, target: str) -> bool:
    """The one allowed upward import: the schema (scale/config/) reading a package's config section, or the
    registry its choices come from (scale/methods/registry.py: the method kinds and the views each takes)."""
    return package(source) == "config" and target.endswith((".config", ".registry"))


def package_edges(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[str]]:
    """(package, package) -> the imports that make the edge ('a.b -> c.d')."""
    edges: dict[tuple[str, str], list[str]] = {}
    for source, targets in graph.items():
        for target in targets:
            pair = (package(source), package(target))
            if pair[0] != pair[1] and "" not in pair and not reads_config_section(source, target):
                edges.setdefault(pair, []).append(f"{source} -> {target}")
    return edges


def forbidden_imports(edges) -> list[str]:
    return sorted(line for pair in FORBIDDEN for line in edges.get(pair, []))


def package_cycles(edges) -> list[list[str]]:
    """The strongly connected groups of more than one package (Tarjan)."""
    succ: dict[str, set[str]] = {}
    for a, b in edges:
        succ.setdefault(a, set()).add(b)
        succ.setdefault(b, set())
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(succ[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(succ):
        if node not in index:
            visit(node)
    return groups


def cycle_imports(edges, group: list[str]) -> list[str]:
    return sorted(line for (a, b), lines in edges.items() if a in group and b in group for line in lines)


def test_forbidden_imports():
    bad = forbidden_imports(package_edges(import_graph()))
    assert not bad, "imports across a forbidden layer boundary:\n" + "\n".join(bad)


def test_no_package_cycles():
    edges = package_edges(import_graph())
    cycles = {", ".join(g): cycle_imports(edges, g) for g in package_cycles(edges)}
    assert not cycles, "import cycles between packages:\n" + "\n".join(f"{g}: {lines}" for g, lines in cycles.items())


def test_loop_is_a_package():
    """The loop's modules live in scale/loop/, not loose at the root (scale/progress.py is not the loop's: shard
    writing and verifying print their progress through it too)."""
    loose = {p.stem for p in ROOT.glob("*.py")}
    assert not loose & {"train", "step", "resume", "rundir", "preemption", "monitors", "runlock"}


@pytest.fixture
def tree(tmp_path):
    def write(files: dict[str, str]) -> Path:
        for rel, text in {"__init__.py": "", **files}.items():
            path = tmp_path / "scale" / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            (path.parent / "__init__.py").touch()
            path.write_text(text)
        return tmp_path / "scale"

    return write


def test_walker_sees_imports_inside_functions_and_relative_ones(tree):
    root = tree(
        {
            "eval/knn.py": "def f():\n    from scale.loop import train\n",
            "eval/rel.py": "from ..loop.step import TrainStep\n",
            "loop/train.py": "",
            "loop/step.py": "",
        }
    )
    edges = package_edges(import_graph(root))
    assert forbidden_imports(edges) == [
        "scale.eval.knn -> scale.loop",
        "scale.eval.knn -> scale.loop.train",
        "scale.eval.rel -> scale.loop.step",
    ]


def test_cycle_found_and_config_sections_allowed(tree):
    root = tree(
        {
            "config/schema.py": "import scale.engine.config\n",
            "engine/config.py": "from scale.config import fields\n",
            "config/fields.py": "",
            "data/loader.py": "from scale.checkpoint import store\n",
            "checkpoint/store.py": "from scale.data.loader import x\n",
        }
    )
    edges = package_edges(import_graph(root))
    assert package_cycles(edges) == [["checkpoint", "data"]]
