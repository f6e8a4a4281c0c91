"""``paddle.Model`` (the high-level API) distributes itself: say so, and make its reload wait for its save."""

from __future__ import annotations

import libcst as cst

from ...codemod.calls import argument
from ...codemod.loaders import LoaderFlow
from ...codemod.models import Models
from ...codemod.ranks import RankAnalysis
from ...codemod.rule import Rule
from ._analyses import PREDICTION, HighLevelModels

SUMMARIES = frozenset({"paddle.summary", "paddle.hapi.summary", "paddle.hapi.model_summary.summary"})
CHECKPOINTS = frozenset({"paddle.callbacks.ModelCheckpoint", "paddle.hapi.callbacks.ModelCheckpoint"})


class PaddleHighLevelApi(Rule):
    """Report what ``paddle.Model`` does by itself under a launcher, and wait before a reload.

    Why: measured with Paddle 3.3.1 on 2 gloo ranks: once ``dp.init()`` has joined the job, ``prepare``
    wraps the network in ``DataParallel``, ``fit``/``evaluate`` shard a Dataset (``batch_size`` per rank)
    and ``save`` writes on local rank 0 only, but returns on the other ranks at once. So the network and
    its optimizer are not wrapped again (``paddle-distributed-model``/``-optimizer``), DataLoaders handed
    to ``fit`` are sharded (``paddle-shard-training-loader``), ``--batch global`` divides ``fit``'s
    ``batch_size`` (``paddle-global-batch-size``), and the ranks wait after a ``save`` (or a ``fit`` writing its
    checkpoints: ``save_dir``, ``ModelCheckpoint``) and before a later ``load`` of what the script saved.
    Example:  model.save("ckpt/final")              model.save("ckpt/final")
              model.load("ckpt/final")      ->      dp.barrier()
                                                    model.load("ckpt/final")
    ``model.summary(...)`` and ``paddle.summary(net, ...)`` (a table printed by every rank otherwise) run on the
    main process only: they run the layer itself (``dp.unwrap`` of a wrapped one), not its DataParallel wrapper,
    so no rank waits for them.
    Leaves alone: everything else of the high-level API (it is distributed already); a ``load`` that is
    not a statement of its own (declined); static-graph files.
    """

    name = "paddle-high-level-api"
    generations = ("dygraph",)

    def finish(self) -> None:
        high_level = self.ctx.analysis(HighLevelModels)
        for construction in high_level.constructions if high_level.calls else ():  # (never called: no note)
            self.report(construction, "note",
                        "paddle.Model distributes itself once dp.init() has joined the job: prepare() wraps the "
                        "network in DataParallel and fit()/evaluate() shard a Dataset; its network and optimizer "
                        "are not wrapped again", effect="shard" if high_level.of("fit") else None)
        for step in high_level.of("train_batch"):
            if not any(isinstance(a, (cst.For, cst.While)) for a in self.q.ancestors(step.call)):  # (loops: noted there)
                self.report(step.call, "note", "train_batch(...) trains on the tensors it is handed, which the conversion "
                            "does not split: every rank trains on the same batch, correct (the averaged gradient is "
                            "the original's) as long as they are the same on every rank, but no faster",
                            f"give each rank its part of the batch: {step.model}.train_batch([dp.shard(x)], "
                            "[dp.shard(y)])")
        for summary in high_level.of("summary"):
            self._main_process_only(summary.call)
        wrapped = set(self.ctx.analysis(Models).wrapped)
        for call in self.q.index.of_type(self.ctx.module, cst.Call):
            if self.q.is_call_to(call, SUMMARIES):  # paddle.summary(net, input_size): the same table, as a function
                layer = argument(call, 0, "net")
                if layer is not None and isinstance(layer.value, cst.Name) and layer.value.value in wrapped:
                    self.ctx.plan.replace(layer, lambda updated: updated.with_changes(
                        value=self.dp_call("unwrap", updated.value)))
                self._main_process_only(call)
        saves = [c for c in high_level.of("save")] + [c for c in high_level.of("fit") if self._writes_checkpoints(c.call)]
        barriered = set()
        for save in saves:
            statement = self.q.statement_of(save.call)
            what = f"{save.model}.{save.method}(...)" + (" with save_dir" if save.method == "fit" else "")
            if (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
                    and isinstance(statement.body[0], (cst.Expr, cst.Assign)) and not self._conditional(statement)):
                self.ctx.plan.insert_after(statement, self.statement("{dp}.barrier()\n"))
                barriered.add(id(save.call))
                self.report(save.call, "change", f"dp.barrier() after {what}: paddle.Model writes its files on "
                            "(local) rank 0 only and returns at once on the others, which then wait until the files "
                            "exist (a report written into the folder it makes failed on rank 1, and a reload of fit's "
                            "final checkpoint read a missing or an earlier run's file: issue 19 audits)")
                continue
            self.report(save.call, "note", f"{what} writes on (local) rank 0 only, as paddle.Model "
                        "does under a launcher; the other ranks do not wait for it")
        for found in high_level.of("evaluate"):
            self.report(found.call, "note", f"{found.model}.evaluate(...): the loss it returns is this rank's share "
                        "of the data (metrics are gathered over the ranks); print it from the main process")
        for found in high_level.of("fit"):  # (issue 19 audit: "acc: 1.0000" on 2 ranks for the original's 0.8750)
            self.report(found.call, "note", f"{found.model}.fit(...): the training loss and metrics it prints are "
                        "rank 0's share of each batch (paddle.Model does not gather them while training; of its "
                        "evaluation it gathers the metrics, not the loss): those figures differ from one process's, "
                        "the training does not")
        loaders = {loader.name for loader in self.ctx.analysis(LoaderFlow).loaders if loader.name}
        for found, arg in high_level.data_arguments(PREDICTION):
            value = arg.value
            if (isinstance(value, cst.Name) and value.value in loaders) or self.q.is_call_to(
                    value, self.vocabulary.data_loaders):
                continue  # a DataLoader: read whole by every rank, each predicts all of it
            self.report(found.call, "note", f"{found.model}.predict(...) of a Dataset: launched, paddle.Model gives "
                        "each rank its share and gathers the predictions only on GPUs: on CPU ranks it returns this "
                        "rank's share, in the sampler's order (the issue 19 audit printed 5 of 10, mis-paired)",
                        f"hand it a DataLoader over the Dataset (left whole: every rank predicts all of it), "
                        f"e.g. {found.model}.predict(paddle.io.DataLoader(dataset, batch_size=...))")
        if not saves:
            return
        positions = self.ctx.positions
        first_save = min((positions[s.call].start.line, positions[s.call].start.column) for s in saves)
        for load in high_level.of("load"):
            start = positions[load.call].start
            if (start.line, start.column) < first_save:
                continue  # loading what an earlier run wrote: it is complete
            before = max((s for s in saves if (positions[s.call].start.line, positions[s.call].start.column)
                          < (start.line, start.column)), key=lambda s: (positions[s.call].start.line,
                                                                        positions[s.call].start.column), default=None)
            if before is not None and id(before.call) in barriered:
                continue  # the save's own barrier: the files exist when the ranks go on
            statement = self.q.statement_of(load.call)
            if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
                    and isinstance(statement.body[0], cst.Expr)):
                self.report(load.call, "declined", f"{load.model}.load(...) of what rank 0 saved, inside a larger "
                            "statement: the other ranks may read it before it is written",
                            "call dp.barrier() on every rank before loading it")
                continue
            self.ctx.plan.insert_before(statement, self.statement("{dp}.barrier()\n"))
            self.report(load.call, "change", f"dp.barrier() before {load.model}.load(...): rank 0 writes the "
                        "checkpoint alone, the others wait until it is complete")

    def _writes_checkpoints(self, fit: cst.Call) -> bool:
        """``fit(..., save_dir="ckpt")`` (or a ``ModelCheckpoint`` callback): rank 0 writes ``ckpt/final`` at its end,
        which the script may load next (an IMDB GRU script, issue 19's round Q: rank 1 failed to load it, or loaded an
        earlier run's)."""
        save_dir = argument(fit, 6, "save_dir")  # fit(train_data, eval_data, batch_size, epochs, eval_freq, log_freq, save_dir
        if save_dir is not None and not (isinstance(save_dir.value, cst.Name) and save_dir.value.value == "None"):
            return True
        return any(self.q.is_call_to(c, CHECKPOINTS) for c in self.q.index.of_type(fit, cst.Call))

    def _conditional(self, statement: cst.CSTNode) -> bool:
        """Under an ``if``/``while`` of its function: its test may differ between the ranks (``evaluate``'s loss is
        each rank's own), and a barrier only some ranks reach would hang; such a save keeps its note."""
        for ancestor in self.q.ancestors(statement):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Module)):
                return False
            if isinstance(ancestor, (cst.If, cst.While)):
                return True
        return False

    def _main_process_only(self, call: cst.Call) -> None:
        statement = self.q.statement_of(call)
        if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
                and isinstance(statement.body[0], cst.Expr) and statement.body[0].value is call):
            return  # its result is kept: every rank needs it
        if self.ctx.analysis(RankAnalysis).rank_condition(call) is not None:
            return

        if self.ctx.plan.group([statement], self.main_process_only):
            self.report(call, "change", "model summary printed by the main process only "
                        f"(under `if {self.ctx.alias}.is_main_process():`)")
