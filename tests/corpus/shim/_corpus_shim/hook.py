"""Patch a module right after it is first imported, so the shim touches only the frameworks a script imports.

Why not import the frameworks and patch them up front: importing torch, TensorFlow or Paddle costs seconds, and
TensorFlow then Paddle in one process segfaults. A meta-path finder instead wraps the loader of the few modules
the shim knows (``keras.src.datasets.mnist``, ``torchvision.datasets.cifar``, ...); the patch runs once the module
is built and before anything imports names from it, so re-exports (``keras.datasets.mnist.load_data``,
``tf.keras.datasets...``) bind the patched objects. The same mechanism as dpmigrate's verify harness
(``dpmigrate.verify.harness.after_import``), written again so the shim depends on none of dpmigrate's internals
and its messages name the shim.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable


class AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callbacks[name](module)`` when the module ``name`` has finished importing."""

    def __init__(self, callbacks: dict[str, Callable[[object], None]]):
        self.callbacks = callbacks
        self._busy: set[str] = set()

    def find_spec(self, fullname, path, target=None):
        callback = self.callbacks.get(fullname)
        if callback is None or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:  # the spec the other finders would give
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Then(spec.loader, callback, fullname)
        return spec


class _Then(importlib.abc.Loader):
    def __init__(self, loader, callback, name):
        self.loader, self.callback, self.name = loader, callback, name

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self.loader  # the module sees its own loader (resources, reloads)
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        _patch(self.name, self.callback, module)


def _patch(name, callback, module) -> None:
    try:
        callback(module)
    except Exception as e:  # say it loudly: the script will then try to download, and fail for want of network
        print(f"dpmigrate corpus shim: could not patch {name}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def install(callbacks: dict[str, Callable[[object], None]]) -> None:
    """Put the finder first on ``sys.meta_path`` (once per process), and patch any of the modules already imported."""
    if any(getattr(f, "dpmigrate_corpus_shim", False) for f in sys.meta_path):
        return
    finder = AfterImport(callbacks)
    finder.dpmigrate_corpus_shim = True
    sys.meta_path.insert(0, finder)
    for name, callback in callbacks.items():
        if name in sys.modules:
            _patch(name, callback, sys.modules[name])
