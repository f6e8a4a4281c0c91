"""Which names a file imports from its local modules, and where a call's returned values land.

Why: the loader flow follows what a local module's function returns (``train_loader, _ = data.get_loaders()``)
into the script's loops; these are its plain-syntax helpers, apart from the flow itself.
"""

from __future__ import annotations

import libcst as cst


def names_imported_from(module: cst.Module, modules: set[str]) -> set[str]:
    """Names the file's top-level imports bind from ``modules`` (``import data``, ``from data import f``)."""
    names: set[str] = set()
    for statement in module.body:
        for small in statement.body if isinstance(statement, cst.SimpleStatementLine) else ():
            if isinstance(small, cst.Import):
                for alias in small.names:
                    full = _dotted(alias.name)
                    if full.split(".")[0] in modules:
                        names.add(alias.asname.name.value if alias.asname else full.split(".")[0])
            elif isinstance(small, cst.ImportFrom) and small.module is not None and len(small.relative) <= 1:
                if _dotted(small.module).split(".")[0] in modules and not isinstance(small.names, cst.ImportStar):
                    names.update(a.asname.name.value if a.asname else _dotted(a.name) for a in small.names)
            elif isinstance(small, cst.ImportFrom) and small.module is None and len(small.relative) == 1:
                if not isinstance(small.names, cst.ImportStar):  # from . import data
                    names.update(a.asname.name.value if a.asname else _dotted(a.name) for a in small.names
                                 if _dotted(a.name) in modules)
    return names


def _dotted(node: cst.BaseExpression) -> str:
    if isinstance(node, cst.Attribute):
        return f"{_dotted(node.value)}.{node.attr.value}"
    return node.value if isinstance(node, cst.Name) else ""


def root_name(node: cst.BaseExpression) -> str | None:
    while isinstance(node, cst.Attribute):
        node = node.value
    return node.value if isinstance(node, cst.Name) else None


def received_positions(statement, call: cst.Call) -> list[tuple[int, str]]:
    """(return position, name) for ``x = f()`` (position -1) and ``a, b = f()``."""
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
        return []
    assign = statement.body[0]
    if not (isinstance(assign, cst.Assign) and assign.value is call and len(assign.targets) == 1):
        return []
    target = assign.targets[0].target
    if isinstance(target, cst.Name):
        return [(-1, target.value)]
    if isinstance(target, (cst.Tuple, cst.List)) and not any(isinstance(e, cst.StarredElement) for e in target.elements):
        return [(i, e.value.value) for i, e in enumerate(target.elements) if isinstance(e.value, cst.Name)]
    return []


def local_trainer_calls(module: cst.Module, index, modules: tuple[str, ...], trainers: tuple[str, ...]) -> list[cst.Call]:
    """The file's calls of a local module's function that trains (``train_model()`` from ``trainlib``, found by
    :func:`dpmigrate.local.models.model_facts`): an entry point that only calls it trains (the stochastic-depth
    ResNet's ``main.py``, left with 0 changes while each rank trained alone)."""
    roots = names_imported_from(module, set(modules))
    if not roots or not trainers:
        return []
    wanted = set(trainers)
    return [call for call in index.of_type(module, cst.Call) if root_name(call.func) in roots and any(
        q.lstrip(".") in wanted for name in modules for q in index.qualified_names_under(call.func, name))]
