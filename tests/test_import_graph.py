"""dpmigrate's modules import each other without a circle (issue 34): a circle makes the import order matter, and
the harness modules are imported inside the user's script, where a half-initialised module breaks the run.

The graph is read from the source (``ast``), not by importing: every ``import`` and ``from ... import`` of a module of
``migrate/`` or ``runtime/`` at any depth (a function-level import counts: it runs too), except those under
``if TYPE_CHECKING:``, which never run."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {ROOT / "migrate": ("dpmigrate",), ROOT / "runtime": ("dpmigrate", "runtime")}


def _modules() -> dict[str, Path]:
    found = {}
    for folder, prefix in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = [*prefix, *path.relative_to(folder).with_suffix("").parts]
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
               for n in ast.walk(node)}
    targets = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:  # `from pkg import mod` imports mod
                targets.add(f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else source)
    return {t for t in targets if t in modules and t != name}


def circles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_module_of_dpmigrate_imports_itself_back_through_others():
    assert circles() == []


def test_the_finder_sees_a_circle_through_a_function_level_import(tmp_path, monkeypatch):
    package = tmp_path / "migrate"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text("def f():\n    from .a import x\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    monkeypatch.setitem(globals(), "PACKAGES", {package: ("dpmigrate",)})
    assert circles() == [["dpmigrate.a", "dpmigrate.b"]]
