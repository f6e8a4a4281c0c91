"""Which files of one run are helper modules of a script that was left unchanged.

A script that starts its own processes (Hogwild), or was written for DDP by hand, is left as it
is. Its local modules (``from train import train`` next to it) must then stay as they are too:
converting ``train.py`` alone would shard a loader and average gradients that the untouched script
never set up for, so the project would train differently from both the original and a conversion.

Local imports are read with :mod:`ast` (cheap, no libcst): ``import X``, ``from X import y`` and
``from . import X`` that name a ``.py`` file or package ``__init__.py`` in the importing file's
folder. Helpers of helpers are followed.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import re
from collections.abc import Iterable, Sequence

from .files import Source
from .findings import Conversion, Finding
from .frameworks import may_use_a_framework

RULE = "detect-framework"


@dataclasses.dataclass(frozen=True)
class Held:
    """``path`` stays unchanged because ``script`` (which imports it) was left alone for ``reason``."""

    path: str
    script: str
    reason: str


def local_imports(path: str, source: bytes) -> set[str]:
    """The real paths of the modules next to ``path`` that it imports (empty if it does not parse)."""
    try:
        tree = ast.parse(source, path)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    folder = os.path.dirname(os.path.realpath(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
            elif node.level == 1:
                if node.module:
                    names.add(node.module.split(".")[0])
                else:
                    names.update(alias.name for alias in node.names)
    found = set()
    for name in names:
        for candidate in (os.path.join(folder, f"{name}.py"), os.path.join(folder, name, "__init__.py")):
            if os.path.isfile(candidate):
                found.add(candidate)
    return found


_IMPORT_WORDS = re.compile(rb"^[ \t]*(?:from[ \t]+\.?([A-Za-z_]\w*)|import[ \t]+([A-Za-z_][\w \t,.]*))", re.M)


def imported_by_others(paths: Iterable[str]) -> set[str]:
    """Real paths of the run's files that another file of the run may import (a quick textual scan).

    Only these can turn out to be helpers of a script left alone, so only their writes wait until
    every file is converted; the rest are written as they come. Over-approximates (a name in a
    string counts), never misses a plain ``import``/``from`` line.
    """
    by_folder: dict[str, set[str]] = {}
    real = [os.path.realpath(p) for p in paths]
    for path in real:
        by_folder.setdefault(os.path.dirname(path), set()).add(path)
    found: set[str] = set()
    for path in real:
        folder = os.path.dirname(path)
        try:
            with open(path, "rb") as handle:
                text = handle.read()
        except OSError:
            continue
        for source, names in _IMPORT_WORDS.findall(text):
            words = [source] if source else [w.strip().split(b".")[0] for w in names.split(b",")]
            for word in words:
                for candidate in (f"{word.decode()}.py", os.path.join(word.decode(), "__init__.py")):
                    target = os.path.join(folder, candidate)
                    if target != path and target in by_folder.get(os.path.dirname(target), ()):
                        found.add(target)
    return found


def held_helpers(conversions: Iterable[Conversion]) -> dict[str, Held]:
    """Every converted file (by real path) that a left-alone script of the run imports, directly or not."""
    by_path = {os.path.realpath(c.path): c for c in conversions}
    held: dict[str, Held] = {}
    for real, conversion in by_path.items():
        if conversion.left_alone is None:
            continue
        pending = list(local_imports(conversion.path, conversion.original))
        while pending:
            helper = pending.pop()
            if helper in held or helper == real or helper not in by_path:
                continue
            held[helper] = Held(by_path[helper].path, conversion.path, conversion.left_alone)
            pending.extend(local_imports(helper, by_path[helper].original))
    return held


def hold(conversion: Conversion, held: Held) -> Conversion:
    """``conversion`` undone: the original bytes, and one finding saying why."""
    reason = held.reason.removesuffix("; left unchanged")
    finding = Finding(
        conversion.path, 1, 1, RULE, "declined",
        f"a helper module of {held.script}, which is left unchanged ({reason}); converting this module alone "
        "would change how that script trains",
        f"convert {held.script} by hand (or restructure it for one process per rank), then its modules",
    )
    return dataclasses.replace(conversion, output=conversion.original, findings=(finding,))


@dataclasses.dataclass
class Hints:
    """What the scripts of a run do with what one local module returns: that module's conversion options."""

    path: str  # as shown to the user (beside the script that imports it)
    script: str
    roles: set[tuple[str, int, str]] = dataclasses.field(default_factory=set)

    def returned_roles(self) -> tuple[tuple[str, int, str], ...]:
        return tuple(sorted(self.roles))

    def source_beside(self, sources: Sequence[Source]) -> Source:
        """A Source for this module, its ``relative`` (for ``-o``) beside the script that imports it."""
        script = next(s for s in sources if s.path == self.script)
        relative = os.path.relpath(self.path, os.path.dirname(script.path) or ".")
        return Source(self.path, os.path.join(os.path.dirname(script.relative), relative))


def training_hints(conversions: Iterable[Conversion]) -> dict[str, Hints]:
    """Local modules (by real path) whose functions return loaders that a script of the run trains on.

    ``from data import get_loaders`` / ``import data`` resolve to ``data.py`` (or ``data/__init__.py``)
    beside the script; ``pkg.data.get_loaders`` to ``pkg/data.py``.
    """
    hints: dict[str, Hints] = {}
    for conversion in conversions:
        folder = os.path.dirname(conversion.path)
        for qualified, position in conversion.imported_training_returns:
            *module, function = qualified.split(".")
            if not module:
                continue
            for relative in (os.path.join(*module) + ".py", os.path.join(*module, "__init__.py")):
                shown = os.path.join(folder, relative)
                if os.path.isfile(shown):
                    real = os.path.realpath(shown)
                    entry = hints.setdefault(real, Hints(shown, conversion.path))
                    entry.roles.add((function, position, "train"))
                    break
    return hints


def read_as_local_module(conversion: Conversion, hints: Hints) -> Conversion:
    """``conversion`` of a module the run was not asked to convert, with a note saying why it was."""
    functions = ", ".join(sorted({f"{f}()" for f, _, _ in hints.roles}))
    note = Finding(
        conversion.path, 1, 1, RULE, "note",
        f"read as a local module of {hints.script}, which trains on the loaders {functions} returns: "
        "converted with it so that they are sharded",
    )
    return dataclasses.replace(conversion, findings=(note, *conversion.findings))


_FETCH_WORDS = {"urlretrieve", "urlopen", "download_url", "download_url_to_file", "load_state_dict_from_url",
                "download_and_extract_archive", "gdown"}


def _local_modules(paths: Iterable[str]) -> set[str]:
    """The real paths of the local modules the run's training files import.

    Only a file that may use a framework can be a script whose helpers matter, so the others are not
    parsed (a folder of ordinary modules, as pre-commit hands over, is not read twice with ``ast``)."""
    found: set[str] = set()
    for path in paths:
        try:
            with open(path, "rb") as handle:
                source = handle.read()
        except OSError:
            continue
        if may_use_a_framework(source):
            found |= local_imports(path, source)
    return found


def _module_name(helper: str) -> str:
    """``data`` for ``.../data.py`` and for ``.../data/__init__.py``."""
    if helper.endswith("__init__.py"):
        return os.path.basename(os.path.dirname(helper))
    return os.path.basename(helper)[:-3]


def local_module_names(paths: Iterable[str]) -> tuple[str, ...]:
    """The names the run's files import their local modules by (``data`` for ``data.py``)."""
    return tuple(sorted({_module_name(h) for h in _local_modules(paths)}))


def downloading_functions(paths: Iterable[str]) -> tuple[str, ...]:
    """``module.function`` for the functions of the run's local modules that download, directly or
    through another function of theirs (``get_training_set()`` -> ``download_bsd300()`` ->
    ``urllib.request.urlopen``): a script calling one must run that call on the main process first."""
    modules = {helper: _module_name(helper) for helper in _local_modules(paths)}
    found: list[str] = []
    for helper, name in sorted(modules.items()):
        try:
            with open(helper, "rb") as handle:
                tree = ast.parse(handle.read(), helper)
        except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        downloading = {f for f, node in functions.items() if _fetches(node)}
        changed = True
        while changed:
            changed = False
            for f, node in functions.items():
                if f not in downloading and _called(node) & downloading:
                    downloading.add(f)
                    changed = True
        found.extend(f"{name}.{f}" for f in sorted(downloading))
    return tuple(found)


def _fetches(node: ast.AST) -> bool:
    for call in ast.walk(node):
        if not isinstance(call, ast.Call):
            continue
        func = call.func
        word = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if word in _FETCH_WORDS or (word == "get" and isinstance(func, ast.Attribute)
                                     and isinstance(func.value, ast.Name) and func.value.id == "requests"):
            return True
        if any(k.arg == "download" and isinstance(k.value, ast.Constant) and k.value.value is True for k in call.keywords):
            return True
    return False


def _called(node: ast.AST) -> set[str]:
    return {c.func.id for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}
