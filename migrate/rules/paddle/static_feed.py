"""Static graph: each rank feeds its own part of every batch (``--batch global``)."""

from __future__ import annotations

import libcst as cst

from ...codemod.rule import Rule
from .graph_mode import stands_down
from .static_loader import feeding_loader, training_runs
from .static_optimizer import minimized

_SEEDS = frozenset({"random.seed", "numpy.random.seed"})
_SHUFFLES = frozenset({"random.shuffle", "numpy.random.shuffle", "numpy.random.permutation", "paddle.reader.shuffle",
                       "paddle.fluid.io.shuffle", "paddle.reader.decorator.shuffle"})


class StaticFeedShard(Rule):
    """Under ``--batch global``, wrap each array fed to the training program in ``dp.shard(...)``.

    Why: a static-graph script batches by hand and feeds ``exe.run(feed={...})``; every rank would
    feed the same batch. ``dp.shard(batch)`` is this rank's contiguous part of it (the first ranks take
    one more row when uneven), so N ranks together train on exactly the original batch: with the
    averaged gradients, the same trajectory as the original (checked on 2 processes here).
    Example:  exe.run(main, feed={"x": xb, "y": yb}, fetch_list=[loss])
           -> exe.run(main, feed={"x": dp.shard(xb), "y": dp.shard(yb)}, fetch_list=[loss])
    Under ``--batch per-device`` (the default) nothing changes and a note says so: every rank feeds
    the same batches, which is correct (identical gradients averaged) but gives no speed-up; shard the
    data source before batching for one. Only runs of the training program (the main program,
    ``minimize``'s) are changed; evaluation and startup runs are not.
    Leaves alone (declined): a feed that is not a dict written in the call (``feed=gen_data()``).
    """

    name = "static-feed-shard"
    generations = ("static",)

    def finish(self) -> None:
        if stands_down(self.ctx):
            return
        runs = [(run, feed) for run, feed in training_runs(self.q) if feeding_loader(self.q, run, feed) is None]
        if not runs:
            return  # nothing fed by hand (a DataLoader's batches: static-loader-shard)
        if self.ctx.options.batch != "global":
            self._note_same_batches(runs[0][0])
            return
        for _run, feed in runs:
            if not isinstance(feed.value, cst.Dict) or any(
                    not isinstance(e, cst.DictElement) for e in feed.value.elements):  # `**batch`: not one by one
                self.report(feed, "declined", f"feed={self.code(feed.value)} is not a dict written here, so its "
                            "arrays cannot be sharded one by one", "feed {name: dp.shard(value) for name, value in "
                            f"({self.code(feed.value)}).items()}}: each rank its part of the batch")
                continue
            for element in feed.value.elements:
                if not self._sharded(element.value):
                    self.ctx.plan.replace(element.value, lambda updated: self.dp_call("shard", updated))
            self.report(feed, "change", "fed arrays -> dp.shard(...): each rank feeds its part of every batch "
                        "(--batch global)", effect="split-batch")

    def _note_same_batches(self, run: cst.Call) -> None:
        """What feeding every rank the whole batch does here: says so truthfully (issue 19, item 8)."""
        fix = (f"convert with --batch global (each rank feeds {self.ctx.alias}.shard(...) of every batch), or shard the "
               f"data before batching it, e.g. inputs = {self.ctx.alias}.shard(inputs)")
        if any(target is None for *_, target in minimized(self.ctx)):
            self.report(run, "note", "every rank feeds the whole of every batch (--batch per-device), and the optimizer "
                        "was not converted (declined above): nothing is averaged, each rank trains its own copy",
                        fix)
        elif self._shuffled_unseeded():
            self.report(run, "note", "every rank feeds whole batches (--batch per-device), shuffled without a seed: "
                        "each rank feeds different batches, so the averaged gradient is that of N batches (N times "
                        "the global batch), not the original's", f"seed the shuffle alike on every rank, or {fix}")
        else:
            self.report(run, "note", "every rank feeds the same batches to the training program (--batch "
                        "per-device): correct, the averaged gradients are identical, but no faster", fix)

    def _shuffled_unseeded(self) -> bool:
        calls = self.q.index.of_type(self.ctx.module, cst.Call)
        seeded = any(self.q.is_call_to(c, _SEEDS) for c in calls)
        return not seeded and any(self.q.is_call_to(c, _SHUFFLES) for c in calls)

    def _sharded(self, value: cst.BaseExpression) -> bool:
        return isinstance(value, cst.Call) and self.q.is_call_to(value, {f"{self.vocabulary.runtime_module}.shard"})
