"""A local module's function that a script trains on, returning batches made by hand: said, not left silent."""

from __future__ import annotations

import libcst as cst

from ...codemod.rule import Rule
from .static_common import simple_assignments


class PaddleHandBatches(Rule):
    """Decline a function of a local module whose result a script trains on, when it is not a DataLoader.

    Why: the script's conversion hands this module the functions whose results its training loop reads
    (``loader = data.load_data(); for x, y in loader(): ...``), so that the DataLoader they build gets sharded.
    A function that returns batches it makes itself (a generator slicing arrays, shuffled with ``random``)
    has nothing to shard: every rank would read all of them (or, shuffled apart, different ones), while the
    report said the module was converted "so that they are sharded" (issue 19).
    Example (declined):  def load_data():
                             def generator():
                                 random.shuffle(order)
                                 for i in range(0, 64, 16): yield xs[order[i:i + 16]], ys[order[i:i + 16]]
                             return generator
    fix: return a ``paddle.io.DataLoader`` over a Dataset (the conversion then shards it), or yield each rank's
    part of every batch (``dp.shard(x)``), with the shuffle seeded alike on every rank.
    Leaves alone: functions returning a DataLoader (``paddle-shard-training-loader`` shards it).
    """

    name = "paddle-hand-batches"
    generations = ("dygraph", "static")

    def finish(self) -> None:
        functions = self.q.module_functions()
        loaders = self.vocabulary.data_loaders
        for name, position, role in getattr(self.ctx.options, "returned_roles", ()):
            function = functions.get(name.rsplit(".", 1)[-1])
            if role != "train" or function is None or returned_at_any(self.q, function) is None:
                continue
            if self._returns_a_loader(function, position, loaders):
                continue
            self.report(function, "declined", f"{name}() is what a script's training loop reads, and it returns batches "
                        "made by hand, not a paddle.io.DataLoader: nothing here can be sharded, so every rank would "
                        "read all of them (shuffled without a seed, different ones)", "return a paddle.io.DataLoader "
                        "over a paddle.io.Dataset (the conversion shards it), or yield each rank's part of every batch "
                        "(dp.shard(x), dp.shard(y)) with the shuffle seeded alike on every rank (random.seed(0))")

    def _returns_a_loader(self, function: cst.FunctionDef, position: int, loaders) -> bool:
        for ret in self.q.index.of_type(function, cst.Return):
            value = ret.value
            if self.q.function_of(ret) is not function or value is None:
                continue
            if position >= 0 and isinstance(value, cst.Tuple) and position < len(value.elements):
                value = value.elements[position].value
            if isinstance(value, cst.Call) and self.q.is_call_to(value, loaders):
                return True
            if isinstance(value, cst.Name):
                assigns = [a for a in simple_assignments(self.q).get(value.value, ()) if self.q.function_of(a) is function]
                if any(isinstance(a.value, cst.Call) and self.q.is_call_to(a.value, loaders) for a in assigns):
                    return True
        return False


def returned_at_any(q, function: cst.FunctionDef) -> cst.Return | None:
    """The first ``return <value>`` of ``function`` itself (not of a function nested in it)."""
    return next((r for r in q.index.of_type(function, cst.Return) if q.function_of(r) is function and r.value), None)
