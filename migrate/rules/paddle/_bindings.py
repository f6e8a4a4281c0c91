"""Which assignment a name holds at a given point: the dygraph rules follow bindings, not names.

Why: real scripts reuse names. ``model = paddle.Model(Net())`` is fitted, then ``model = Net()`` is trained by a
hand-written loop (issue 19, item 1); ``model = SimpleNet()`` is built, trained, then built and trained again
(a tutorial comparing two settings). Deciding by the name alone left the second model unwrapped (each rank
then trained its own copy on half of the data, silently). Here a read of ``name`` at ``node`` resolves to
the last statement of the same function (or of the module) that binds ``name`` before ``node``, in source
order; a function parameter resolves through the function's one caller to what that caller passes.

:class:`BoundModels` is the shared :class:`~dpmigrate.codemod.models.Models` analysis with that one
difference: a model is wrapped after the set-up of the binding its optimizer reads, so every construction
an optimizer trains is wrapped once (the shared analysis wraps the first binding of a name only; the same
change belongs there, for every framework: see the report of issue 19).
"""

from __future__ import annotations

import libcst as cst

from ...codemod.calls import argument
from ...codemod.flow import callers, returned_at
from ...codemod.models import Models, ModelSite, _sets_up
from ...codemod.query import body_statements, is_main_guard, target_names


def _position(ctx, node: cst.CSTNode) -> tuple[int, int]:
    start = ctx.positions[node].start
    return start.line, start.column


def _binding_statements(ctx, scope: cst.CSTNode, name: str) -> list[cst.BaseStatement]:
    """Statements of ``scope`` (its own, nested blocks included, nested functions and classes not) binding ``name``."""
    q = ctx.query
    found = []
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
        if name in bound:
            found.append(statement)
    return found


def parameters_of(function: cst.FunctionDef) -> list[str]:
    params = function.params
    return [p.name.value for p in (*params.posonly_params, *params.params, *params.kwonly_params)]


def reaching(ctx, node: cst.CSTNode, name: str) -> cst.BaseStatement | None:
    """The statement whose binding of ``name`` a read at ``node`` sees, or None when it cannot be told (or when
    several callers of the function pass different ones: see :func:`reachings`)."""
    found = reachings(ctx, node, name)
    return found[0] if found is not None and len(found) == 1 else None


def reachings(ctx, node: cst.CSTNode, name: str, depth: int = 0) -> list[cst.BaseStatement] | None:
    """Every statement whose binding of ``name`` a read at ``node`` may see; None when one of them cannot be told.

    The last binding before ``node`` in its function (or the module); for a parameter of a module-level
    function, the bindings its callers pass (each caller passing a plain name)."""
    q = ctx.query
    function = q.function_of(node)
    scope = function if function is not None else ctx.module
    here = _position(ctx, node)
    before = [s for s in _binding_statements(ctx, scope, name) if _position(ctx, s) < here]
    if before:
        return [before[-1]]
    if function is None or depth > 3:
        return None
    if name in parameters_of(function):
        passed = passed_by_callers(ctx, function, name)
        if not passed:
            return None
        found: list[cst.BaseStatement] = []
        for call, value in passed:
            more = reachings(ctx, call, value, depth + 1)
            if more is None:
                return None
            found += [s for s in more if s not in found]
        return found
    if function in q.module.body:  # a global read inside a function: the module's binding, when there is one
        bindings = _binding_statements(ctx, ctx.module, name)
        return [bindings[-1]] if len(bindings) == 1 else None
    return None


def passed_by_callers(ctx, function: cst.FunctionDef, parameter: str) -> list[tuple[cst.Call, str]] | None:
    """(call, name) for each call of the module-level ``function``, each passing a plain name for ``parameter``;
    None when a call passes something else (or the function is not called at all)."""
    if function not in ctx.module.body:
        return None
    calls = callers(ctx.query, function)
    position = parameters_of(function).index(parameter)
    found = []
    for call in calls:
        arg = argument(call, position, parameter)
        if arg is None or not isinstance(arg.value, cst.Name):
            return None
        found.append((call, arg.value.value))
    return found or None


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


class BoundModels(Models):
    """:class:`Models`, each model wrapped after the binding its optimizer reads (see the module docstring)."""

    def __init__(self, ctx) -> None:
        self.ctx = ctx
        super().__init__(ctx)

    def _model_sites(self):
        """The shared sites; a model that is a parameter of the function training it is followed to each caller."""
        for site, name in super()._model_sites():
            function = self.q.function_of(site)
            if function is not None and name in parameters_of(function) and not any(
                    name in self.q.assigned_names(s) for s in body_statements(function)):
                passed = passed_by_callers(self.ctx, function, name)
                if passed:
                    yield from passed  # (the call, the caller's name): wrapped where each caller set it up
                    continue
            yield site, name

    def _variable_site(self, site: cst.CSTNode, name: str) -> ModelSite:
        binding = reaching(self.ctx, site, name)
        if binding is None:
            return super()._variable_site(site, name)
        scope = self.q.function_of(binding) or self.module
        if isinstance(scope, cst.FunctionDef) and returned_at(self.q, scope, name) is not None:
            return self._returned_site(site, scope, name)
        kept = self._kept_by_class(scope, name)
        if kept is not None:
            return kept
        holder = self._top_statement(scope, binding)
        if holder is None:
            return super()._variable_site(site, name)
        anchor = self._anchor_after(scope, holder, name)
        return ModelSite(site, name, "wrap" if anchor is not None else "inside", anchor)

    def _top_statement(self, scope: cst.CSTNode, node: cst.CSTNode) -> cst.BaseStatement | None:
        statements = list(body_statements(scope))
        for statement in statements:
            if self.q.index.contains(statement, node):
                return statement
        return None

    def _anchor_after(self, scope: cst.CSTNode, holder: cst.BaseStatement, name: str) -> cst.BaseStatement | None:
        """As :meth:`Models._anchor`, from ``holder`` (the statement that binds the model) instead of the first one."""
        statements = list(body_statements(scope))
        created = statements.index(holder)
        if not isinstance(holder, (cst.SimpleStatementLine, cst.FunctionDef, cst.ClassDef)) and self.q.trains(holder):
            enterable = isinstance(holder, cst.With) or (isinstance(holder, cst.If) and is_main_guard(holder))
            if not enterable or not isinstance(holder.body, cst.IndentedBlock):
                return None
            inner = [s for s in _binding_statements(self.ctx, self.q.function_of(holder) or self.module, name)
                     if self.q.index.contains(holder, s)]
            nested = self._top_statement(holder, inner[-1]) if inner else None
            return self._anchor_after(holder, nested, name) if nested is not None else self._anchor(holder, name)
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
