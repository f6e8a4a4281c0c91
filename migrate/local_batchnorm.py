"""The classes and functions of a script's local modules that build batch normalisation layers.

Why: a model written in ``models/resnet.py`` (``self.bn1 = nn.BatchNorm2D(64)``) and built by the script
(``model = ResNet18()``) normalises over each rank's share once launched, like one written in the script, but
the batch-norm note looked only at the script's own calls (image_classification_paddle, issue 19 audit: its
ranks printed different validation figures with nothing said). Named as the script imports them
(``models.resnet.ResNet18``), they join the framework's library models in ``BatchNormLayers``.
A module is parsed only when its text names a batch normalisation class.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterable

_MARK = b"BatchNorm"  # torch BatchNorm2d, Paddle BatchNorm2D, Keras BatchNormalization, SyncBatchNorm


def batchnorm_builders(folder: str, files: Iterable[str], cache: dict[str, tuple[str, ...]]) -> list[str]:
    """``module.Name`` (dotted from ``folder``) of each top-level class or function of ``files`` that builds a
    batch normalisation layer, directly or through another such definition of its module. ``cache`` (real path
    -> names) is the run's: a module many files import is read once."""
    found: list[str] = []
    for file in files:
        real = os.path.realpath(file)
        names = cache.get(real)
        if names is None:
            names = cache[real] = _builders_of(file)
        if names:
            module = os.path.relpath(file, folder).removesuffix(".py").replace(os.sep, ".").removesuffix(".__init__")
            found.extend(f"{module}.{name}" for name in names)
    return found


def _builders_of(file: str) -> tuple[str, ...]:
    try:
        with open(file, "rb") as f:
            source = f.read()
    except OSError:
        return ()
    if _MARK not in source:
        return ()
    try:
        tree = ast.parse(source, file)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()
    return tuple(sorted(_builders(tree)))


def _builders(tree: ast.Module) -> set[str]:
    definitions = {d.name: d for d in tree.body if isinstance(d, (ast.ClassDef, ast.FunctionDef))}
    names = {d: {n.id if isinstance(n, ast.Name) else n.attr for n in ast.walk(node)
                 if isinstance(n, (ast.Name, ast.Attribute))} for d, node in definitions.items()}
    builders = {d for d, used in names.items() if any("BatchNorm" in u for u in used)}
    changed = True
    while changed:  # def resnet18(): return ResNet(BasicBlock, ...)
        changed = False
        for d, used in names.items():
            if d not in builders and used & builders:
                builders.add(d)
                changed = True
    return builders
