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
from .bindings import Bindings
from .flow import (
    attribute_assigned_from,
    callers,
    method,
    method_calls,
    module_classes,
    parameter_for,
    receiver,
    returned_at,
    self_attribute,
)
from .imported_names import names_imported_from, received_positions, root_name
from .loop_trains import ClassLoop, Loop, loop_trains
from .query import Query, body_statements

Role = Literal["train", "eval", "unknown", "unaveraged"]  # unaveraged: it trains, but nothing would average gradients
_MAX_DEPTH = 3


@dataclasses.dataclass
class Loader:
    call: cst.Call
    name: str | None  # the variable it is assigned to, if any
    loops: list[Loop]
    role: Role


OWN_SAMPLING = ("sampler", "batch_sampler")


class LoaderFlow:
    """The file's loaders, their roles, and which training loaders get sharded.

    Across files: ``ctx.options.returned_roles`` says which of this module's functions return a
    training loader to the script that imports them (what that script's loops do with it), and
    :meth:`imported_training_returns` says the same, seen from the script.
    """

    def __init__(self, ctx) -> None:
        self.query = ctx.query
        hints = {(f, p): role for f, p, role in getattr(ctx.options, "returned_roles", ())}
        self.loaders = find_loaders(ctx.query, hints, ctx.analysis(Bindings))
        trained = getattr(ctx.options, "local_training_parameters", ())
        for index, loader in enumerate(self.loaders):
            if loader.role == "unknown" and loader.name is not None and trained and handed_to_training(
                    ctx.query, loader, ctx.options.local_modules, trained):
                self.loaders[index] = dataclasses.replace(loader, role="train")
        if any(loader.role == "train" and loader.loops for loader in self.loaders) and nothing_averages(ctx):
            self.loaders = [dataclasses.replace(loader, role="unaveraged") if loader.role == "train" and loader.loops
                            else loader for loader in self.loaders]  # (not a loader another file trains with)

    def imported_training_returns(self, modules: tuple[str, ...]) -> list[tuple[str, int]]:
        """(qualified function name, return position) of functions of the local ``modules`` whose result
        a training loop of this file reads: ``train_loader, _ = data.get_loaders()`` then
        ``for x in train_loader: ...``. Only calls into those modules are looked at (cheaply)."""
        found = {(qualified, position) for qualified, position, _, loops, _ in self._imported_returns(modules)
                 if any(loop_trains(self.query, loop) for loop in loops)}
        return sorted(found)

    def imported_evaluated_shares(self, modules: tuple[str, ...], trained: tuple[str, ...] = ()
                                  ) -> list[tuple[cst.Call, cst.CSTNode]]:
        """Calls of a local module's function whose result only loops that do not train read, while another
        call of it feeds training: ``val_loader = get_dataloader(val_set, mode='test')`` beside the training
        call. That module's one ``DataLoader(...)`` is sharded for training, so those loops evaluate this
        rank's share (the cross-file form of :func:`evaluating_loops`). With the loop (or the call of a local
        module's function that is handed the value and does not train on it: ``evaluate(model, val_loader)``,
        a steel-defect classifier's, issue 19 audit round I) that reads it."""
        returns = self._imported_returns(modules)
        training = {(q, p) for q, p, _, loops, _ in returns if any(loop_trains(self.query, loop) for loop in loops)}
        shares: list[tuple[cst.Call, cst.CSTNode]] = []
        for qualified, position, call, loops, name in returns:
            if (qualified, position) not in training:
                continue
            if loops and not any(loop_trains(self.query, loop) for loop in loops):
                shares.append((call, loops[0].node))
            elif not loops and (reader := _handed_to_local(self.query, call, name, modules, trained)) is not None:
                shares.append((call, reader))
        return shares

    def _imported_returns(self, modules: tuple[str, ...]) -> list[tuple[str, int, cst.Call, list[Loop], str]]:
        """(qualified function, return position, call, loops reading that value, the name it is given) for
        ``x = f()`` and ``a, b = f()`` of a name imported from the local ``modules``."""
        query = self.query
        found: list[tuple[str, int, cst.Call, list[Loop], str]] = []
        if not modules:
            return found
        roots = names_imported_from(query.module, set(modules))
        for call in query.index.of_type(query.module, cst.Call):
            if not isinstance(query.parent(call), cst.Assign) or root_name(call.func) not in roots:
                continue  # only `x = f()` / `a, b = f()` of a name imported from a local module
            targets = received_positions(query.statement_of(call), call)
            if not targets:
                continue
            names = [n for module in modules for n in query.index.qualified_names_under(call.func, module)
                     if "." in n]
            for position, name in targets:
                loops = _loops_over(query, _scope(query, call), name, 0)
                found.extend((qualified.lstrip("."), position, call, loops, name) for qualified in names)
        return found

    def sharded_training(self) -> list[Loader]:
        """Training loaders that can be sharded: not those with a sampler of their own (declined)."""
        return [loader for loader in self.loaders if loader.role == "train" and not own_sampling(loader)]


def nothing_averages(ctx) -> bool:
    """The file trains with no optimizer (built or stepped), no model handed its parameters and no high-level model:
    its parameters are tensors it updates by hand from ``.grad`` (``w.set_value(w - lr * w.grad)``, the Paddle guide
    on layers and models). No wrapper would average their gradients, so a sharded loader would have each rank train on its own
    part apart (issue 19 audit, round G): its training loaders stay whole and are declined."""
    from .models import Models  # (models reads loaders' neighbours; imported when asked)
    from .query import optimizer_class

    query = ctx.query
    calls = query.index.of_type(query.module, cst.Call)
    if any(optimizer_class(query, call) is not None for call in calls):
        return False
    steps = {"fit", "prepare", *query.vocabulary.optimizer_step_methods}
    if query.local_trainer_calls or any(isinstance(call.func, cst.Attribute) and call.func.attr.value in steps
                                        for call in calls):
        return False  # an optimizer's step (one built elsewhere), a high-level model's fit, a local module's training
    return not ctx.analysis(Models).sites


def _handed_to_local(query: Query, made: cst.Call, name: str, modules: tuple[str, ...],
                     trained: tuple[str, ...]) -> cst.Call | None:
    """The first call of a local module's function that is handed ``name`` (bound by ``made``) and does not
    train on it (by :func:`dpmigrate.local.models.model_facts`' training parameters); None when one trains."""
    training = {entry.rsplit(":", 2)[0] for entry in trained}
    first = None
    for call in query.index.of_type(_scope(query, made), cst.Call):
        if call is made or not any(not a.star and m.matches(a.value, m.Name(name)) for a in call.args):
            continue
        qualified = {q.lstrip(".") for module in modules for q in query.index.qualified_names_under(call.func, module)}
        if qualified & training:
            return None
        if qualified and first is None:
            first = call
    return first


def handed_to_training(query: Query, loader: Loader, modules: tuple[str, ...], trained: tuple[str, ...]) -> bool:
    """The loader's name is handed to a local module's function whose loop over that parameter trains
    (``utils.train_per_epoch(loader, model, opt, epoch)``, ``train(model, loader=train_loader)``): see
    :func:`dpmigrate.local.models.model_facts`."""
    parameters: dict[str, dict[int | str, None]] = {}
    for entry in trained:
        function, index, name = entry.rsplit(":", 2)
        parameters.setdefault(function, {}).update({int(index): None, name: None})
    scope = _scope(query, loader.call)
    for call in query.index.of_type(scope, cst.Call):
        if root_name(call.func) is None:
            continue
        for position, arg in enumerate(call.args):
            if arg.star or not m.matches(arg.value, m.Name(loader.name)):
                continue
            key: int | str = arg.keyword.value if arg.keyword is not None else position
            for module in modules:
                for qualified in query.index.qualified_names_under(call.func, module):
                    if key in parameters.get(qualified.lstrip("."), {}):
                        return True
    return False


def own_sampling(loader: Loader) -> list[str]:
    """The sampling arguments a loader passes itself (``sampler=``, ``batch_sampler=``)."""
    return [a.keyword.value for a in loader.call.args if a.keyword and a.keyword.value in OWN_SAMPLING]


def find_loaders(query: Query, hints: dict[tuple[str, int], str] | None = None,
                 bindings: Bindings | None = None) -> list[Loader]:
    """Every loader construction (by qualified name) with the loops that read it and its role.

    ``hints`` ((function, return position) -> role) decide loaders this file returns to another. With
    ``bindings``, a loop reading the loader's name reads this loader only if that read sees its assignment.
    """
    loaders = []
    for call in query.findall(query.module, m.Call()):
        if query.is_call_to(call, query.vocabulary.data_loaders):
            name, loops = _consumers(query, call)
            if name is not None and bindings is not None:
                loops = _reading_this_binding(query, bindings, call, name, loops)
            hinted = _hinted_role(query, call, name, hints) if hints and not loops else None
            if hinted is not None:
                role: Role = hinted
            elif not loops:
                role = "unknown"
            elif any(loop_trains(query, loop) for loop in loops):
                role = "train"
            else:
                role = "eval"
            loaders.append(Loader(call, name, loops, role))
    return loaders


def _consumers(query: Query, call: cst.Call) -> tuple[str | None, list[Loop]]:
    returned = returned_directly(query, call)
    if returned is not None:  # def make_loader(...): return DataLoader(...)
        function, position = returned
        return None, _loops_of_callers(query, function, position, 0)
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


def _reading_this_binding(query: Query, bindings: Bindings, call: cst.Call, name: str, loops: list[Loop]) -> list[Loop]:
    """The loops that read the name's binding made by ``call``'s statement: not a loop over a later loader bound to
    the same name, nor one inside a function whose own variable of that name it reads (the autoencoder tutorial:
    ``data_reader`` trains in ``train()``, then a module-level ``data_reader`` with ``batch_size=1`` scores every
    sample; taken for a training loader, its batch size 1 was split over the ranks and failed). A loop whose read
    cannot be told, or that reads a parameter the loader was passed as, stays."""
    statement = query.statement_of(call)
    scope = _scope(query, call)
    kept = []
    for loop in loops:
        if loop.variable == name and loop.scope is scope:  # (not one reached through a caller or a parameter)
            seen = bindings.reachings(loop.node, name)
            if seen is not None and statement not in seen:
                continue
        kept.append(loop)
    return kept


def _loops_over(query: Query, scope: cst.CSTNode, name: str, depth: int) -> list[Loop]:
    loops = [Loop(f, name, scope) for f in query.findall(scope, m.For()) if _iterates(f.iter, name)]
    if depth >= _MAX_DEPTH:
        return loops
    if isinstance(scope, cst.FunctionDef):
        position = returned_at(query, scope, name)
        if position is not None:  # train_loader = DataLoader(...); return train_loader, val_loader
            loops.extend(_loops_of_callers(query, scope, position, depth + 1))
    loops.extend(_loops_in_classes(query, scope, name))
    functions = query.module_functions()
    for call in query.findall(scope, m.Call(func=m.Name())):
        function = functions.get(call.func.value)
        if function is None or function is scope:
            continue
        for parameter in _parameters_receiving(function, call, name):
            for loop in _loops_over(query, function, parameter, depth + 1):
                if loop.scope is function and loop.via is None:
                    loop.via = call
                loops.append(loop)
    for call, function in method_calls(query, scope):
        parameter = parameter_for(call, function, name)
        if parameter is not None:
            loops.extend(_loops_over(query, function, parameter, depth + 1))
    return loops


def _hinted_role(query: Query, call: cst.Call, name: str | None, hints: dict[tuple[str, int], str]) -> Role | None:
    """The role another file's loops give a loader this module's function returns."""
    returned = returned_directly(query, call)
    if returned is None and name is not None:
        function = query.function_of(call)
        if function is not None and (position := returned_at(query, function, name)) is not None:
            returned = function, position
    if returned is None:
        return None
    function, position = returned
    role = hints.get((function.name.value, position))
    return role if role in ("train", "eval") else None


def returned_directly(query: Query, call: cst.Call) -> tuple[cst.FunctionDef, int] | None:
    """(function, position) for ``return DataLoader(...)`` or ``return DataLoader(a), DataLoader(b)``."""
    parent = query.parent(call)
    position = -1
    if isinstance(parent, cst.Element) and isinstance(query.parent(parent), cst.Tuple):
        elements = query.parent(parent).elements
        position = next(i for i, e in enumerate(elements) if e is parent)
        parent = query.parent(query.parent(parent))
    function = query.function_of(call)
    if isinstance(parent, cst.Return) and function is not None and query.function_of(parent) is function:
        return function, position
    return None


def _loops_of_callers(query: Query, function: cst.FunctionDef, position: int, depth: int) -> list[Loop]:
    """The loops reading what ``function`` returns at ``position``, where each caller receives it."""
    loops: list[Loop] = []
    for call in callers(query, function):
        received = receiver(query, call, position)
        if received is not None:
            statement, name = received
            loops.extend(_loops_over(query, _scope(query, statement), name, depth))
    return loops


def _loops_in_classes(query: Query, scope: cst.CSTNode, name: str) -> list[Loop]:
    """``Trainer(model, train_loader)`` keeping it as ``self.train_loader``: the loops of the class's
    methods over ``self.train_loader``. Such a loop trains when its body trains, directly or through
    another method of the class (``self._step(...)``)."""
    classes = module_classes(query)
    loops: list[Loop] = []
    for call in query.index.of_type(scope, cst.Call):
        if not (isinstance(call.func, cst.Name) and call.func.value in classes):
            continue
        cls = classes[call.func.value]
        init = method(cls, "__init__")
        parameter = parameter_for(call, init, name) if init is not None else None
        if parameter is None:
            continue
        attributes = {a for s in body_statements(init) if (a := attribute_assigned_from(query, s, parameter))}
        for loop in query.index.of_type(cls, cst.For):
            if self_attribute(_iterated(loop.iter)) in attributes:
                loops.append(ClassLoop(loop, None, query.function_of(loop) or cls, cls=cls))
    return loops


def _iterated(iterable: cst.BaseExpression) -> cst.BaseExpression:
    """``self.loader`` in ``enumerate(self.loader)``, ``tqdm(self.loader)`` or ``self.loader()`` (Paddle's
    callable loader); the iterable itself otherwise."""
    if isinstance(iterable, cst.Call) and iterable.args and not (
        isinstance(iterable.func, cst.Name) and iterable.func.value in ("len", "range")
    ):
        iterable = iterable.args[0].value
    if isinstance(iterable, cst.Call) and not iterable.args and isinstance(iterable.func, cst.Attribute):
        return iterable.func
    return iterable


def evaluating_loops(query: Query, loader: Loader) -> list[Loop]:
    """The loops reading a training loader that do not train: a function that makes loaders, called for the
    training set and for the validation set (``get_dataloader(ds, bs, mode)``), shards both with its one
    ``DataLoader(...)``, so those loops evaluate this rank's share."""
    return [loop for loop in loader.loops if not loop_trains(query, loop)] if loader.role == "train" else []


def _iterates(iterable: cst.BaseExpression, name: str) -> bool:
    """``x``, ``enumerate(x)``, ``tqdm(x, ...)``, ``zip(x, y)`` read ``x``; ``range(len(x))`` does not.

    ``x()`` reads it too: Paddle's DataLoader is also iterated by calling it (``for x, y in loader():``).
    """
    if isinstance(iterable, cst.Name):
        return iterable.value == name
    if isinstance(iterable, cst.Call):
        if m.matches(iterable, m.Call(func=m.Name(name), args=[])):
            return True
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
