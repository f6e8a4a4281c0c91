"""Patch a module right after it is first imported, so the shim touches only the frameworks a script imports.

Why not import the frameworks and patch them up front: importing torch, TensorFlow or Paddle costs seconds, and
TensorFlow then Paddle in one process segfaults. The verify harness's meta-path finder
(:class:`dpmigrate.verify.harness.after_import.AfterImport`) wraps the loader of the few modules the shim knows
(``keras.src.datasets.mnist``, ``torchvision.datasets.cifar``, ...); the patch runs once the module is built and
before anything imports names from it, so re-exports (``keras.datasets.mnist.load_data``, ``tf.keras.datasets...``)
bind the patched objects. A patch that fails says so, naming the shim: the script will then try to download, and
fail for want of network.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from dpmigrate.verify.harness.after_import import AfterImport, run_callback

WHO = "dpmigrate corpus shim"


def install(callbacks: dict[str, Callable[[object], None]]) -> None:
    """Put the finder first on ``sys.meta_path`` (once per process), and patch any of the modules already imported."""
    if any(getattr(f, "dpmigrate_corpus_shim", False) for f in sys.meta_path):
        return
    finder = AfterImport(callbacks, who=WHO)
    finder.dpmigrate_corpus_shim = True
    sys.meta_path.insert(0, finder)
    for name, callback in callbacks.items():
        if name in sys.modules:
            run_callback(callback, sys.modules[name], name, WHO)
