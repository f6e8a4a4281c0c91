"""The corpus's synthetic-data shim: dataset downloads replaced by deterministic data of the same shapes.

:func:`install` hooks the modules named in :data:`HOOKED` (:mod:`.hook`): as the script first imports one, the
submodule that knows it (:mod:`.keras_data`, :mod:`.torchvision_data`, :mod:`.paddle_data`) patches it. Nothing is
imported before that, not even numpy, so a process that never loads a data set (``dpmigrate verify`` itself, a
launcher) pays nothing. The data comes from :mod:`.synth`: seeded by data set and split, the same in every process.
"""

from __future__ import annotations

import importlib

_KERAS = ("mnist", "fashion_mnist", "cifar10", "cifar100", "imdb", "reuters", "boston_housing", "california_housing")

# module patched -> the submodule whose patch(module) patches it (its HOOKS table; a test checks the two agree)
HOOKED = {
    **{f"{keras}.{name}": "keras_data" for keras in ("keras.src.datasets", "tf_keras.src.datasets") for name in _KERAS},
    "keras.src.utils.file_utils": "keras_data",
    "tf_keras.src.utils.data_utils": "keras_data",
    **{f"torchvision.datasets.{name}": "torchvision_data" for name in ("mnist", "cifar", "svhn", "stl10")},
    **{f"paddle.vision.datasets.{name}": "paddle_data" for name in ("mnist", "cifar")},
    **{f"paddle.text.datasets.{name}": "paddle_data" for name in ("imdb", "uci_housing")},
}


def _patcher(submodule: str):
    def patch(module) -> None:
        importlib.import_module(f"{__name__}.{submodule}").HOOKS[module.__name__](module)

    return patch


def install() -> None:
    from . import hook

    hook.install({name: _patcher(submodule) for name, submodule in HOOKED.items()})
