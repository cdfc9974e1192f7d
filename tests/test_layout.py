"""The code's layout rules (docs/ARCHITECTURE.md, "Layout"), checked on the source with ``ast``: no import cycles
(lazy imports inside functions included), no module reaching into another's private names, loadgen's and the
engine's packages importing only downward, the engine reached from loadgen only by the commands that run it (and
its plain-data ``engine.request`` anywhere), and the architecture document naming every module there is. Module
length is a review guideline, not a rule: a module is split by role."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("loadgen", "engine")
# loadgen's layers, lowest first: a module imports only from its own layer or lower ones
LAYERS = {"results": 0, "workload": 1, "scenario": 2, "target": 3, "drivers": 4, "capacity": 5, "planning": 5,
          "fixed_load": 5, "gate": 6, "report": 7, "monitoring": 7, "commands": 8, "cli": 9}
ENGINE_USERS = ("loadgen.commands", "loadgen.cli")  # `slobench serve` / `generate` run the engine in-process
ENGINE_SHARED = "engine.request"  # the engine's plain data (tiers, configuration): no torch, any loadgen module
# the engine's role packages, lowest first: what a request is < who runs next < the model < the engine < its server
ENGINE_LAYERS = {"request": 0, "scheduler": 1, "model": 2, "core": 3, "server": 4, "experiments": 5}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, tuple[Path, ast.Module]]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((REPO / pkg).rglob("*.py")):
            out[module_name(p)] = (p, ast.parse(p.read_text(encoding="utf-8"), str(p)))
    return out


def imports(name: str, tree: ast.Module, known: set[str]) -> list[tuple[str, str, int]]:
    """(imported module, imported name or '', line) for every import of a project module anywhere in
    the tree, relative imports resolved."""
    found = []
    is_pkg = name in {m for m in known if any(k.startswith(m + ".") for k in known)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, "", node.lineno) for a in node.names if a.name.split(".")[0] in PACKAGES]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".") if is_pkg else name.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*parts, *([base] if base else [])])
            if base.split(".")[0] not in PACKAGES:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((sub, "", node.lineno) if sub in known else (base, alias.name, node.lineno))
    return found


def layer(name: str) -> int | None:
    parts = name.split(".")
    return LAYERS.get(parts[1]) if parts[0] == "loadgen" and len(parts) > 1 else None


def engine_layer(name: str) -> int | None:
    parts = name.split(".")
    return ENGINE_LAYERS.get(parts[1]) if parts[0] == "engine" and len(parts) > 1 else None


def test_no_private_names_imported_across_modules():
    mods = modules()
    bad = [f"{name}:{line} imports {target}.{what}" for name, (_, tree) in mods.items()
           for target, what, line in imports(name, tree, set(mods)) if what.startswith("_") and target != name]
    assert not bad, bad


def test_no_import_cycles():
    mods = modules()
    graph = {name: {t for t, _, _ in imports(name, tree, set(mods)) if t != name and t in mods}
             for name, (_, tree) in mods.items()}
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


def test_loadgen_imports_only_downward_and_reaches_the_engine_only_to_run_it():
    mods = modules()
    bad = []
    for name, (_, tree) in mods.items():
        for target, _, line in imports(name, tree, set(mods)):
            if name.startswith("engine") and target.startswith("loadgen"):
                bad.append(f"{name}:{line} (the engine) imports {target}")
            elif (name.startswith("loadgen") and target.startswith("engine") and not name.startswith(ENGINE_USERS)
                  and not target.startswith(ENGINE_SHARED)):
                bad.append(f"{name}:{line} imports the engine ({target}): loadgen reaches it over HTTP")
            elif (a := layer(name)) is not None and (b := layer(target)) is not None and b > a:
                bad.append(f"{name}:{line} imports {target}, a higher layer")
    assert not bad, bad


def test_the_engine_imports_only_downward_by_role():
    mods = modules()
    bad = [f"{name}:{line} imports {target}, a higher role"
           for name, (_, tree) in mods.items() for target, _, line in imports(name, tree, set(mods))
           if (a := engine_layer(name)) is not None and (b := engine_layer(target)) is not None and b > a]
    assert not bad, bad


def test_every_engine_module_sits_in_a_role_package():
    pkgs = {p.name for p in (REPO / "engine").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    loose = sorted(p.name for p in (REPO / "engine").glob("*.py") if p.name != "__init__.py")
    assert pkgs == set(ENGINE_LAYERS) and not loose, (pkgs ^ set(ENGINE_LAYERS), loose)


def test_every_loadgen_package_has_a_layer():
    pkgs = {p.name for p in (REPO / "loadgen").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    top = {p.stem for p in (REPO / "loadgen").glob("*.py") if p.stem != "__init__"}
    assert pkgs | top == set(LAYERS), (pkgs | top) ^ set(LAYERS)


def test_the_architecture_document_names_every_module_and_nothing_else():
    doc = (REPO / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:loadgen|engine)/[\w/]+\.py)`", doc))
    real = {str(p.relative_to(REPO)) for p, tree in modules().values()
            if p.name != "__init__.py" or any(isinstance(n, (ast.FunctionDef, ast.ClassDef)) for n in tree.body)}
    assert real - named == set(), f"modules docs/ARCHITECTURE.md does not describe: {sorted(real - named)}"
    assert named - real == set(), f"docs/ARCHITECTURE.md names modules that do not exist: {sorted(named - real)}"


def test_the_readme_names_only_modules_and_packages_that_exist():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:loadgen|engine)/[\w/]*(?:\.py|/))`", readme))
    missing = sorted(n for n in named if not (REPO / n).exists())
    assert not missing, f"README.md names paths that do not exist: {missing}"
    pkgs = {f"loadgen/{p.name}/" for p in (REPO / "loadgen").iterdir() if (p / "__init__.py").exists()}
    assert pkgs <= named, f"README.md's layout table leaves out {sorted(pkgs - named)}"
