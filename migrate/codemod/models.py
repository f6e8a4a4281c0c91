"""Which names are the models a script trains, and where each one is ready to be wrapped.

An analysis (``ctx.analysis(Models)``): the model rule wraps what it finds, and the save rule must
know the same names (``torch.save(model, f)`` pickles what would be the DDP wrapper) without
depending on the model rule having run.

A model is what an optimizer (the vocabulary's optimizers, ``torch.optim.*``, by qualified name, or
anything else handed ``.parameters()``) takes the parameters of, or whose ``.parameters()`` a training function updates
by hand. It is followed by binding (:mod:`.bindings`), not by name, so each construction an optimizer
trains is wrapped once (``model = Net()`` built and trained twice: both; a parameter ``model``: where each
caller builds what it passes). It is ready after its set-up: the last statement, from the one binding it,
that assigns it or calls one of its methods, before the first loop or training call of the block that
builds it.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import libcst as cst

from . import patterns as m
from .bindings import Bindings, parameters_of
from .flow import attribute_assigned_from, method, parameter_for, receiver, returned_at
from .query import (
    Query,
    attribute_held,
    body_statements,
    is_main_guard,
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
    verdict: Literal["wrap", "attribute", "elsewhere", "inside", "returned", "closure"]
    anchor: cst.BaseStatement | None = None


class Models:
    def __init__(self, ctx) -> None:
        self.q: Query = ctx.query
        self.module = ctx.module
        self.bindings = ctx.analysis(Bindings)
        self.sites: list[ModelSite] = []
        done: set[tuple[int, str]] = set()
        for site, name in self._model_sites():
            if optimizer_class(self.q, site) in self.q.vocabulary.closure_optimizers:
                found = ModelSite(site, name, "closure")
            elif attribute_held([name]):
                found = self._attribute_site(site)
            else:
                found = self._variable_site(site, name)
            where = found.anchor if found.anchor is not None else self.q.function_of(site)
            key = (id(where), found.name)
            if key in done:
                continue
            done.add(key)
            self.sites.append(found)
        closure = {(id(self.q.function_of(f.site)), f.name) for f in self.sites if f.verdict == "closure"}
        self.sites = [f for f in self.sites if f.verdict == "closure"
                      or (id(self.q.function_of(f.site)), f.name) not in closure]

    def _variable_site(self, site: cst.CSTNode, name: str) -> ModelSite:
        """Wrapped after the set-up of the binding ``site`` reads; by name where that binding cannot be told."""
        binding = self.bindings.reaching(site, name)
        holder = None
        if binding is not None:
            scope = self.q.function_of(binding) or self.module
            holder = _top_statement(self.q, scope, binding)
        else:
            scope = self._binding_scope(name, site)
            if scope is None:
                return ModelSite(site, name, "elsewhere")
        if isinstance(scope, cst.FunctionDef) and returned_at(self.q, scope, name) is not None:
            return self._returned_site(site, scope, name)
        return self._wrap_in(site, scope, name, holder)

    def _wrap_in(self, site: cst.CSTNode, scope: cst.CSTNode, name: str,
                 holder: cst.BaseStatement | None = None) -> ModelSite:
        """Wrapped where ``scope`` sets it up (from ``holder``, the statement of ``scope`` binding it; None: its
        first), or, when handed to a class that keeps and trains it, there."""
        kept = self._kept_by_class(scope, name)
        if kept is not None:
            return kept
        anchor = self._anchor(scope, name, holder)
        return ModelSite(site, name, "wrap" if anchor is not None else "inside", anchor)

    def _returned_site(self, site: cst.CSTNode, factory: cst.FunctionDef, name: str) -> ModelSite:
        """A model a factory builds and returns is wrapped where its one caller receives it."""
        position = returned_at(self.q, factory, name)
        receivers = []
        for call in self.q.index.of_type(self.module, cst.Call):
            if isinstance(call.func, cst.Name) and call.func.value == factory.name.value:
                receivers.append(receiver(self.q, call, position))
        if len(receivers) != 1 or receivers[0] is None:
            return ModelSite(site, name, "returned")
        statement, received = receivers[0]
        scope = self.q.function_of(statement) or self.module
        return self._wrap_in(statement, scope, received)

    def _kept_by_class(self, scope: cst.CSTNode, name: str) -> ModelSite | None:
        """``Trainer(model, ...)`` whose ``__init__`` keeps it as ``self.model`` and whose methods train."""
        classes = {s.name.value: s for s in self.module.body if isinstance(s, cst.ClassDef)}
        for call in self.q.index.of_type(scope, cst.Call):
            if not (isinstance(call.func, cst.Name) and call.func.value in classes):
                continue
            cls = classes[call.func.value]
            init = method(cls, "__init__")
            if init is None or not self.q.has_backward(cls):
                continue
            parameter = parameter_for(call, init, name)
            if parameter is None:
                continue
            for statement in body_statements(init):
                attribute = attribute_assigned_from(self.q, statement, parameter)
                if attribute is not None:
                    anchor = self._attribute_anchor(init, attribute)
                    return ModelSite(call, f"self.{attribute}", "wrap", anchor)
        return None

    def _attribute_site(self, site: cst.CSTNode) -> ModelSite:
        """``SGD(self.model.parameters())`` in a method: wrapped in ``__init__`` where it is set up."""
        attribute = _self_attribute(self.q, site)
        cls = next((a for a in self.q.ancestors(site) if isinstance(a, cst.ClassDef)), None)
        init = method(cls, "__init__") if cls is not None else None
        if attribute is None or init is None:
            return ModelSite(site, "self", "attribute")
        anchor = self._attribute_anchor(init, attribute)
        if anchor is None:
            return ModelSite(site, "self", "attribute")
        return ModelSite(site, f"self.{attribute}", "wrap", anchor)

    def _attribute_anchor(self, init: cst.FunctionDef, attribute: str) -> cst.BaseStatement | None:
        """The last statement of ``__init__`` that assigns ``self.<attribute>`` or calls one of its methods."""
        last = None
        for statement in body_statements(init):
            if isinstance(statement, cst.SimpleStatementLine) and _sets_up_attribute(self.q, statement, attribute):
                last = statement
        return last

    @property
    def wrapped(self) -> list[str]:
        return [s.name for s in self.sites if s.verdict == "wrap"]

    def _model_sites(self):
        """(node, model name) for every optimizer and every hand-written parameter update; a model that is a
        parameter of the function training it is followed to each caller: (the call, the caller's name)."""
        for site, name in self._training_sites():
            function = self.q.function_of(site)
            if function is not None and name in parameters_of(function) and not any(
                    name in self.q.assigned_names(s) for s in body_statements(function)):
                passed = self.bindings.passed_by_callers(function, name)
                if passed:
                    yield from passed  # wrapped where each caller set it up
                    continue
            yield site, name

    def _training_sites(self):
        parameters = parameter_call(self.q)
        for call in self.q.findall(self.module, m.Call()):
            # torch optimizers, and anything else handed a model's parameters (a hand-written
            # optimizer class, clip_grad_norm_): the model is the same either way
            if optimizer_class(self.q, call) is not None or (
                any(m.matches(a.value, parameters) for a in call.args[:1]) and not self._builtin(call)
            ):
                for name in parameter_owners(self.q, call):
                    yield call, name
        training = [f for n, f in self.q.module_functions().items() if n in self.q.training_functions()]
        training += [s for s in self.module.body  # a training loop at the top of a script, updating by hand
                     if not isinstance(s, (cst.FunctionDef, cst.ClassDef)) and self.q.has_backward(s)]
        for scope in training:
            for call in self.q.findall(scope, parameters):
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

    def _anchor(self, scope: cst.CSTNode, name: str,
                holder: cst.BaseStatement | None = None) -> cst.BaseStatement | None:
        """The statement to wrap after, or None when the model is built and trained inside one block.

        ``holder`` is the statement of ``scope`` that binds the model (None: the first that assigns it). A
        block that builds the model and also trains it (``if __name__ == "__main__":`` holding the whole
        script, ``with ...:``, a loop repeating the whole training over ``range(...)`` or a literal list) is
        entered, so the wrap lands before the training in it; any other such block (``if``/``for``/``try``) is
        declined: wrapping after it would be too late.
        """
        statements = list(body_statements(scope))
        if holder is None:
            holder = next((s for s in statements if name in self.q.assigned_names(s)), None)
            if holder is None:  # bound by the block itself (``with Net() as model:``) and trained in it
                return None
        created = statements.index(holder)
        if not isinstance(holder, (cst.SimpleStatementLine, cst.FunctionDef, cst.ClassDef)) and self.q.trains(holder):
            enterable = isinstance(holder, cst.With) or (isinstance(holder, cst.If) and is_main_guard(holder)) or (
                _repeats(self.q, holder))
            if not enterable or not isinstance(holder.body, cst.IndentedBlock):
                return None
            function = self.q.function_of(holder) or self.module
            inner = [s for s in self.bindings.statements(function, name)
                     if s is not holder and self.q.index.contains(holder, s)]
            nested = _top_statement(self.q, holder, inner[-1]) if inner else None
            return self._anchor(holder, name, nested)
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


def _repeats(query: Query, statement: cst.BaseStatement) -> bool:
    """``for t in range(5):`` or ``for lr in [0.1, 0.01]:`` (no ``else``): a loop every rank runs as often, so a model
    it builds and trains afresh in each turn (an MLP homework's five repeats, K folds) is wrapped in each turn."""
    if not isinstance(statement, cst.For) or statement.orelse is not None or statement.asynchronous is not None:
        return False
    return query.is_call_to(statement.iter, {"builtins.range"}) or isinstance(statement.iter, (cst.List, cst.Tuple))


def trains_itself(query: Query, optimizer: cst.CSTNode) -> bool:
    """``Adam(parameters=self.parameters())`` in a method of the model's own class (a critic CNN whose
    ``train_critic_CNN`` builds its optimizer and calls ``self(x)``): no wrapper can stand in for ``self``."""
    return isinstance(optimizer, cst.Call) and any(
        isinstance(call.func, cst.Attribute) and m.matches(call.func.value, m.Name("self"))
        for call in query.findall(optimizer, parameter_call(query)))


SELF_TRAINED = ("the model trains itself: this optimizer takes self.parameters() in a method of the model's own class, "
                "whose self(...) calls the bare network, which no wrapper can replace")
SELF_TRAINED_FIX = ("move the training loop out of the class into a function that takes the model, and wrap the "
                    "instance where it is made: `model = dp.distributed_model(model)` before that function is called")


def _top_statement(query: Query, scope: cst.CSTNode, node: cst.CSTNode) -> cst.BaseStatement | None:
    """The statement of ``scope``'s own body that holds ``node``."""
    return next((s for s in body_statements(scope) if query.index.contains(s, node)), None)


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


def _self_attribute(query: Query, site: cst.CSTNode) -> str | None:
    """``model`` for an optimizer built on ``self.model.parameters()``."""
    for found in query.findall(site, parameter_call(query)):
        owner = found.func.value
        if isinstance(owner, cst.Attribute) and isinstance(owner.value, cst.Name) and owner.value.value == "self":
            return owner.attr.value
    return None


def _sets_up_attribute(query: Query, statement: cst.SimpleStatementLine, attribute: str) -> bool:
    for small in statement.body:
        targets = small.targets if isinstance(small, cst.Assign) else []
        for target in targets:
            t = target.target
            if isinstance(t, cst.Attribute) and isinstance(t.value, cst.Name) and t.value.value == "self" \
                    and t.attr.value == attribute:
                return True
        for call in query.index.of_type(small, cst.Call):
            func = call.func
            if (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Attribute)
                    and isinstance(func.value.value, cst.Name) and func.value.value.value == "self"
                    and func.value.attr.value == attribute
                    and func.attr.value not in query.vocabulary.parameter_methods):
                return True
    return False
