"""Wrap each trained model in DDP once it is built, on its device, and initialised."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from ._base import Rule
from ._query import (
    Query, attribute_held, body_statements, optimizer_class, parameter_owners, target_names,
)

_PARAMETERS = m.Call(func=m.Attribute(attr=m.Name("parameters") | m.Name("named_parameters")))


class DistributedModel(Rule):
    """Insert ``model = dp.distributed_model(model)`` after the model's last set-up statement.

    Why: DDP averages the gradients of all ranks during ``backward()``; without it every rank trains
    its own model. It must see the model on its device (after ``.to(device)``) and after the
    script's own initialisation (``apply(weights_init)``, ``load_state_dict``), since it broadcasts
    rank 0's weights when it is built.
    Example:  model = Net().to(device)          model = Net().to(device)
              optimizer = optim.SGD(...)   ->   model = dp.distributed_model(model)
                                                optimizer = optim.SGD(...)
    A model is what an optimizer (``torch.optim.*``, by qualified name, or the script's own class)
    takes the parameters of, or whose ``.parameters()`` a training function updates by hand. The insertion goes after the last
    statement that assigns the model or calls one of its methods, before the first loop or
    training call of the block that builds it.
    Leaves alone: a model built in another function than the one that uses it, or held in an
    attribute (``self.model``): declined, wrap it where it is built.
    """

    name = "distributed-model"

    def finish(self) -> None:
        done: set[tuple[int, str]] = set()
        models: list[str] = []
        for site, name in self._model_sites():
            if attribute_held([name]):
                if (id(site), name) not in done:
                    done.add((id(site), name))
                    self.report(
                        site, "declined",
                        "the model is held in an attribute (self....): cannot tell where it is built and placed",
                        "where it is assigned and moved to its device, add `self.model = dp.distributed_model(self.model)`",
                    )
                continue
            scope = self._binding_scope(name, site)
            if scope is None:
                key = (id(self.q.function_of(site)), name)
                if key not in done:
                    done.add(key)
                    self.report(
                        site, "declined",
                        f"`{name}` is built outside the function that trains it; cannot tell where to wrap it",
                        f"where `{name}` is built and moved to its device, add `{name} = dp.distributed_model({name})`",
                    )
                continue
            key = (id(scope), name)
            if key in done:
                continue
            done.add(key)
            if self._wrap(scope, name, site):
                models.append(name)
        self.ctx.facts["models"] = models

    def _model_sites(self):
        """(node, model name) for every optimizer and every hand-written parameter update."""
        for call in self.q.findall(self.ctx.module, m.Call()):
            # torch optimizers, and anything else handed a model's parameters (a hand-written
            # optimizer class, clip_grad_norm_): the model is the same either way
            if optimizer_class(self.q, call) is not None or _takes_parameters(call):
                for name in parameter_owners(self.q, call):
                    yield call, name
        for name, function in self.q.module_functions().items():
            if name in self.q.training_functions():
                for call in self.q.findall(function, _PARAMETERS):
                    owner = call.func.value
                    if isinstance(owner, cst.Name):
                        yield call, owner.value

    def _binding_scope(self, name: str, site: cst.CSTNode) -> cst.CSTNode | None:
        function = self.q.function_of(site)
        if function is not None and any(name in self.q.assigned_names(s) for s in body_statements(function)):
            return function
        if any(name in self.q.assigned_names(s) for s in self.ctx.module.body if not isinstance(s, cst.FunctionDef)):
            return self.ctx.module
        return None

    def _wrap(self, scope: cst.CSTNode, name: str, site: cst.CSTNode) -> bool:
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
        anchor = max(i for i in range(created, stop) if _sets_up(self.q, statements[i], name))
        self.ctx.plan.insert_after(statements[anchor], self.statement(f"{name} = {{dp}}.distributed_model({name})\n"))
        self.report(
            statements[anchor], "change",
            f"{name} = dp.distributed_model({name}) after its set-up: DDP averages gradients across ranks",
        )
        return True


def _takes_parameters(call: cst.Call) -> bool:
    return any(m.matches(a.value, _PARAMETERS) for a in call.args[:1])


def _sets_up(query: Query, statement: cst.CSTNode, name: str) -> bool:
    """Assigns ``name`` or calls one of its methods (``.to``, ``.apply``, ``.load_state_dict``...).

    Passing the model to a function (``validate(model)``, ``print(model)``) or handing its
    parameters to an optimizer is using it, not setting it up. Nested definitions are skipped.
    """
    finder = _SetUpFinder(name)
    query.index.visit(finder, statement)
    return finder.found


class _SetUpFinder(cst.CSTVisitor):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.found = False

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self.found = self.found or self.name in target_names(node.target)

    def visit_Call(self, node: cst.Call) -> None:
        if m.matches(node.func, m.Attribute(value=m.Name(self.name))) and not m.matches(node, _PARAMETERS):
            self.found = True
