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

from ..frameworks import FRAMEWORK_OF_PACKAGE, REGISTRY, may_use_a_framework
from .downloads import downloading_callables, may_download
from .import_lines import import_statements
from .models import model_facts

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
    tree = import_statements(path, source)
    if tree is None:
        return set()
    return {os.path.realpath(f) for files in imported_modules(path, tree).values() for f in files}


def own_frameworks(tree: ast.Module, packages: Mapping[str, str] = FRAMEWORK_OF_PACKAGE) -> set[str]:
    """The frameworks a module imports itself; a converted one's runtime (``dpmigrate.runtime.torch``) decides."""
    return _own_frameworks(_absolute_imports(tree), packages)


def _own_frameworks(imported: list[str], packages: Mapping[str, str]) -> set[str]:
    found: set[str] = set()
    runtime: set[str] = set()
    for name in imported:
        parts = name.split(".")
        if parts[:2] == ["dpmigrate", "runtime"] and len(parts) > 2 and parts[2] in REGISTRY:
            runtime.add(parts[2])
        elif parts[0] in packages:
            found.add(packages[parts[0]])
    return runtime or found


def converted(tree: ast.Module) -> bool:
    """The module imports dpmigrate's runtime: dpmigrate converted it before."""
    return _names_runtime(_absolute_imports(tree))


def _names_runtime(imported: list[str]) -> bool:
    return any(name == "dpmigrate.runtime" or name.startswith("dpmigrate.runtime.") for name in imported)


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
        self._frameworks: dict[str, set[str]] = {}  # real path -> frameworks (a whole answer, not cut by a cycle)
        self._absolute: dict[str, list[str]] = {}
        self._downloading: dict[str, list[str]] = {}
        self._sources: dict[str, bytes] = {}
        self._whole: dict[str, ast.Module | None] = {}

    def tree(self, path: str, source: bytes | None = None) -> ast.Module | None:
        """The module's import statements (``source`` when the caller has read it already), read once: what
        everything but :meth:`downloading` needs (see :mod:`.import_lines`)."""
        real = os.path.realpath(path)
        if real not in self._trees:
            source = source if source is not None else _read(real)
            self._trees[real] = import_statements(real, source) if source is not None else None
            self._sources[real] = source or b""
        return self._trees[real]

    def whole_tree(self, path: str) -> ast.Module | None:
        """The whole module parsed, once."""
        real = os.path.realpath(path)
        if real not in self._whole:
            source = self._sources[real] if real in self._sources else _read(real)
            self._whole[real] = parse(real, source) if source is not None else None
        return self._whole[real]

    def absolute_imports(self, path: str) -> list[str]:
        real = os.path.realpath(path)
        if real not in self._absolute:
            tree = self.tree(real)
            self._absolute[real] = _absolute_imports(tree) if tree is not None else []
        return self._absolute[real]

    def converted(self, path: str) -> bool:
        """The module imports dpmigrate's runtime: dpmigrate converted it before."""
        return _names_runtime(self.absolute_imports(path))

    def downloading(self, folder: str, file: str) -> list[str]:
        """``module.f`` / ``module.C`` of ``file`` (imported from ``folder``) whose call downloads."""
        real = os.path.realpath(file)
        if real not in self._downloading:
            frameworks = self.frameworks(real)
            if self.tree(real) is None or self.converted(real) or not may_download(self._sources[real], frameworks):
                self._downloading[real] = []
            else:
                tree = self.whole_tree(real)
                self._downloading[real] = downloading_callables("", tree, frameworks) if tree is not None else []
        return [_dotted(folder, file) + name for name in self._downloading[real]]

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
        if real in self._frameworks:
            return self._frameworks[real]
        if real in seen or self.tree(real) is None:
            return set()
        found = _own_frameworks(self.absolute_imports(real), self.packages)
        if not found:
            found = {f for files in self.imports(real).values() for file in files
                     for f in self.frameworks(file, seen | {real})}
        if not seen:  # (below the first call a cycle may cut the answer short: not kept)
            self._frameworks[real] = found
        return found

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
    star: tuple[tuple[str, tuple[str, ...]], ...] = ()  # Options.star_framework_imports
    logging: tuple[str, ...] = ()  # Options.local_logging
    batchnorm: tuple[str, ...] = ()  # Options.local_batchnorm_models
    unreached: tuple[str, ...] = ()  # Options.local_unreached_layer_models
    training: tuple[str, ...] = ()  # Options.local_training_parameters
    trainers: tuple[str, ...] = ()  # Options.local_trainers

    def options(self) -> dict[str, tuple]:
        """The fields of :class:`~dpmigrate.findings.Options` this fills."""
        return {"local_modules": self.names, "local_frameworks": self.frameworks,
                "downloading_functions": self.downloading, "star_framework_imports": self.star,
                "local_logging": self.logging, "local_batchnorm_models": self.batchnorm,
                "local_unreached_layer_models": self.unreached, "local_training_parameters": self.training,
                "local_trainers": self.trainers}


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
    star: dict[str, tuple[str, ...]] = {}
    logging: set[str] = set()
    batchnorm: set[str] = set()
    logs: dict[str, bool] = {}  # real path -> imports logging (a module many files import is read once)
    facts: dict[str, tuple] = {}
    unreached: set[str] = set()
    training: set[str] = set()
    trainers: set[str] = set()
    for path in paths:
        if (source := _read(path)) is None:
            continue
        framework_words = may_use_a_framework(source)
        if not framework_words and not reader.may_import_a_local_module(path, source):
            continue
        tree = reader.tree(path, source)
        imports = reader.imports(path, tree) if tree is not None else {}
        real = os.path.realpath(path)
        imported.update(r for files in imports.values() for r in map(os.path.realpath, files) if r != real)
        through = {(name, f) for name, files in imports.items() for file in files for f in reader.frameworks(file)}
        if not imports or not (framework_words or through):
            continue
        names.update(imports)
        frameworks |= through
        if through and tree is not None:
            star.update(_star_framework_imports(tree, imports, reader, packages))
        logging.update(name for name, files in imports.items() if any(_imports_logging(reader, f, logs) for f in files))
        if _TRAINS.search(source) or not framework_words:  # (nor those of a file naming a framework that trains nothing)
            built, skipped, trains, runs = model_facts(os.path.dirname(real), {f for v in imports.values() for f in v}, facts)
            batchnorm.update(built)
            unreached.update(skipped)
            training.update(trains)
            trainers.update(runs)
        folder = os.path.dirname(real)
        for files in imports.values() if tree is not None and not reader.converted(path) else ():
            for file in files:  # (a converted module guards its own downloads)
                downloading.extend(reader.downloading(folder, file))
        needed[path] = tuple(os.path.relpath(f, folder) for f in reader.closure(f for v in imports.values() for f in v))
    if imported:  # the run's own files among them
        imported &= {os.path.realpath(p) for p in paths}
    return LocalModules(tuple(sorted(names)), tuple(sorted(frameworks)), tuple(dict.fromkeys(downloading)), needed,
                        frozenset(imported), tuple(sorted(star.items())), tuple(sorted(logging)),
                        tuple(sorted(batchnorm)), tuple(sorted(unreached)), tuple(sorted(training)),
                        tuple(sorted(trainers)))


_TRAINS = re.compile(rb"\.(?:backward|fit)\(|DataLoader\(")  # a file that may train (or hand a loader on to a module
# that does): its models' facts matter


def _imports_logging(reader: Reader, path: str, cache: dict[str, bool]) -> bool:
    """``path`` imports the ``logging`` module at its top level (a logger it sets up logs on every rank)."""
    real = os.path.realpath(path)
    if real not in cache:
        source = _read(path)
        tree = reader.tree(path, source) if source is not None and b"logging" in source else None
        cache[real] = tree is not None and any(isinstance(s, ast.Import) and not s.col_offset and any(
            a.name == "logging" for a in s.names) for s in tree.body)
    return cache[real]


def _star_framework_imports(tree: ast.Module, imports: Mapping[str, list[str]], reader: Reader,
                            packages: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """For each local module the file star-imports (``from utils import *``, at its top level), that module's own
    top-level imports of a framework package, as source lines: what the star import binds of the framework. A
    module declaring ``__all__`` is left out (its star import binds only what it lists)."""
    found: dict[str, tuple[str, ...]] = {}
    for node in tree.body:
        if not (isinstance(node, ast.ImportFrom) and node.module and node.level <= 1
                and [a.name for a in node.names] == ["*"] and node.module in imports):
            continue
        files = imports[node.module]
        source = _read(files[0]) if len(files) == 1 else None
        module = reader.tree(files[0], source) if source is not None and b"__all__" not in source else None
        if module is None:
            continue
        lines = []
        for statement in module.body:
            if statement.col_offset:  # an indented import (inside a function): not the module's name
                continue
            if isinstance(statement, ast.Import):
                roots = [a.name.split(".")[0] for a in statement.names]
            elif isinstance(statement, ast.ImportFrom) and statement.level == 0 and statement.module:
                roots = [statement.module.split(".")[0]]
            else:
                continue
            if all(root in packages for root in roots) and not any(a.name == "*" for a in statement.names):
                lines.append(ast.unparse(statement))
        if lines:
            found[node.module] = tuple(lines)
    return found


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

