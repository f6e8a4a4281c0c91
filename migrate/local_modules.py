"""The local modules a run's scripts import, found and read with :mod:`ast` (no libcst, no framework).

Why: ``dpmigrate main.py`` must know more than main.py's own text. A training loader built in
``data.py`` is sharded there; ``models.Net()`` whose constructor downloads pretrained weights runs on
the main process first; a script that imports no framework itself but trains what ``setup_mod.py``
builds with TensorFlow is a TensorFlow script; ``-o DIR`` must copy the modules the converted script
imports, or the copy cannot run. This module says which files those are and what the conversion
must know of them (what their functions and classes download: :mod:`.local_downloads`), reading each
once per run.

A local module is what Python itself imports from the importing file's folder (``sys.path[0]`` for
a script), in Python's order: a package (``data/__init__.py``), else a module (``data.py``), else a
folder without ``__init__.py`` (a namespace package: ``from src.data import make_loaders`` reads
``src/data.py``). ``from pkg.data import f`` reads ``pkg/__init__.py`` and ``pkg/data.py``; ``from pkg
import data`` reads ``pkg/data.py`` when it exists; ``from . import data`` and ``from .data import f``
read beside the importing file. A folder named like a framework's package is never a namespace
package: an installed package wins over a namespace portion.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
import stat
from collections.abc import Iterable, Mapping

from .frameworks import FRAMEWORK_OF_PACKAGE, REGISTRY, may_use_a_framework
from .local_downloads import downloading_callables

_IMPORT_LINE = re.compile(rb"^[ \t]*(?:from|import)[ \t]+([^\n#;]*)", re.M)
_WORD = re.compile(rb"[A-Za-z_]\w*")


def resolve(folder: str, dotted: str, names: Iterable[str] = ()) -> list[str]:
    """The files beside (or below) ``folder`` that importing ``dotted`` runs, in import order; ``names``
    are those of ``from dotted import names``, each a submodule when a file of that name exists."""
    parts = dotted.split(".")
    found: list[str] = []
    base = folder
    for depth, part in enumerate(parts):
        base = os.path.join(base, part)
        if os.path.isfile(os.path.join(base, "__init__.py")):
            found.append(os.path.join(base, "__init__.py"))
        elif os.path.isfile(base + ".py"):
            found.append(base + ".py")
            return found  # a plain module has no submodules
        elif not (os.path.isdir(base) and parts[0] not in FRAMEWORK_OF_PACKAGE):
            return found if depth else []
    for name in names:
        for candidate in (os.path.join(base, name + ".py"), os.path.join(base, name, "__init__.py")):
            if os.path.isfile(candidate):
                found.append(candidate)
                break
    return found


def imported_modules(path: str, tree: ast.Module) -> dict[str, list[str]]:
    """The local modules ``path`` imports, by the top-level name it imports them by (``src`` for
    ``from src.data import f``): that name -> the files (joined to the real folder, not resolved)."""
    folder = os.path.dirname(os.path.realpath(path))
    found: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            requests = [(alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level <= 1:
            names = tuple(a.name for a in node.names if a.name != "*")
            if node.module:
                requests = [(node.module, names)]
            elif node.level == 1:  # from . import data
                requests = [(name, ()) for name in names]
            else:
                continue
        else:
            continue
        for dotted, names in requests:
            files = resolve(folder, dotted, names)
            if files:
                found.setdefault(dotted.split(".")[0], []).extend(files)
    return {name: list(dict.fromkeys(files)) for name, files in found.items()}


def imports_one_of(source: bytes, names: Iterable[str]) -> bool:
    """Some import line of ``source`` names one of ``names`` (a quick textual look: over-approximates, never
    misses an ``import``/``from`` line, whose first line names the module)."""
    return _imports_one_of(source, {os.fsencode(name) for name in names})


def _imports_one_of(source: bytes, wanted: set[bytes]) -> bool:
    return bool(wanted) and not wanted.isdisjoint(_WORD.findall(b"\n".join(_IMPORT_LINE.findall(source))))


def parse(path: str, source: bytes) -> ast.Module | None:
    try:
        return ast.parse(source, path)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def local_imports(path: str, source: bytes) -> set[str]:
    """The real paths of the local modules ``path`` imports (empty if it does not parse)."""
    tree = parse(path, source)
    if tree is None:
        return set()
    return {os.path.realpath(f) for files in imported_modules(path, tree).values() for f in files}


def own_frameworks(tree: ast.Module, packages: Mapping[str, str] = FRAMEWORK_OF_PACKAGE) -> set[str]:
    """The frameworks a module imports itself; a converted one's runtime (``dpmigrate.runtime.torch``) decides."""
    found: set[str] = set()
    runtime: set[str] = set()
    for name in _absolute_imports(tree):
        parts = name.split(".")
        if parts[:2] == ["dpmigrate", "runtime"] and len(parts) > 2 and parts[2] in REGISTRY:
            runtime.add(parts[2])
        elif parts[0] in packages:
            found.add(packages[parts[0]])
    return runtime or found


def converted(tree: ast.Module) -> bool:
    """The module imports dpmigrate's runtime: dpmigrate converted it before."""
    return any(name == "dpmigrate.runtime" or name.startswith("dpmigrate.runtime.") for name in _absolute_imports(tree))


def _absolute_imports(tree: ast.Module) -> list[str]:
    """``a.b`` for ``import a.b``; ``a.b`` and ``a.b.c`` for ``from a.b import c``."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.extend([node.module, *(f"{node.module}.{alias.name}" for alias in node.names)])
    return names


class Reader:
    """Each local module read and parsed once; what follows from it computed once."""

    def __init__(self, packages: Mapping[str, str] = FRAMEWORK_OF_PACKAGE) -> None:
        self.packages = packages
        self._trees: dict[str, ast.Module | None] = {}
        self._imports: dict[str, dict[str, list[str]]] = {}
        self._listings: dict[str, set[bytes]] = {}

    def tree(self, path: str) -> ast.Module | None:
        real = os.path.realpath(path)
        if real not in self._trees:
            source = _read(real)
            self._trees[real] = parse(real, source) if source is not None else None
        return self._trees[real]

    def imports(self, path: str, tree: ast.Module | None = None) -> dict[str, list[str]]:
        real = os.path.realpath(path)
        if real not in self._imports:
            tree = tree if tree is not None else self.tree(path)
            self._imports[real] = imported_modules(path, tree) if tree is not None else {}
        return self._imports[real]

    def may_import_a_local_module(self, path: str, source: bytes) -> bool:
        """A quick textual look: some word of an import line names a file or folder beside ``path``."""
        folder = os.path.dirname(os.path.abspath(path))  # (the same entries as the real folder's)
        if folder not in self._listings:
            try:
                entries = os.listdir(folder)
            except OSError:
                entries = []
            self._listings[folder] = {os.fsencode(e.removesuffix(".py")) for e in entries}
        return _imports_one_of(source, self._listings[folder])

    def frameworks(self, path: str, seen: frozenset[str] = frozenset()) -> set[str]:
        """The frameworks a module trains with: those it imports, else those of its own local modules."""
        real = os.path.realpath(path)
        tree = self.tree(real)
        if tree is None or real in seen:
            return set()
        own = own_frameworks(tree, self.packages)
        if own:
            return own
        return {f for files in self.imports(real).values() for file in files
                for f in self.frameworks(file, seen | {real})}

    def closure(self, files: Iterable[str]) -> list[str]:
        """``files`` and every local module they import, directly or not (joined paths, first seen first)."""
        pending, found = list(files), {}
        while pending:
            file = pending.pop(0)
            real = os.path.realpath(file)
            if real in found:
                continue
            found[real] = file
            pending.extend(f for files in self.imports(file).values() for f in files)
        return list(found.values())


@dataclasses.dataclass(frozen=True)
class LocalModules:
    """What a run's scripts import from their own folders, as the conversion needs it."""

    names: tuple[str, ...] = ()  # the top-level names they import them by (``data``, ``src``)
    frameworks: tuple[tuple[str, str], ...] = ()  # (name, framework) for the names whose modules use one
    downloading: tuple[str, ...] = ()  # "module.function" / "module.Class" whose call downloads
    # script path (as given) -> the local modules a copy of it needs, relative to the script's folder
    needed: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # real paths of the run's files that another file of the run imports (their writes wait: see project.py)
    imported: frozenset[str] = frozenset()

    def options(self) -> dict[str, tuple]:
        """The fields of :class:`~dpmigrate.findings.Options` this fills."""
        return {"local_modules": self.names, "local_frameworks": self.frameworks,
                "downloading_functions": self.downloading}


def scan(paths: Iterable[str], packages: Mapping[str, str] = FRAMEWORK_OF_PACKAGE) -> LocalModules:
    """The local modules of the run's training files: those that may use a framework, and those that use
    one only through a local module. Other files are not parsed (a folder of ordinary modules, as
    pre-commit hands over, costs one read each and a look at their import lines)."""
    paths = list(paths)
    reader = Reader(packages)
    names: set[str] = set()
    frameworks: set[tuple[str, str]] = set()
    downloading: list[str] = []
    needed: dict[str, tuple[str, ...]] = {}
    imported: set[str] = set()
    for path in paths:
        if (source := _read(path)) is None:
            continue
        framework_words = may_use_a_framework(source)
        if not framework_words and not reader.may_import_a_local_module(path, source):
            continue
        tree = parse(path, source)
        imports = reader.imports(path, tree) if tree is not None else {}
        real = os.path.realpath(path)
        imported.update(r for files in imports.values() for r in map(os.path.realpath, files) if r != real)
        through = {(name, f) for name, files in imports.items() for file in files for f in reader.frameworks(file)}
        if not imports or not (framework_words or through):
            continue
        names.update(imports)
        frameworks |= through
        folder = os.path.dirname(real)
        for files in imports.values() if tree is not None and not converted(tree) else ():
            for file in files:  # (a converted module guards its own downloads)
                if (module := reader.tree(file)) is not None and not converted(module):
                    downloading.extend(downloading_callables(_dotted(folder, file), module, reader.frameworks(file)))
        needed[path] = tuple(os.path.relpath(f, folder) for f in reader.closure(f for v in imports.values() for f in v))
    if imported:  # the run's own files among them
        imported &= {os.path.realpath(p) for p in paths}
    return LocalModules(tuple(sorted(names)), tuple(sorted(frameworks)), tuple(dict.fromkeys(downloading)), needed,
                        frozenset(imported))


def _read(path: str) -> bytes | None:
    """A regular file's bytes, or None; never blocks (a FIFO swapped in for a module is not waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(os.dup(fd), "rb") as handle:
            return handle.read()
    except OSError:
        return None
    finally:
        os.close(fd)


def _dotted(folder: str, file: str) -> str:
    """``src.data`` for ``FOLDER/src/data.py``, ``pkg`` for ``FOLDER/pkg/__init__.py``."""
    relative = os.path.relpath(file, folder).removesuffix(".py")
    return relative.replace(os.sep, ".").removesuffix(".__init__")

