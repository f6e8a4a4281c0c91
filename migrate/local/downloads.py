"""What a local module downloads when one of its functions is called or one of its classes is built.

Why: N ranks downloading into one folder at once corrupt each other's files, so a script's call of
``data.training_set()`` (which fetches an archive two calls down) or ``models.LeafNet()`` (whose ``__init__``
fetches pretrained weights) must run on the main process first, like a download in the script itself
(``download-main-process-first`` reads the names this finds from ``Options.downloading_functions``). Read
with :mod:`ast`: the words every framework's downloads share (``urlretrieve``, ``download=True``...), and the
framework's own download and pretrained-weight calls, from its vocabulary, by the names the module imports
them as (``models.resnet18(weights="DEFAULT")`` after ``from torchvision import models``).
"""

from __future__ import annotations

import ast
import re

from ..frameworks import REGISTRY

_FETCH_WORDS = {"urlretrieve", "urlopen", "download_url", "download_url_to_file", "load_state_dict_from_url",
                "download_and_extract_archive", "gdown"}
_PRETRAINED_KEYWORDS = ("pretrained", "weights")


def downloading_callables(module: str, tree: ast.Module, frameworks: set[str]) -> list[str]:
    """``module.f`` for its functions that download, directly or through another of its functions
    (``get_training_set()`` -> ``download_bsd300()`` -> ``urllib.request.urlopen``), and ``module.C`` for its
    classes whose construction does (``__init__`` fetching pretrained weights, or calling what does).
    An empty ``module`` gives the bare names (``.f``), for a caller that prefixes them later."""
    runs: dict[str, list[ast.AST]] = {}  # a callable's name -> the code a call of it runs
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            runs[node.name] = [node]
        elif isinstance(node, ast.ClassDef):
            methods = {m.name: m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
            if "__init__" in methods:
                init = methods["__init__"]
                runs[node.name] = [init, *(methods[n] for n in sorted(_self_calls(init)) if n in methods)]
    if not runs:
        return []
    fetching = _Fetching(tree, frameworks)
    downloading = {name for name, parts in runs.items() if any(fetching.fetches(p) for p in parts)}
    calls = {name: set().union(*map(_called, parts)) for name, parts in runs.items() if name not in downloading}
    changed = True
    while changed:
        changed = False
        for name, called in calls.items():
            if name not in downloading and called & downloading:
                downloading.add(name)
                changed = True
    return [f"{module}.{name}" for name in sorted(downloading)]


def may_download(source: bytes, frameworks: set[str]) -> bool:
    """False when no call in ``source`` can fetch (so :func:`downloading_callables` need not read it): none of
    the shared download words is written, nor every part of one of the framework's download or
    pretrained-weight names (a qualified name is made of words its file writes)."""
    words = set(re.findall(rb"[A-Za-z_]\w*", source))
    if words & _SHARED_WORDS:
        return True
    vocabularies = [REGISTRY[f].rule_set().VOCABULARY for f in sorted(frameworks)]
    return any(all(part.encode() in words for part in prefix.strip(".").split("."))
               for v in vocabularies for prefix in (*v.download_prefixes, *v.pretrained_prefixes))


_SHARED_WORDS = {w.encode() for w in (*_FETCH_WORDS, "download", "requests")}


class _Fetching:
    """Whether code fetches files: the download words every framework shares, and the framework's own
    download and pretrained-weight calls (its vocabulary's, by the names the module imports them as)."""

    def __init__(self, tree: ast.Module, frameworks: set[str]) -> None:
        self.tree, self.frameworks = tree, frameworks
        self._aliases: dict[str, str] | None = None
        self._prefixes: tuple[tuple[str, ...], tuple[str, ...]] | None = None

    def fetches(self, node: ast.AST) -> bool:
        for call in ast.walk(node):
            if not isinstance(call, ast.Call):
                continue
            func = call.func
            word = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if word in _FETCH_WORDS or (word == "get" and isinstance(func, ast.Attribute)
                                         and isinstance(func.value, ast.Name) and func.value.id == "requests"):
                return True
            if any(k.arg == "download" and isinstance(k.value, ast.Constant) and k.value.value is True
                   for k in call.keywords):
                return True
            if self.frameworks and self._framework_fetch(call, word):
                return True
        return False

    def _framework_fetch(self, call: ast.Call, word: str) -> bool:
        qualified = self._qualified(call.func)
        if qualified is None:
            return False
        downloads, pretrained = self._vocabulary()
        if any(_under(qualified, prefix) for prefix in downloads):
            return True
        return (word == "from_pretrained" or _pretrained(call)) and any(_under(qualified, p) for p in pretrained)

    def _vocabulary(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        if self._prefixes is None:  # the rule packages load only for a module that may fetch this way
            vocabularies = [REGISTRY[f].rule_set().VOCABULARY for f in sorted(self.frameworks)]
            self._prefixes = (tuple(p for v in vocabularies for p in v.download_prefixes),
                              tuple(p for v in vocabularies for p in v.pretrained_prefixes))
        return self._prefixes

    def _qualified(self, func: ast.expr) -> str | None:
        """``torchvision.models.resnet18`` for ``models.resnet18`` after ``from torchvision import models``."""
        parts: list[str] = []
        while isinstance(func, ast.Attribute):
            parts.insert(0, func.attr)
            func = func.value
        if not isinstance(func, ast.Name):
            return None
        if self._aliases is None:
            self._aliases = _import_aliases(self.tree)
        root = self._aliases.get(func.id)
        return ".".join([root, *parts]) if root else None


def _import_aliases(tree: ast.Module) -> dict[str, str]:
    """The names a module's imports bind -> what they name (``models`` -> ``torchvision.models``)."""
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    aliases[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return aliases


def _under(name: str, prefix: str) -> bool:
    return name.startswith(prefix) if prefix.endswith(".") else name == prefix or name.startswith(prefix + ".")


def _pretrained(call: ast.Call) -> bool:
    """``pretrained=True`` (anything but False/None) or ``weights=`` anything but None, as the download rule reads it."""
    for keyword in call.keywords:
        if keyword.arg in _PRETRAINED_KEYWORDS:
            return not (isinstance(keyword.value, ast.Constant) and keyword.value.value in (None, False))
    return False


def _called(node: ast.AST) -> set[str]:
    return {c.func.id for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}


def _self_calls(function: ast.AST) -> set[str]:
    """``helper`` for ``self.helper(...)`` in a method."""
    return {c.func.attr for c in ast.walk(function) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
            and isinstance(c.func.value, ast.Name) and c.func.value.id == "self"}
