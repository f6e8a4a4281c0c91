"""Which assignment a name holds at a given point: the analyses follow bindings, not names.

Why: real scripts reuse names. ``model = paddle.Model(Net())`` is fitted, then ``model = Net()`` is trained by a
hand-written loop (issue 19, item 1); ``model = SimpleNet()`` is built, trained, then built and trained again
(a tutorial comparing two settings). Deciding by the name alone left the second model unwrapped (each rank
then trained its own copy on half of the data, silently; torch's runtime averaged it as an unowned parameter,
so the training was right but the report named one model). Here a read of ``name`` at ``node`` resolves to
the last statement of the same function (or of the module) that binds ``name`` before ``node``, in source
order; a function parameter resolves through the function's callers to what each caller passes.

An analysis (``ctx.analysis(Bindings)``): the binding statements of each scope and the callers of each
function are collected once per file, so following every optimizer of a long script stays linear.
"""

from __future__ import annotations

import bisect

import libcst as cst

from .calls import argument
from .query import Query, target_names

_DEPTH = 3  # callers followed from a parameter to where the value is bound (train(model) <- main() <- ...)


class Bindings:
    """Reaching bindings of the file's names (see the module docstring)."""

    def __init__(self, ctx) -> None:
        self.q: Query = ctx.query
        self.module = ctx.module
        self._scopes: dict[int, dict[str, list[cst.BaseStatement]]] = {}  # id(scope) -> name -> its bindings
        self._callers: dict[str, list[cst.Call]] | None = None  # function name -> calls by that plain name

    def statements(self, scope: cst.CSTNode, name: str) -> list[cst.BaseStatement]:
        """Statements of ``scope`` (its own, nested blocks included, nested functions and classes not) binding
        ``name``, in source order."""
        table = self._scopes.get(id(scope))
        if table is None:
            table = self._scopes[id(scope)] = self._bound_in(scope)
        return table.get(name, [])

    def _bound_in(self, scope: cst.CSTNode) -> dict[str, list[cst.BaseStatement]]:
        q = self.q
        table: dict[str, list[cst.BaseStatement]] = {}
        for statement in q.index.of_type(scope, cst.SimpleStatementLine, cst.For, cst.With):
            owner = q.function_of(statement)
            if owner is not scope and not (owner is None and isinstance(scope, cst.Module)):
                continue
            if owner is None and any(isinstance(a, cst.ClassDef) for a in q.ancestors(statement)):
                continue  # a class attribute, not a variable of the module
            if isinstance(statement, cst.For):
                bound = target_names(statement.target)
            elif isinstance(statement, cst.With):
                bound = set().union(*(target_names(i.asname.name) for i in statement.items if i.asname is not None))
            else:
                bound = q.assigned_names(statement)
            for name in bound:
                table.setdefault(name, []).append(statement)
        return table

    def reaching(self, node: cst.CSTNode, name: str) -> cst.BaseStatement | None:
        """The statement whose binding of ``name`` a read at ``node`` sees, or None when it cannot be told (or
        when several callers of the function pass different ones: see :meth:`reachings`)."""
        found = self.reachings(node, name)
        return found[0] if found is not None and len(found) == 1 else None

    def assigned_value(self, node: cst.CSTNode, name: str) -> cst.BaseExpression | None:
        """The value of the plain ``name = value`` statement that reaches ``node``; None for any other binding."""
        bound = self.reaching(node, name)
        if isinstance(bound, cst.SimpleStatementLine) and len(bound.body) == 1 and isinstance(bound.body[0], cst.Assign):
            return bound.body[0].value
        return None

    def reachings(self, node: cst.CSTNode, name: str, depth: int = 0) -> list[cst.BaseStatement] | None:
        """Every statement whose binding of ``name`` a read at ``node`` may see; None when one cannot be told.

        The last binding before ``node`` in its function (or the module); for a parameter of a module-level
        function, the bindings its callers pass (each caller passing a plain name)."""
        q = self.q
        function = q.function_of(node)
        scope = function if function is not None else self.module
        bindings = self.statements(scope, name)
        position = q.index.position
        before = bisect.bisect_left([position(s) for s in bindings], position(node))
        if before:
            return [bindings[before - 1]]
        if function is None or depth > _DEPTH:
            return None
        if name in parameters_of(function):
            passed = self.passed_by_callers(function, name)
            if not passed:
                return None
            found: list[cst.BaseStatement] = []
            for call, value in passed:
                more = self.reachings(call, value, depth + 1)
                if more is None:
                    return None
                found += [s for s in more if s not in found]
            return found
        if function in self.module.body:  # a global read inside a function: the module's binding, if only one
            bindings = self.statements(self.module, name)
            return [bindings[-1]] if len(bindings) == 1 else None
        return None

    def passed_by_callers(self, function: cst.FunctionDef, parameter: str) -> list[tuple[cst.Call, str]] | None:
        """(call, name) for each call of the module-level ``function``, each passing a plain name for
        ``parameter``; None when a call passes something else (or the function is not called at all)."""
        if function not in self.module.body:
            return None
        if self._callers is None:
            self._callers = {}
            for call in self.q.index.of_type(self.module, cst.Call):
                if isinstance(call.func, cst.Name):
                    self._callers.setdefault(call.func.value, []).append(call)
        position = parameters_of(function).index(parameter)
        found = []
        for call in self._callers.get(function.name.value, ()):
            arg = argument(call, position, parameter)
            if arg is None or not isinstance(arg.value, cst.Name):
                return None
            found.append((call, arg.value.value))
        return found or None


def parameters_of(function: cst.FunctionDef) -> list[str]:
    params = function.params
    return [p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)]


def value_of(statement: cst.BaseStatement | None, name: str) -> cst.BaseExpression | None:
    """The expression ``statement`` assigns to ``name`` when it is a plain ``name = value``."""
    if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
        return None
    small = statement.body[0]
    if isinstance(small, cst.Assign) and any(isinstance(t.target, cst.Name) and t.target.value == name
                                             for t in small.targets):
        return small.value
    if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.target.value == name:
        return small.value
    return None
