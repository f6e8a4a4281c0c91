"""Where a value goes between the functions and classes of one file: returns, callers, constructors.

Shared by the analyses that follow a model or a DataLoader out of the function that builds it: a
factory that returns it (``def build(): ...; return model, optimizer``) hands it to the one caller
that receives it, and a class constructor (``Trainer(model, loader)``) keeps it in an attribute
(``self.model = model.to(device)``) that its methods use. Each helper answers one such question
and returns None when the answer is not certain, so callers decline instead of guessing.
"""

from __future__ import annotations

import libcst as cst

from . import patterns as m
from .query import Query, body_statements


def returned_at(query: Query, function: cst.FunctionDef, name: str) -> int | None:
    """Where ``function`` returns ``name``: -1 alone (``return model``), k in a tuple, None if it does not."""
    for ret in query.index.of_type(function, cst.Return):
        if query.function_of(ret) is not function or ret.value is None:
            continue
        value = ret.value
        if isinstance(value, cst.Name) and value.value == name:
            return -1
        if isinstance(value, cst.Tuple):
            for index, element in enumerate(value.elements):
                if isinstance(element.value, cst.Name) and element.value.value == name:
                    return index
    return None


def receiver(query: Query, call: cst.Call, position: int) -> tuple[cst.BaseStatement, str] | None:
    """(statement, name) for ``x = factory()`` / ``a, x, b = factory()`` receiving the returned model."""
    statement = query.statement_of(call)
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
        return None
    assign = statement.body[0]
    if not (isinstance(assign, cst.Assign) and assign.value is call and len(assign.targets) == 1):
        return None
    target = assign.targets[0].target
    if position == -1:
        return (statement, target.value) if isinstance(target, cst.Name) else None
    if isinstance(target, (cst.Tuple, cst.List)) and position < len(target.elements):
        element = target.elements[position].value
        if isinstance(element, cst.Name) and not any(isinstance(e, cst.StarredElement) for e in target.elements):
            return statement, element.value
    return None


def method(cls: cst.ClassDef, name: str) -> cst.FunctionDef | None:
    return next((s for s in body_statements(cls) if isinstance(s, cst.FunctionDef) and s.name.value == name), None)


def parameter_for(call: cst.Call, init: cst.FunctionDef, name: str) -> str | None:
    """The ``__init__`` parameter that receives the variable ``name`` in ``Cls(...)``."""
    params = [p.name.value for p in (*init.params.posonly_params, *init.params.params)][1:]  # after self
    positional = 0
    for arg in call.args:
        if arg.star:
            return None
        if arg.keyword is None:
            if isinstance(arg.value, cst.Name) and arg.value.value == name:
                return params[positional] if positional < len(params) else None
            positional += 1
        elif isinstance(arg.value, cst.Name) and arg.value.value == name:
            return arg.keyword.value
    return None


def attribute_assigned_from(query: Query, statement: cst.CSTNode, parameter: str) -> str | None:
    """``self.model = model.to(device)`` (or ``= model``) gives ``"model"`` for the parameter ``model``."""
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
        return None
    assign = statement.body[0]
    if not (isinstance(assign, cst.Assign) and len(assign.targets) == 1):
        return None
    target = assign.targets[0].target
    value = assign.value
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        value = value.func.value  # model.to(device).float() -> model
    if (isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == "self"
            and isinstance(value, cst.Name) and value.value == parameter):
        return target.attr.value
    return None


def callers(query: Query, function: cst.FunctionDef) -> list[cst.Call]:
    """Every call of the module-level ``function`` by its plain name."""
    return [c for c in query.index.of_type(query.module, cst.Call)
            if isinstance(c.func, cst.Name) and c.func.value == function.name.value]


def module_classes(query: Query) -> dict[str, cst.ClassDef]:
    return {s.name.value: s for s in query.module.body if isinstance(s, cst.ClassDef)}


def self_attribute(node: cst.CSTNode) -> str | None:
    """``"loader"`` for ``self.loader``."""
    if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.value.value == "self":
        return node.attr.value
    return None


def method_calls(query: Query, scope: cst.CSTNode) -> list[tuple[cst.Call, cst.FunctionDef]]:
    """``runner.train(train_loader, ...)`` where ``runner = Trainer(...)`` in ``scope``, and ``self.train_epoch(
    loader)`` inside a class of the file: (call, the method called). image_classification_paddle (issue 19
    audit) handed its loaders to a trainer object's ``train``, which handed them to ``train_epoch``: the loader
    was declined as one whose use could not be told."""
    classes = module_classes(query)
    if not classes:
        return []
    made: dict[str, cst.ClassDef] = {}
    for statement in query.index.of_type(scope, cst.SimpleStatementLine):
        small = statement.body[0] if len(statement.body) == 1 else None
        if (isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.targets[0].target, cst.Name)
                and isinstance(small.value, cst.Call) and isinstance(small.value.func, cst.Name)
                and small.value.func.value in classes):
            made[small.targets[0].target.value] = classes[small.value.func.value]
    own = next((a for a in query.ancestors(scope) if isinstance(a, cst.ClassDef)), None)
    found = []
    for call in query.findall(scope, m.Call(func=m.Attribute(value=m.Name(), attr=m.Name()))):
        holder = call.func.value.value
        cls = own if holder == "self" else made.get(holder)
        function = method(cls, call.func.attr.value) if cls is not None else None
        if function is not None and function is not scope:
            found.append((call, function))
    return found
