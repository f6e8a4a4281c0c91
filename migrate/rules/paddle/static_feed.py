"""Static graph: each rank feeds its own part of every batch (``--batch global``)."""

from __future__ import annotations

import libcst as cst

from ...codemod.calls import argument
from ...codemod.rule import Rule
from .static_common import executor_runs, program_kind, simple_assignments


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
        assigned = simple_assignments(self.q)
        runs = []
        for run in executor_runs(self.q):
            program, feed = argument(run, 0, "program"), argument(run, 1, "feed")
            if feed is not None and program_kind(self.q, program.value if program else None, assigned) == "main":
                runs.append((run, feed))
        if not runs:
            return
        if self.ctx.options.batch != "global":
            self.report(runs[0][0], "note", "every rank feeds the same batches to the training program (--batch "
                        "per-device): correct, the averaged gradients are identical, but no faster",
                        "convert with --batch global (each rank feeds dp.shard(...) of every batch), or shard the "
                        "data before batching it, e.g. inputs = dp.shard(inputs)")
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
                        "(--batch global)")

    def _sharded(self, value: cst.BaseExpression) -> bool:
        return isinstance(value, cst.Call) and self.q.is_call_to(value, {f"{self.vocabulary.runtime_module}.shard"})
