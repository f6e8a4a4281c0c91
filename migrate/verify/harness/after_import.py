"""Run a callback once a module has finished importing: how the verify harness meets the frameworks.

Why: the harness must patch torch, Paddle or Keras as the script imports them (never importing one itself: one
framework per process), and a submodule such as ``paddle.io.dataloader.fetcher`` as it is built. A meta-path
finder wraps the module's own loader; the module sees its own loader afterwards.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable


class AfterImport(importlib.abc.MetaPathFinder):
    """Runs a callback when a module (a package or one of its modules) has finished importing (the module exists, fully built)."""

    def __init__(self, callbacks: dict[str, Callable[[object], None]], who: str = "dpmigrate verify: harness"):
        self.callbacks, self.who = callbacks, who  # who: the name a failed callback's message gives
        self._busy: set[str] = set()

    def find_spec(self, fullname, path, target=None):
        callback = self.callbacks.get(fullname)
        if callback is None or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy.discard(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Then(spec.loader, callback, fullname, self.who)
        return spec


class _Then(importlib.abc.Loader):
    def __init__(self, loader, callback, name, who):
        self.loader, self.callback, self.name, self.who = loader, callback, name, who

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self.loader  # the module sees its own loader (resources, reloads)
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        run_callback(self.callback, module, self.name, self.who)


def run_callback(callback: Callable[[object], None], module, name: str, who: str) -> None:
    try:
        callback(module)
    except Exception as e:  # never what breaks a run: say it, go on
        print(f"{who}: could not prepare {name}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
