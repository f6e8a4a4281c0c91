"""Data flow for DataLoaders: which loops read a loader's batches, and whether those loops train.

A loader's role is decided from where its batches go, never from its name: a loader iterated by a
loop that runs ``backward()`` or an optimizer step (directly or through a function it calls)
trains; one whose loops never do evaluates; one whose batches cannot be followed (stored in an
attribute, handed to ``iter()``, returned) is "unknown" and its rule declines. Loaders passed as
arguments are followed into the module's own functions, a few calls deep. Which calls build a
loader is the vocabulary's ``data_loaders``.

One :class:`LoaderFlow` per file (``ctx.analysis(LoaderFlow)``) serves every rule that needs it:
the training-loader rule shards ``sharded_training()``, and the batch-size and dataset-average
rules act on the same loaders without depending on that rule having run.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import libcst as cst

from . import patterns as m
from .query import Query

Role = Literal["train", "eval", "unknown"]
_MAX_DEPTH = 3


@dataclasses.dataclass
class Loop:
    """A ``for`` loop reading a loader, and the variable it reads it through (None: inline call)."""

    node: cst.For
    variable: str | None
    scope: cst.CSTNode  # the function (or module) the loop is in


@dataclasses.dataclass
class Loader:
    call: cst.Call
    name: str | None  # the variable it is assigned to, if any
    loops: list[Loop]
    role: Role


OWN_SAMPLING = ("sampler", "batch_sampler")


class LoaderFlow:
    """The file's loaders, their roles, and which training loaders get sharded."""

    def __init__(self, ctx) -> None:
        self.loaders = find_loaders(ctx.query)

    def sharded_training(self) -> list[Loader]:
        """Training loaders that can be sharded: not those with a sampler of their own (declined)."""
        return [loader for loader in self.loaders if loader.role == "train" and not own_sampling(loader)]


def own_sampling(loader: Loader) -> list[str]:
    """The sampling arguments a loader passes itself (``sampler=``, ``batch_sampler=``)."""
    return [a.keyword.value for a in loader.call.args if a.keyword and a.keyword.value in OWN_SAMPLING]


def find_loaders(query: Query) -> list[Loader]:
    """Every loader construction (by qualified name) with the loops that read it and its role."""
    loaders = []
    for call in query.findall(query.module, m.Call()):
        if query.is_call_to(call, query.vocabulary.data_loaders):
            name, loops = _consumers(query, call)
            if not loops:
                role: Role = "unknown"
            elif any(query.trains(loop.node.body) for loop in loops):
                role = "train"
            else:
                role = "eval"
            loaders.append(Loader(call, name, loops, role))
    return loaders


def _consumers(query: Query, call: cst.Call) -> tuple[str | None, list[Loop]]:
    for ancestor in query.ancestors(call):
        if isinstance(ancestor, cst.For):
            if query.index.contains(ancestor.iter, call):
                return None, [Loop(ancestor, None, _scope(query, ancestor))]
            break
        if isinstance(ancestor, cst.BaseStatement):
            break
    statement = query.statement_of(call)
    if not m.matches(statement, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(m.Name())])])):
        return None, []
    assign = statement.body[0]
    if assign.value is not call:
        return None, []
    name = assign.targets[0].target.value
    return name, _loops_over(query, _scope(query, call), name, 0)


def _loops_over(query: Query, scope: cst.CSTNode, name: str, depth: int) -> list[Loop]:
    loops = [Loop(f, name, scope) for f in query.findall(scope, m.For()) if _iterates(f.iter, name)]
    if depth >= _MAX_DEPTH:
        return loops
    functions = query.module_functions()
    for call in query.findall(scope, m.Call(func=m.Name())):
        function = functions.get(call.func.value)
        if function is None or function is scope:
            continue
        for parameter in _parameters_receiving(function, call, name):
            loops.extend(_loops_over(query, function, parameter, depth + 1))
    return loops


def _iterates(iterable: cst.BaseExpression, name: str) -> bool:
    """``x``, ``enumerate(x)``, ``tqdm(x, ...)``, ``zip(x, y)`` read ``x``; ``range(len(x))`` does not."""
    if isinstance(iterable, cst.Name):
        return iterable.value == name
    if isinstance(iterable, cst.Call):
        if m.matches(iterable.func, m.Name("len") | m.Name("range")):
            return False
        return any(_iterates(a.value, name) for a in iterable.args)
    return False


def _parameters_receiving(function: cst.FunctionDef, call: cst.Call, name: str) -> list[str]:
    params = [p.name.value for p in (*function.params.posonly_params, *function.params.params)]
    received = []
    for index, arg in enumerate(call.args):
        if not (isinstance(arg.value, cst.Name) and arg.value.value == name) or arg.star:
            continue
        if arg.keyword is not None:
            received.append(arg.keyword.value)
        elif index < len(params):
            received.append(params[index])
    return received


def _scope(query: Query, node: cst.CSTNode) -> cst.CSTNode:
    return query.function_of(node) or query.module

