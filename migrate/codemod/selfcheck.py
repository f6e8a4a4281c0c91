"""The engine's checks of its own conversion, whatever the rules did ("never silently wrong, by construction").

1. **No converter-made divergence.** In the tree the plan produces, a runtime collective (``dp.save``,
   ``dp.broadcast``, ``dp.all_reduce``, ``dp.barrier``...) must not sit in a block that the conversion gave to
   some ranks only: ``if dp.is_main_process():`` (or ``dp.rank() == 0``...) and ``with dp.main_process_first():``
   (the main process runs its block alone first; a collective in there waits for ranks that wait for it).
   :func:`divergent_sites` reads only the top-level statements the plan changed (unchanged ones are the
   original's very objects), by the alias the file binds the runtime to: no second parse, no scope analysis.
2. **Coverage.** Every training step the file shows must end distributed or declined: for each loop that runs a
   step, something must be said about the data it iterates (sharded, noted, declined), and about the optimizer
   that steps (wrapped, noted, declined). :func:`uncovered` finds the loops and optimizers no finding speaks
   about, where a finding speaks about a node when it lies inside the node's text, or inside the definition of
   a name it uses (followed through assignments, the functions they call, and a function's parameters to its
   call sites). Data built where the file cannot see (a local module, an attribute) is given the benefit of the
   doubt: the conversion of that module answers for it.

The engine (:mod:`.engine`) turns a divergence into the rules' edits being dropped and declined, and an
uncovered site into a ``declined`` finding with the manual fix.
"""

from __future__ import annotations

import libcst as cst

from ..findings import Finding
from .index import TreeIndex
from .query import Query
from .vocabulary import RUNTIME_COLLECTIVES
from .walk import children, walk

COVERAGE_RULE = "coverage"
SELF_CHECK_RULE = "self-check"
_RANK_TESTS = ("is_main_process", "rank", "local_rank")
_ITERATION_HELPERS = {"enumerate", "zip", "iter", "tqdm", "list", "tuple", "sorted", "reversed", "range", "len"}


# --- 1. converter-made divergence ------------------------------------------------------------------------------


def divergent_sites(new: cst.Module, index: TreeIndex, alias: str) -> list[str]:
    """``dp.save(...) under `if dp.is_main_process():` ...``: every runtime collective the conversion put inside a
    block that only some ranks (or one rank at a time) run. Only the nodes the plan made are read: an unchanged
    subtree is the original's very object, and holds neither a guard nor a runtime call of the conversion."""
    found: list[str] = []
    checker = _GuardedCollectives(alias, found, new)
    for statement in new.body:
        if not index.is_original(statement):
            checker.walk(statement, index, guard=None)
    return found


class _GuardedCollectives:
    def __init__(self, alias: str, found: list[str], module: cst.Module) -> None:
        self.alias, self.found, self.module = alias, found, module

    def _runtime_call(self, node: cst.CSTNode, names: tuple[str, ...]) -> str | None:
        if (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                and isinstance(node.func.value, cst.Name) and node.func.value.value == self.alias
                and node.func.attr.value in names):
            return node.func.attr.value
        return None

    def _rank_test(self, test: cst.BaseExpression) -> bool:
        return any(self._runtime_call(n, _RANK_TESTS) for n in walk(test))

    def walk(self, node: cst.CSTNode, index: TreeIndex, guard: str | None) -> None:
        """Record runtime collectives under ``guard`` (the innermost rank guard around ``node``, or None)."""
        if index.is_original(node):
            return
        if isinstance(node, cst.FunctionDef):
            guard = None  # a function body runs where it is called, not where it is defined
        what = self._runtime_call(node, RUNTIME_COLLECTIVES)
        if what is not None and guard is not None:
            self.found.append(f"{self.alias}.{what}(...) under `{guard}`")
        inner = guard
        if isinstance(node, (cst.If, cst.IfExp)) and self._rank_test(node.test):
            inner = ("... if " if isinstance(node, cst.IfExp) else "if ") + self.module.code_for_node(node.test)
        elif isinstance(node, cst.With) and any(self._runtime_call(i.item, ("main_process_first",)) for i in node.items):
            inner = f"with {self.alias}.main_process_first()"
        for child in children(node):
            entering = isinstance(node, cst.With) and isinstance(child, cst.WithItem)  # every rank enters the block
            condition = isinstance(node, (cst.If, cst.IfExp)) and child is node.test  # every rank tests it
            self.walk(child, index, guard if entering or condition else inner)


# --- 2. coverage ----------------------------------------------------------------------------------------------------


def uncovered(ctx, findings: list[Finding]) -> list[Finding]:
    """``declined`` findings for training loops and optimizers that no finding speaks about."""
    q: Query = ctx.query
    vocabulary = ctx.vocabulary
    spots = [(f.line, f.col) for f in findings if f.path == ctx.path]
    coverage = _Coverage(ctx, spots)
    out: list[Finding] = []
    seen_loops: set[int] = set()
    seen_optimizers: set[str] = set()
    for call in q.index.of_type(ctx.module, cst.Call):
        if not _is_step(call, vocabulary):
            continue
        loop = _loop_of(q, call)
        if loop is not None and id(loop) not in seen_loops:
            seen_loops.add(id(loop))
            if not coverage.speaks_about_data(loop):
                out.append(coverage.finding(loop, "declined", (
                    f"this training loop reads `{_short(ctx, loop.iter)}` and nothing in the conversion shards it or says "
                    "why: every rank would train on all of it (the engine's coverage check)"),
                    "pass the training data through dp.distributed_loader(...) (a DataLoader or a tf.data.Dataset) or "
                    "dp.shard(...) (a sequence) where it is built, or tell dpmigrate about it by converting the module "
                    "that builds it"))
        owner = call.func.value if isinstance(call.func, cst.Attribute) else None
        stepping = (*vocabulary.optimizer_step_methods, *vocabulary.backward_methods)  # (TF: apply_gradients)
        if (isinstance(owner, cst.Name) and call.func.attr.value in stepping
                and owner.value not in seen_optimizers and _looks_like_optimizer(owner.value)):
            seen_optimizers.add(owner.value)
            if not coverage.speaks_about_name(owner.value, call):
                out.append(coverage.finding(call, "declined", (
                    f"`{owner.value}` steps here, and nothing in the conversion distributes it or says why: each rank "
                    "would apply its own gradients (the engine's coverage check)"),
                    f"wrap it where it is built: {owner.value} = dp.distributed_optimizer(...), and the model it trains "
                    "with dp.distributed_model(...)"))
    return out


def _is_step(call: cst.Call, vocabulary) -> bool:
    if not isinstance(call.func, cst.Attribute):
        return False
    name = call.func.attr.value
    if name in vocabulary.backward_methods:
        return True
    owner = call.func.value
    return name in vocabulary.optimizer_step_methods and isinstance(owner, cst.Name) and _looks_like_optimizer(owner.value)


def _looks_like_optimizer(name: str) -> bool:
    return "opt" in name.lower()


def _loop_of(q: Query, node: cst.CSTNode) -> cst.For | None:
    """The innermost ``for`` around ``node`` in its function (a ``while`` is not a data loop)."""
    for ancestor in q.ancestors(node):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.While)):
            return None
        if isinstance(ancestor, cst.For):
            return ancestor
    return None


def _short(ctx, node: cst.CSTNode) -> str:
    text = ctx.module.code_for_node(node)
    return text if len(text) <= 60 else text[:57] + "..."


class _Coverage:
    """Whether some finding lies inside a node's text, or inside what defines the names it uses."""

    def __init__(self, ctx, spots: list[tuple[int, int]]) -> None:
        self.ctx, self.q, self.spots = ctx, ctx.query, spots
        self._imports: set[str] | None = None

    def finding(self, node: cst.CSTNode, severity: str, message: str, fix: str) -> Finding:
        start = self.ctx.positions[node].start
        return Finding(self.ctx.path, start.line, start.column + 1, COVERAGE_RULE, severity,
                       self.ctx.in_alias(message), self.ctx.in_alias(fix))

    def _inside(self, node: cst.CSTNode) -> bool:
        where = self.ctx.positions[node]
        start, end = (where.start.line, where.start.column + 1), (where.end.line, where.end.column + 1)
        return any(start <= spot <= end for spot in self.spots)

    def speaks_about_data(self, loop: cst.For) -> bool:
        header_start = self.ctx.positions[loop].start
        if any(spot == (header_start.line, header_start.column + 1) for spot in self.spots):
            return True  # a finding about the loop itself (a note on hand batching, a decline)
        if self._inside(loop.iter) or self._inside(loop.target):
            return True
        functions = self.q.module_functions()
        called = _called_functions(loop.iter)
        if any(name in functions and self._inside(functions[name]) for name in called):
            return True  # a loader-making function of this file: its findings speak about what it returns
        function = self.q.function_of(loop)
        if any(self._inside(assign) for name in called if name not in functions
               for assign, _ in self._assignments(name, function)):
            return True  # Paddle's `for x in loader():` calls the loader variable a finding made (or spoke about)
        return self._defined_with_a_finding(loop.iter, loop, depth=0)

    def speaks_about_name(self, name: str, at: cst.CSTNode) -> bool:
        if self._inside(at):
            return True
        return self._defined_with_a_finding(cst.Name(name), at, depth=0, names=[name])

    def _defined_with_a_finding(self, expression: cst.CSTNode, where: cst.CSTNode, depth: int,
                                names: list[str] | None = None) -> bool:
        """A finding in a definition of a name ``expression`` uses (assignments in scope, the module functions
        their values call, call-site arguments of a parameter); True as well when the data comes from where the
        file cannot see (a local module, an attribute, an import), and when nothing defines it here."""
        if depth > 3:
            return True
        names = names if names is not None else _names_in(expression)
        if not names:
            return not any(isinstance(c, cst.Call) for c in walk(expression)) or self._calls_only_builtins(expression)
        q = self.q
        function = q.function_of(where)
        for name in names:
            if name in self._imported() and (function is None or _parameter_index(function, name) is None):
                continue  # a module or a function: not data (unless a parameter shadows it: `def train(opt)`)
            definitions = self._assignments(name, function)
            if not definitions:
                parameter = _parameter_index(function, name) if function is not None else None
                if parameter is None:
                    return True  # imported, global of another scope, a loop variable: not the file's to judge here
                if self._arguments_with_a_finding(function, parameter, depth):
                    return True
                continue
            for assign, value in definitions:
                if self._inside(assign) or self._calls_a_function_with_a_finding(value):
                    return True
                if any(self._from_elsewhere(c) for c in q.index.of_type(value, cst.Call)) or isinstance(
                        value, cst.Attribute):
                    return True
                if self._defined_with_a_finding(value, assign, depth + 1):
                    return True
        return False

    def _imported(self) -> set[str]:
        """The names the file's imports bind (``tf``, ``DataLoader``...), anywhere in it."""
        if self._imports is None:
            self._imports = set()
            for node in self.q.index.of_type(self.ctx.module, cst.Import, cst.ImportFrom):
                aliases = node.names if not isinstance(node.names, cst.ImportStar) else []
                for alias in aliases:
                    bound = alias.asname.name if alias.asname else alias.name
                    while isinstance(bound, cst.Attribute):
                        bound = bound.value
                    if isinstance(bound, cst.Name):
                        self._imports.add(bound.value)
        return self._imports

    def _calls_only_builtins(self, expression: cst.CSTNode) -> bool:
        """Whether ``expression`` is a call of an iteration helper (``enumerate(loader())``), or a tuple of such
        calls (``a, b = zip(...), zip(...)``); any other expression (a tuple of other calls) is not."""
        outer = [expression] if isinstance(expression, cst.Call) else [e.value for e in getattr(expression, "elements", ())]
        return bool(outer) and all(isinstance(c, cst.Call) and isinstance(c.func, cst.Name)
                                   and c.func.value in _ITERATION_HELPERS for c in outer)

    def _assignments(self, name: str, function) -> list[tuple[cst.CSTNode, cst.BaseExpression]]:
        scope = function if function is not None else self.ctx.module
        found = []
        for assign in self.q.index.of_type(scope, cst.Assign):
            if function is None and self.q.function_of(assign) is not None:
                continue
            if any(name in _target_names(t.target) for t in assign.targets):
                found.append((assign, assign.value))
        for assign in self.q.index.of_type(scope, cst.AnnAssign):
            if assign.value is not None and name in _target_names(assign.target):
                found.append((assign, assign.value))
        if not found and function is not None:
            return self._assignments(name, None) if _parameter_index(function, name) is None else []
        return found

    def _calls_a_function_with_a_finding(self, value: cst.BaseExpression) -> bool:
        functions = self.q.module_functions()
        for call in self.q.index.of_type(value, cst.Call):
            if isinstance(call.func, cst.Name) and call.func.value in functions and self._inside(functions[call.func.value]):
                return True
        return False

    def _from_elsewhere(self, call: cst.Call) -> bool:
        """A call of something the file imports or reaches through an attribute (a local module's loader
        builder, ``self.make_loader()``): the file cannot see inside."""
        if isinstance(call.func, cst.Attribute):
            root = call.func.value
            while isinstance(root, cst.Attribute):
                root = root.value
            if isinstance(root, cst.Name) and root.value in self.ctx.options.local_modules:
                return True
            return isinstance(root, cst.Name) and root.value == "self"
        if not isinstance(call.func, cst.Name) or call.func.value in self.q.module_functions() \
                or call.func.value in _ITERATION_HELPERS:
            return False
        names = self.q.index.qualified_names(call.func)  # `from data import make_loaders`: data.make_loaders
        return not names or any(n.lstrip(".").split(".")[0] in self.ctx.options.local_modules for n in names)

    def _arguments_with_a_finding(self, function: cst.FunctionDef, parameter: int, depth: int) -> bool:
        sites = [c for c in self.q.index.of_type(self.ctx.module, cst.Call)
                 if isinstance(c.func, cst.Name) and c.func.value == function.name.value]
        if not sites:
            return True  # called from elsewhere (another module, a framework): not the file's to judge
        for site in sites:
            positional = [a for a in site.args if a.keyword is None and not a.star]
            argument = positional[parameter] if parameter < len(positional) else None
            if argument is None:
                return True
            if self._inside(argument.value) or self._defined_with_a_finding(argument.value, site, depth + 1):
                return True
        return False


def _names_in(expression: cst.CSTNode) -> list[str]:
    """The names an iterable expression reads as data (``enumerate(ds.take(n), 1)`` -> ``ds``, ``n``): the roots of
    attributes and the arguments of calls, not the functions called."""
    found: list[str] = []

    class Names(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> bool:
            root = node
            while isinstance(root, (cst.Attribute, cst.Call, cst.Subscript)):
                if isinstance(root, cst.Call):
                    for arg in root.args:
                        arg.value.visit(self)
                    root = root.func
                else:
                    root = root.value
            if isinstance(root, cst.Name):
                found.append(root.value)
            return False

        def visit_Name(self, node: cst.Name) -> None:
            found.append(node.value)

        def visit_Call(self, node: cst.Call) -> bool:
            if isinstance(node.func, cst.Attribute):
                node.func.visit(self)
            for arg in node.args:
                arg.value.visit(self)
            return False

    expression.visit(Names())
    return [n for n in dict.fromkeys(found) if n not in _ITERATION_HELPERS]


def _called_functions(expression: cst.CSTNode) -> list[str]:
    return [c.func.value for c in walk(expression) if isinstance(c, cst.Call) and isinstance(c.func, cst.Name)]


def _target_names(target: cst.BaseExpression) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return {n for e in target.elements for n in _target_names(e.value)}
    return set()


def _parameter_index(function, name: str) -> int | None:
    if function is None:
        return None
    params = [*function.params.posonly_params, *function.params.params]
    for index, param in enumerate(params):
        if param.name.value == name:
            return index
    return None
