"""The registry: which frameworks the codemod and the launcher know, and where each one's parts are.

One entry per framework: the top-level packages whose import means a script is written for it, and
the rule package that holds its conversion rules and its :class:`~dpmigrate.codemod.vocabulary.
Vocabulary` (``RULES`` and ``VOCABULARY``; a package with no rules yet still describes the
framework, so that detection can say which generation a file is and that it is not converted yet).
Adding a framework is a folder of rules plus one entry here; the engine asks nothing else.

Plain data, no imports of libcst or of any framework, so ``dpmigrate launch`` can use it cheaply.
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any


@dataclasses.dataclass(frozen=True)
class Framework:
    name: str  # "torch": also the name of its runtime module, dpmigrate.runtime.<name>
    packages: tuple[str, ...]  # top-level packages: importing one means the file uses this framework
    rules: str  # the module holding RULES (the rule classes, in order) and VOCABULARY

    def rule_set(self) -> Any:
        """The framework's rule package (imported on first use: it loads libcst)."""
        return importlib.import_module(self.rules)


REGISTRY: dict[str, Framework] = {
    f.name: f
    for f in (
        Framework("torch", ("torch", "torchvision", "torchaudio", "torchtext"), "dpmigrate.rules.torch"),
        Framework("tensorflow", ("tensorflow", "keras", "tf_keras"), "dpmigrate.rules.tensorflow"),
        Framework("paddle", ("paddle", "paddlenlp"), "dpmigrate.rules.paddle"),
    )
}


def framework_of_package(package: str) -> str | None:
    """``"torchvision"`` -> ``"torch"``; None for a package no registered framework owns."""
    for framework in REGISTRY.values():
        if package in framework.packages:
            return framework.name
    return None


FRAMEWORK_OF_PACKAGE = {p: f.name for f in REGISTRY.values() for p in f.packages}  # the launcher's view


def may_use_a_framework(source: bytes) -> bool:
    """False when no framework's package name appears anywhere in ``source``: such a file cannot import
    one, so it is returned unchanged without parsing it (nor loading libcst, for a pre-commit run)."""
    return any(package.encode() in source for framework in REGISTRY.values() for package in framework.packages)
