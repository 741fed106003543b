"""scale/data has no import cycle: no module imports one that imports it (at module level or inside a function)."""

import ast
from pathlib import Path

import scale

PACKAGE = Path(scale.__file__).parent / "data"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Module -> the scale.data modules it imports (a package's import also counts its __init__)."""
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.module:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            found |= {t for t in targets if t in modules and t != name}
        graph[name] = found
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    done, stack = set(), []

    def visit(node):
        if node in stack:
            return stack[stack.index(node) :] + [node]
        if node in done:
            return None
        stack.append(node)
        for child in sorted(graph[node]):
            found = visit(child)
            if found:
                return found
        stack.pop()
        done.add(node)
        return None

    for node in sorted(graph):
        found = visit(node)
        if found:
            return found
    return None


def test_scale_data_has_no_import_cycle():
    graph = _imports()
    assert "scale.data.loader" in graph and "scale.data.dali.loader" in graph
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))
