"""Batch normalisation normalises over each rank's share of the batch: said, with the layers named."""

from __future__ import annotations

import libcst as cst

from ...codemod.rule import Rule


class BatchNormStatistics(Rule):
    """Note the batch normalisation layers of a training script: their statistics become per rank.

    Why: a batch normalisation layer normalises each batch with that batch's own mean and variance. Launched on N
    ranks, each normalises its own share (B/N samples with ``--batch global``, B with ``--batch per-device``),
    not the batch the single process saw, and keeps running statistics of its own: training differs from the
    original's (measured: 1e-1 relative on a CNN with ``--batch global``) and the saved running statistics are
    rank 0's. Synchronised batch normalisation (``SyncBatchNorm``, ``BatchNormalization(synchronized=True)``)
    normalises over the whole batch, where the framework supports it on the devices used.
    Example (note):  self.bn1 = nn.BatchNorm2d(64)   -> batch normalisation (bn1, ...): statistics per rank
    Leaves alone: the layers (a note only); scripts that do not train; files where the layers are not built.
    """

    name = "batch-norm"
    about_training = False

    def finish(self) -> None:
        classes = self.vocabulary.batchnorm_classes
        if not classes or not self.q.is_training_script():
            return
        sites = [c for c in self.q.index.of_type(self.ctx.module, cst.Call) if self.q.is_call_to(c, classes)]
        if not sites:
            return
        names = list(dict.fromkeys(self._name(c) for c in sites))
        shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
        share = "B/N samples" if self.ctx.options.batch == "global" else "its own batch of B"
        self.report(sites[0], "note", (
            f"batch normalisation ({shown}): launched, each rank normalises over {share}, not the original's batch, "
            "and keeps running statistics of its own (the checkpoint holds rank 0's): training differs from one "
            "process's (dpmigrate verify names it)"),
            "synchronise the statistics where your devices support it: torch.nn.SyncBatchNorm.convert_sync_batchnorm"
            "(model) on CUDA, paddle.nn.SyncBatchNorm.convert_sync_batchnorm(model) on GPUs, Keras "
            "BatchNormalization(synchronized=True); or accept the difference")

    def _name(self, call: cst.Call) -> str:
        """``bn1`` of ``self.bn1 = nn.BatchNorm2d(64)``, else the class (``BatchNorm2d``)."""
        statement = self.q.statement_of(call)
        if (isinstance(statement, cst.SimpleStatementLine) and isinstance(statement.body[0], cst.Assign)
                and statement.body[0].value is call):
            target = statement.body[0].targets[0].target
            if isinstance(target, cst.Attribute):
                return target.attr.value
            if isinstance(target, cst.Name):
                return target.value
        return self.code(call.func).rsplit(".", 1)[-1]
