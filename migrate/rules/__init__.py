"""Conversion rules: one package per framework (``torch/``, ``paddle/``, ``tensorflow/``), and
``common/`` for the rules that are one idea everywhere. Each framework package holds ``RULES`` and
``VOCABULARY``; the registry (``dpmigrate.frameworks``) says which package serves which framework.
The machinery the rules stand on (tree index, edit plan, queries, analyses, ``Rule``) is
``dpmigrate.codemod``.
"""

from __future__ import annotations

import inspect


def all_rules() -> list:
    """Every rule of every framework, each name once (a shared rule a framework adapts, e.g. TensorFlow's
    that skip TF1 graph files, is the same rule), in the order the frameworks list them."""
    from ..frameworks import REGISTRY

    seen: list = []
    for framework in REGISTRY.values():
        for rule in framework.rule_set().RULES:
            if rule.name not in {r.name for r in seen}:
                seen.append(rule)
    return seen


def rule_catalog() -> list[tuple[str, str]]:
    """(name, docstring) of every rule the engine runs: ``--list-rules`` and the SARIF report's rule table."""
    return [(rule.name, inspect.cleandoc(rule.__doc__ or rule.name)) for rule in all_rules()]
