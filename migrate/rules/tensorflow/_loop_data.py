"""Where a hand-written TensorFlow training loop's batches come from, followed through wrappers and calls.

A loop trains on ``train_ds`` in many spellings: ``for x, y in train_ds``, ``for step, (x, y) in
enumerate(train_ds.take(n), 1)``, ``for a, b in zip(ds_a, ds_b)``, ``for batch in tqdm(ds)``, ``for step in
range(n): x, y = next(it)`` with ``it = iter(ds)``, or ``for batch in dataset`` inside ``def train(dataset,
epochs)`` called as ``train(train_ds, EPOCHS)``. :class:`LoopData` follows each to the expression that
builds the batched pipeline, which is where ``dp.distributed_loader`` goes (before a ``take``/``skip``
that counts batches, so each worker still takes its ``n``). What it cannot follow it says so (None), and
the rule declines: never a loop left reading every batch on every worker without a word.
"""

from __future__ import annotations

import dataclasses

import libcst as cst

from ...codemod import flow
from ...codemod import patterns as m
from ...codemod.calls import argument
from ._keras import KerasFile, chain_root

_WRAPPERS = {"enumerate", "zip", "iter", "tqdm", "trange", "list", "tuple", "sorted", "reversed"}
_COUNTING = {"take", "skip", "filter", "unbatch", "rebatch"}  # after .batch(B): counted in global batches
_BATCH = ("batch", "padded_batch")


@dataclasses.dataclass
class Site:
    """An expression that builds a batched ``tf.data`` pipeline: wrap it in ``dp.distributed_loader(...)``."""

    node: cst.BaseExpression
    scope: cst.CSTNode  # the function (or module) it is evaluated in
    name: str  # what the report calls it


class LoopData:
    """The training loops of a file and, for each, the pipelines it iterates."""

    def __init__(self, keras: KerasFile) -> None:
        self.keras = keras
        self.q = keras.q

    def training_loops(self) -> list[cst.For | cst.While]:
        """The innermost loops that run a custom step (directly, or by calling a function that does)."""
        steps = {f.name.value for f in self.q.index.of_type(self.keras.module, cst.FunctionDef)
                 if any(self.q.index.contains(f, s) for s in self.keras.custom_steps)}
        loops = [loop for loop in self.q.index.of_type(self.keras.module, cst.For, cst.While)
                 if self.q.trains(loop.body) or self.q.called_names(loop.body) & steps
                 or any(self.q.index.contains(loop.body, s) for s in self.keras.custom_steps)]
        return [loop for loop in loops if not any(o is not loop and self.q.index.contains(loop.body, o) for o in loops)
                and not (isinstance(loop, cst.For) and self.keras.is_tower_loop(loop))]

    def sites(self, loop: cst.For | cst.While) -> list[Site] | None:
        """The pipelines ``loop`` iterates; None when one of them cannot be followed to a batched dataset."""
        scope = self.keras.scope_of(loop)
        sources: list[cst.BaseExpression] = []
        if isinstance(loop, cst.For) and not m.matches(loop.iter, m.Call(func=m.Name("range"))):
            sources.append(loop.iter)
        called = [f for n, f in self.q.module_functions().items() if n in self.q.called_names(loop.body)]
        for place in (loop.body, *called):  # next(it) in the loop, or in the step function it calls
            for call in self.q.findall(place, m.Call(func=m.Name("next"))):
                if call.args:
                    sources.append(call.args[0].value)
        if not sources:
            return None
        found: list[Site] = []
        for source in sources:
            sites = self._follow(source, scope, loop, set())
            if sites is None:
                return None
            found += sites
        return found

    # --- following an expression -------------------------------------------------------------------

    def _follow(self, value: cst.BaseExpression, scope: cst.CSTNode, before: cst.CSTNode,
                seen: set[str], name: str = "the pipeline") -> list[Site] | None:
        if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value in _WRAPPERS:
            args = [a.value for a in value.args if a.keyword is None and not a.star]
            args = args if value.func.value == "zip" else args[:1]
            return self._all(args, scope, before, seen)
        if isinstance(value, cst.Call) and self.q.callee_starts_with(value, "tqdm") and value.args:
            return self._follow(value.args[0].value, scope, before, seen)
        if isinstance(value, (cst.Tuple, cst.List)):
            return self._all([e.value for e in value.elements], scope, before, seen)
        batch = self._batch_in_chain(value)
        if batch is not None:
            return [Site(self._site(value, batch), scope, name)]
        root = chain_root(value)
        if isinstance(root, cst.Call) and isinstance(root.func, cst.Name):  # make_dataset(...) of this module
            function = self.q.module_functions().get(root.func.value)
            if function is not None and self._returns_batched_dataset(function):
                return [Site(root, scope, f"{root.func.value}(...)")]
            return None
        if not isinstance(root, cst.Name) or root.value in seen:
            return None
        return self._follow_name(root.value, scope, before, seen | {root.value})

    def _all(self, values, scope, before, seen) -> list[Site] | None:
        found: list[Site] = []
        for value in values:
            sites = self._follow(value, scope, before, seen)
            if sites is None:
                return None
            found += sites
        return found

    def _follow_name(self, name: str, scope: cst.CSTNode, before: cst.CSTNode, seen: set[str]) -> list[Site] | None:
        assignment = self.keras.last_assignment_before(before, name) if scope is self.keras.scope_of(before) else None
        if assignment is None:
            earlier = [a for a in self.keras.assignments(scope, name)]
            assignment = earlier[-1] if earlier else None
        if assignment is None and scope is not self.keras.module:
            parameter = self._parameter(scope, name)
            if parameter is not None:
                return self._through_callers(scope, *parameter, seen)
            module_level = self.keras.assignments(self.keras.module, name)
            assignment = module_level[-1] if module_level else None
            scope = self.keras.module
        if assignment is None:
            return None
        return self._follow(assignment.value, scope, assignment.statement, seen, name)

    def _parameter(self, function: cst.FunctionDef, name: str) -> tuple[int, str] | None:
        params = [p.name.value for p in (*function.params.posonly_params, *function.params.params)]
        if name not in params:
            return None
        index = params.index(name)
        if params and params[0] in ("self", "cls"):
            return None  # a method: its callers are not this module's plain calls
        return index, name

    def _through_callers(self, function: cst.FunctionDef, index: int, name: str, seen: set[str]) -> list[Site] | None:
        callers = flow.callers(self.q, function)
        if not callers:
            return None
        found: list[Site] = []
        for call in callers:
            given = argument(call, index, name)
            if given is None:
                return None
            sites = self._follow(given.value, self.keras.scope_of(call), call, seen)
            if sites is None:
                return None
            found += sites
        return found

    # --- the pipeline ----------------------------------------------------------------------------------

    def _batch_in_chain(self, value: cst.BaseExpression) -> cst.Call | None:
        """The outermost ``.batch(B)`` call of the method chain ``value`` is (``ds.batch(B).prefetch(1)``)."""
        node = value
        while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
            if node.func.attr.value in _BATCH:
                return node
            node = node.func.value
        return None

    def _site(self, value: cst.BaseExpression, batch: cst.Call) -> cst.BaseExpression:
        """The whole chain, or only up to its ``.batch(B)`` when a ``take(n)``/``skip(n)`` follows (counted in
        batches: each worker must take its own ``n``)."""
        node = value
        while node is not batch:
            if node.func.attr.value in _COUNTING:
                return batch
            node = node.func.value
        return value

    def _returns_batched_dataset(self, function: cst.FunctionDef) -> bool:
        return bool(self.returned_batches(function))

    def returned_batches(self, function: cst.FunctionDef) -> list[cst.Call]:
        """The ``.batch(B)`` calls of the pipeline a module function returns (none: not a batched pipeline)."""
        returns = [r for r in self.q.index.of_type(function, cst.Return)
                   if r.value is not None and self.q.function_of(r) is function]
        if len(returns) != 1 or not self.keras.is_dataset_chain(returns[0].value, function):
            return []
        return self.keras.batch_calls(returns[0].value, function)
