"""Which names are the models a script trains, and where each one is ready to be wrapped.

An analysis (``ctx.analysis(Models)``): the model rule wraps what it finds, and the save rule must
know the same names (``torch.save(model, f)`` pickles what would be the DDP wrapper) without
depending on the model rule having run.

A model is what an optimizer (``torch.optim.*``, by qualified name, or anything else handed
``.parameters()``) takes the parameters of, or whose ``.parameters()`` a training function updates
by hand. It is ready after the last statement that assigns it or calls one of its methods, before
the first loop or training call of the block that builds it.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import libcst as cst

from ...codemod import patterns as m
from ...codemod.query import (
    Query,
    attribute_held,
    body_statements,
    optimizer_class,
    parameter_call,
    parameter_owners,
    target_names,
)


@dataclasses.dataclass
class ModelSite:
    """One model found at ``site``: wrapped after ``anchor``, or declined for ``reason``."""

    site: cst.CSTNode
    name: str
    verdict: Literal["wrap", "attribute", "elsewhere"]
    anchor: cst.BaseStatement | None = None


class Models:
    def __init__(self, ctx) -> None:
        self.q: Query = ctx.query
        self.module = ctx.module
        self.sites: list[ModelSite] = []
        done: set[tuple[int, str]] = set()
        for site, name in self._model_sites():
            if attribute_held([name]):
                key = (id(site), name)
                verdict = "attribute"
            else:
                scope = self._binding_scope(name, site)
                key = (id(scope if scope is not None else self.q.function_of(site)), name)
                verdict = "wrap" if scope is not None else "elsewhere"
            if key in done:
                continue
            done.add(key)
            anchor = self._anchor(scope, name) if verdict == "wrap" else None
            self.sites.append(ModelSite(site, name, verdict, anchor))

    @property
    def wrapped(self) -> list[str]:
        return [s.name for s in self.sites if s.verdict == "wrap"]

    def _model_sites(self):
        """(node, model name) for every optimizer and every hand-written parameter update."""
        parameters = parameter_call(self.q)
        for call in self.q.findall(self.module, m.Call()):
            # torch optimizers, and anything else handed a model's parameters (a hand-written
            # optimizer class, clip_grad_norm_): the model is the same either way
            if optimizer_class(self.q, call) is not None or (
                any(m.matches(a.value, parameters) for a in call.args[:1]) and not self._builtin(call)
            ):
                for name in parameter_owners(self.q, call):
                    yield call, name
        for name, function in self.q.module_functions().items():
            if name in self.q.training_functions():
                for call in self.q.findall(function, parameters):
                    owner = call.func.value
                    if isinstance(owner, cst.Name):
                        yield call, owner.value

    def _builtin(self, call: cst.Call) -> bool:
        """``next(self.parameters())``, ``list(model.parameters())``: reading parameters, not training them."""
        return self.q.named_under(call.func, "builtins")

    def _binding_scope(self, name: str, site: cst.CSTNode) -> cst.CSTNode | None:
        function = self.q.function_of(site)
        if function is not None and any(name in self.q.assigned_names(s) for s in body_statements(function)):
            return function
        if any(name in self.q.assigned_names(s) for s in self.module.body if not isinstance(s, cst.FunctionDef)):
            return self.module
        return None

    def _anchor(self, scope: cst.CSTNode, name: str) -> cst.BaseStatement:
        statements = list(body_statements(scope))
        created = next(i for i, s in enumerate(statements) if name in self.q.assigned_names(s))
        stop = len(statements)
        for index in range(created + 1, len(statements)):
            statement = statements[index]
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                continue
            if isinstance(statement, (cst.For, cst.While)) or self.q.trains(statement):
                stop = index
                break
        set_up = [i for i in range(created, stop) if _sets_up(self.q, statements[i], name)]
        return statements[max(set_up, default=created)]


def _sets_up(query: Query, statement: cst.CSTNode, name: str) -> bool:
    """Assigns ``name`` or calls one of its methods (``.to``, ``.apply``, ``.load_state_dict``...).

    Passing the model to a function (``validate(model)``, ``print(model)``) or handing its
    parameters to an optimizer is using it, not setting it up. Nested definitions are skipped.
    """
    finder = _SetUpFinder(name, parameter_call(query))
    query.index.visit(finder, statement)
    return finder.found


class _SetUpFinder(cst.CSTVisitor):
    def __init__(self, name: str, parameters: m.Call) -> None:
        super().__init__()
        self.name = name
        self.parameters = parameters
        self.found = False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self.found = self.found or self.name in target_names(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:  # model: nn.Module = Net()
        self.found = self.found or self.name in target_names(node.target)

    def visit_Call(self, node: cst.Call) -> None:
        if m.matches(node.func, m.Attribute(value=m.Name(self.name))) and not m.matches(node, self.parameters):
            self.found = True
