"""Static graph fed from a ``paddle.io.DataLoader``: the loader is sharded, not the arrays it yields."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.calls import argument
from ...codemod.rule import Rule
from .graph_mode import stands_down
from .static_common import executor_runs, program_kind, simple_assignments

STATIC_DATA = frozenset({"paddle.static.data", "paddle.static.input.data"})


def training_runs(q) -> list[tuple[cst.Call, cst.Arg]]:
    """``(exe.run(...), its feed=)`` for every run of the training (main) program that feeds something."""
    assigned = simple_assignments(q)
    runs = []
    for run in executor_runs(q):
        program, feed = argument(run, 0, "program"), argument(run, 1, "feed")
        if feed is not None and program_kind(q, program.value if program else None, assigned) == "main":
            runs.append((run, feed))
    return runs


def feeding_loader(q, run: cst.Call, feed: cst.Arg) -> cst.Call | None:
    """The ``paddle.io.DataLoader(...)`` whose batches every value of ``feed`` is (``for x, y in loader():``)."""
    if not isinstance(feed.value, cst.Dict) or not feed.value.elements:
        return None
    loaders = set()
    for element in feed.value.elements:
        if not (isinstance(element, cst.DictElement) and isinstance(element.value, cst.Name)):
            return None
        loop = next((a for a in q.ancestors(run) if isinstance(a, cst.For) and element.value.value in _bound(a.target)),
                    None)
        loader = _loader_of(q, loop.iter) if loop is not None else None
        if loader is None:
            return None
        loaders.add(loader)
    return loaders.pop() if len(loaders) == 1 else None


def _bound(target: cst.BaseExpression) -> set[str]:
    if isinstance(target, cst.Name):
        return {target.value}
    if isinstance(target, (cst.Tuple, cst.List)):
        return set().union(*(_bound(e.value) for e in target.elements))
    return set()


def _loader_of(q, iterable: cst.BaseExpression) -> cst.Call | None:
    """``loader()``, ``loader``, ``enumerate(loader())``: the DataLoader construction they read."""
    if m.matches(iterable, m.Call(func=m.Name("enumerate"))) and iterable.args:
        iterable = iterable.args[0].value
    if isinstance(iterable, cst.Call) and not iterable.args and isinstance(iterable.func, cst.Name):
        iterable = iterable.func  # loader(): the callable idiom
    loaders = q.vocabulary.data_loaders
    if isinstance(iterable, cst.Call) and q.is_call_to(iterable, loaders):
        return iterable
    if isinstance(iterable, cst.Name):
        assigns = simple_assignments(q).get(iterable.value, ())
        if len(assigns) == 1 and isinstance(assigns[0].value, cst.Call) and q.is_call_to(assigns[0].value, loaders):
            return assigns[0].value
    return None


class StaticLoaderShard(Rule):
    """Shard the ``paddle.io.DataLoader`` a static-graph training loop feeds from: ``dp.distributed_loader(...)``.

    Why: in static graph mode a DataLoader yields ``DenseTensor``s, which ``dp.shard`` of every fed array would
    have to cut after every rank read the whole batch (and, shuffled without a seed, a different one on each
    rank). A ``DistributedBatchSampler`` gives each rank its own part of every epoch instead, with one shuffle
    every rank agrees on. Under ``--batch global`` its batch size becomes ``dp.per_rank_batch_size(B)``.
    Example:  loader = paddle.io.DataLoader(ds, batch_size=16)
              for x, y in loader(): exe.run(main, feed={"x": x, "y": y}, fetch_list=[loss])
           -> loader = dp.distributed_loader(paddle.io.DataLoader(ds, batch_size=dp.per_rank_batch_size(16)))
    Leaves alone: feeds that are not all batches of one loader (``static-feed-shard``), a loader with its own
    ``batch_sampler=`` (declined).
    """

    name = "static-loader-shard"
    generations = ("static",)

    def finish(self) -> None:
        if stands_down(self.ctx):
            return
        done: set[int] = set()
        for run, feed in training_runs(self.q):
            loader = feeding_loader(self.q, run, feed)
            if loader is None or id(loader) in done:
                continue
            done.add(id(loader))
            if argument(loader, 99, "batch_sampler") is not None:
                self.report(loader, "declined", "this DataLoader feeding the training program has its own "
                            "batch_sampler=: its sampling cannot be sharded for it", "use paddle.io."
                            "DistributedBatchSampler(dataset, batch_size, shuffle=..., drop_last=...)")
                continue
            self.ctx.plan.replace(loader, lambda updated: self.dp_call("distributed_loader", updated))
            self.report(loader, "change", "the DataLoader feeding the training program is sharded: "
                        f"{self.ctx.alias}.distributed_loader gives each rank a disjoint part of every epoch",
                        effect="shard")
            if self.ctx.options.batch != "global":
                continue
            size = argument(loader, 99, "batch_size")
            if size is None:
                self.report(loader, "declined", "--batch global: cannot find this DataLoader's batch size",
                            f"pass batch_size={self.ctx.alias}.per_rank_batch_size(B), B being the global batch size")
                continue
            self.ctx.plan.replace(size, lambda updated: updated.with_changes(
                value=self.dp_call("per_rank_batch_size", updated.value)))
            self.report(size, "change", f"--batch global: batch size {self.code(size.value)} -> "
                        f"{self.ctx.alias}.per_rank_batch_size(...), so the global batch stays the same",
                        effect="split-batch")


class StaticBatchDimension(Rule):
    """Under ``--batch global``, a ``paddle.static.data`` fixed to the batch size takes the per-rank batch.

    Why: each rank now feeds ``B / N`` rows, and the executor refuses a feed whose shape differs from a fixed
    one (``shape=[batch_size, 64]``). ``dp.per_rank_batch_size(batch_size)`` is what each rank feeds.
    Example:  paddle.static.data("x", shape=[batch_size, 64])
           -> paddle.static.data("x", shape=[dp.per_rank_batch_size(batch_size), 64])
    Leaves alone: a first dimension of ``None`` or ``-1`` (any batch), and every shape under ``--batch per-device``.
    """

    name = "static-batch-dimension"
    generations = ("static",)

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.options.batch != "global" or not self.q.is_call_to(node, STATIC_DATA) or stands_down(self.ctx):
            return
        shape = argument(node, 1, "shape")
        if shape is None or not isinstance(shape.value, (cst.List, cst.Tuple)) or not shape.value.elements:
            return
        first = shape.value.elements[0]
        if m.matches(first.value, m.Name("None") | m.UnaryOperation(operator=m.Minus(), expression=m.Integer("1"))):
            return
        if not self._fed(node):
            return
        self.ctx.plan.replace(first, lambda updated: updated.with_changes(
            value=self.dp_call("per_rank_batch_size", updated.value)))
        self.report(first, "change", f"--batch global: the fixed batch dimension {self.code(first.value)} -> "
                    f"{self.ctx.alias}.per_rank_batch_size(...): each rank feeds its part of every batch",
                    effect="split-batch")

    def _fed(self, node: cst.Call) -> bool:
        """The variable ``node`` declares is fed to the training program: by its name (``"x"``), or as ``x.name``."""
        name = argument(node, 0, "name")
        declared = name.value.evaluated_value if name is not None and isinstance(name.value, cst.SimpleString) else None
        statement = self.q.statement_of(node)
        held = self.q.assigned_names(statement) if isinstance(statement, cst.SimpleStatementLine) else set()
        for _run, feed in training_runs(self.q):
            if not isinstance(feed.value, cst.Dict):
                continue
            for element in feed.value.elements:
                key = getattr(element, "key", None)
                if isinstance(key, cst.SimpleString) and key.evaluated_value == declared:
                    return True
                if m.matches(key, m.Attribute(value=m.Name(), attr=m.Name("name"))) and key.value.value in held:
                    return True
        return False
