"""Whether a loop reading a DataLoader trains: its body runs a backward pass or an optimizer step, directly, through
the file's functions, or through a method of its own class; and not when the call that handed the loader to the
loop's function tells it not to (``epoch(test_loader, training=False)``).

Split from :mod:`.loaders` (the data flow: which loops read a loader), which decides a loader's role with it.
"""

from __future__ import annotations

import dataclasses

import libcst as cst

from . import patterns as m
from .flow import self_attribute
from .query import Query, body_statements


@dataclasses.dataclass
class Loop:
    """A ``for`` loop reading a loader, and the variable it reads it through (None: inline call)."""

    node: cst.For
    variable: str | None
    scope: cst.CSTNode  # the function (or module) the loop is in
    via: cst.Call | None = None  # the call that handed the loader to the loop's function, when it is one of the file's


@dataclasses.dataclass
class ClassLoop(Loop):
    """A loop in a method of ``cls``: its training is judged with the class's own methods."""

    cls: cst.ClassDef | None = None


def loop_trains(query: Query, loop: Loop) -> bool:
    """The loop's body trains, directly or through a method of its own class (``loss = self.train_step(data)``:
    the chapter-2 trainer of awesome-DeepLearning, whose loader was taken for an evaluation loader)."""
    if query.trains(loop.node.body):
        return not _trains_only_when_told(query, loop)
    cls = loop.cls if isinstance(loop, ClassLoop) else None
    if cls is None:
        cls = next((a for a in query.ancestors(loop.node) if isinstance(a, cst.ClassDef)), None)
    if cls is not None:
        return bool(_self_calls(query, loop.node.body) & _training_methods(query, cls))
    return False


def _trains_only_when_told(query: Query, loop: Loop) -> bool:
    """The loop trains only under ``if training:`` on a parameter of its function, and the call that handed it this
    loader says False (``epoch(test_loader, training=False)``, CNN_DSMC: one function for both loaders, whose
    validation loader was sharded as a training one and its printed sums became rank 0's share)."""
    function, call = loop.scope, loop.via
    if call is None or not isinstance(function, cst.FunctionDef):
        return False
    told_false = {p for p in _parameter_names(function) if _false_at(function, call, p)}
    if not told_false:
        return False
    for statement in body_statements(loop.node):
        if isinstance(statement, cst.If) and m.matches(statement.test, m.Name()) and statement.test.value in told_false:
            if statement.orelse is not None and query.trains(statement.orelse):
                return False
            continue
        if query.trains(statement):
            return False
    return True


def _parameter_names(function: cst.FunctionDef) -> list[str]:
    return [p.name.value for p in (*function.params.posonly_params, *function.params.params)]


def _false_at(function: cst.FunctionDef, call: cst.Call, parameter: str) -> bool:
    """``parameter`` is the literal False in ``call`` (by keyword or position), or left to a default of False."""
    names = _parameter_names(function)
    for index, arg in enumerate(call.args):
        if arg.star:
            return False
        if (arg.keyword is not None and arg.keyword.value == parameter) or (
                arg.keyword is None and index < len(names) and names[index] == parameter):
            return m.matches(arg.value, m.Name("False"))
    default = next((p.default for p in function.params.params if p.name.value == parameter), None)
    return default is not None and m.matches(default, m.Name("False"))


def _self_calls(query: Query, node: cst.CSTNode) -> set[str]:
    return {c.func.attr.value for c in query.index.of_type(node, cst.Call)
            if isinstance(c.func, cst.Attribute) and self_attribute(c.func) is not None}


def _training_methods(query: Query, cls: cst.ClassDef) -> set[str]:
    """Methods of ``cls`` that run a backward pass or a step, directly or through other methods."""
    methods = {s.name.value: s for s in body_statements(cls) if isinstance(s, cst.FunctionDef)}
    found = {name for name, fn in methods.items() if query.trains(fn.body)}
    changed = True
    while changed:
        changed = False
        for name, fn in methods.items():
            if name not in found and _self_calls(query, fn.body) & found:
                found.add(name)
                changed = True
    return found
