"""The engine package's layout rules: short modules, imports only downward, no reaching into private names."""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parent.parent / "engine"
MAX_LINES = 400


def _module_name(path: Path) -> str:
    return "engine" if path.name == "__init__.py" else f"engine.{path.stem}"


def _modules() -> dict[str, ast.Module]:
    return {_module_name(p): ast.parse(p.read_text(), str(p)) for p in sorted(ENGINE.glob("*.py"))}


def _imports(tree: ast.Module, modules: set[str]) -> list[tuple[str, str]]:
    """(engine module, imported name or '') for every import anywhere in the tree, lazy ones included."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name in modules]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in modules:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.append((submodule, "") if submodule in modules else (node.module, alias.name))
    return found


def test_modules_are_short():
    long = {p.name: n for p in ENGINE.glob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"engine modules over {MAX_LINES} lines: {long}"


def test_no_private_names_imported_across_modules():
    modules = _modules()
    bad = [f"{name} imports {target}.{what}" for name, tree in modules.items()
           for target, what in _imports(tree, set(modules)) if what.startswith("_")]
    assert not bad, bad


def test_no_import_cycles():
    modules = _modules()
    graph = {name: {target for target, _ in _imports(tree, set(modules)) if target != name}
             for name, tree in modules.items()}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(name):] + [name]))
        if name in done:
            return
        for target in sorted(graph[name]):
            visit(target, path + [name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])
