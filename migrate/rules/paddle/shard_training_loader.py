"""Give each rank its own shard of every training ``paddle.io.DataLoader``."""

from __future__ import annotations

import libcst as cst

from ...codemod.calls import argument
from ...codemod.loaders import LoaderFlow, own_sampling
from ...codemod.rule import Rule
from ..common.evaluated_share import evaluated_share_note, imported_share_notes, unaveraged_note
from ._analyses import EVALUATION_DATA, GATHERED_EVALUATION, TRAINING_DATA, HighLevelModels, evaluated_by_a_model


class PaddleShardTrainingLoader(Rule):
    """Wrap training DataLoaders in ``dp.distributed_loader(...)``.

    Why: without a ``DistributedBatchSampler`` every rank trains on the whole dataset. The runtime
    rebuilds the loader with one (Paddle's own) keeping batch size, shuffle, drop_last, collate_fn and
    workers; the epoch advances by itself on every pass.
    Example:  train_loader = paddle.io.DataLoader(ds, batch_size=64, shuffle=True)
           -> train_loader = dp.distributed_loader(paddle.io.DataLoader(ds, batch_size=64, shuffle=True))
    A loader trains when a loop reading its batches (``for x, y in loader:``, ``loader()``,
    ``enumerate(loader())``) runs ``backward()`` or an optimizer step, followed through the script's own
    functions; or when it is the training data of a ``paddle.Model``'s ``fit`` (the high-level API shards
    a Dataset by itself, but reads a DataLoader whole on every rank: measured with Paddle 3.3.1).
    Leaves alone: loaders with their own ``batch_sampler=`` (declined: shard it by hand); loaders whose
    batches cannot be followed (declined); evaluation loaders (``paddle-evaluation-loader``); those handed to
    ``predict`` (read whole by every rank: noted); static-graph files. A loader handed to ``evaluate`` (or
    ``fit(eval_data=)``) is sharded as the high-level API shards a Dataset (see ``evaluated_by_a_model``).
    """

    name = "paddle-shard-training-loader"
    generations = ("dygraph",)

    def finish(self) -> None:
        high_level = self.ctx.analysis(HighLevelModels)
        for loader in self.ctx.analysis(LoaderFlow).loaders:
            fitted = loader.role != "train" and high_level.reads(loader, TRAINING_DATA)  # (a peeking loop: "eval")
            if evaluated_by_a_model(self.ctx, loader):
                self.ctx.plan.replace(loader.call, lambda updated: self.dp_call("distributed_loader", updated))
                if _drops_last(loader.call):
                    self.report(loader.call, "note", f"DataLoader{_named(loader.name)} evaluated by a paddle.Model, "
                                "with drop_last: sharded as paddle.Model shards a Dataset (dp.distributed_loader, "
                                "DistributedBatchSampler), it gathers every rank's outputs and counts them up to "
                                "len(dataset), which the dropped batches never reach: the count carries into the next "
                                "evaluation, whose metrics then cover fewer samples ('Eval samples: 16', then 4; the "
                                "training is not affected)", "drop_last=False on this evaluation loader (paddle.Model "
                                "never drops samples of a Dataset it evaluates)")
                    continue
                self.report(loader.call, "change", f"DataLoader{_named(loader.name)} evaluated by a paddle.Model: "
                            "sharded as paddle.Model shards a Dataset (dp.distributed_loader, DistributedBatchSampler): "
                            "it gathers every rank's outputs for the metrics and drops the padding, so they are the "
                            "original's (left whole, each sample would count N times); its loss is this rank's share's")
                continue
            if loader.role == "unknown" and not fitted:
                if high_level.reads(loader, EVALUATION_DATA):
                    gathered = ("; paddle.Model still gathers every rank's outputs, so the 'Eval samples' count it "
                                "prints is about N times the loader's (its loss is exact)"
                                if high_level.reads(loader, GATHERED_EVALUATION) else
                                "; the 'Predict samples' count paddle.Model prints is N times the loader's (it counts "
                                "each rank's batch N times), the predictions are whole")
                    self.report(loader.call, "note", f"DataLoader{_named(loader.name)} evaluated by a paddle.Model: "
                                f"left whole, every rank evaluates all of it (correct, no speed-up){gathered}")
                    continue
                self.report(
                    loader.call, "declined",
                    "cannot tell from the data flow whether this DataLoader trains (its batches are not "
                    "read by a for loop here or in a function it is passed to)",
                    "if it feeds training, wrap it: dp.distributed_loader(paddle.io.DataLoader(...)); if it "
                    "evaluates, leave it or use dp.distributed_loader(..., evaluation=True) and all-reduce the sums",
                )
            elif loader.role == "unaveraged":
                unaveraged_note(self, loader)
            elif loader.role == "train" or fitted:
                if own_sampling(loader):
                    self.report(
                        loader.call, "declined",
                        "training DataLoader with its own batch_sampler=: its sampling cannot be sharded for it",
                        "use paddle.io.DistributedBatchSampler(dataset, batch_size, shuffle=..., drop_last=...) "
                        "or give each rank a disjoint part of the indices (dp.shard(indices))",
                    )
                    continue
                self.ctx.plan.replace(loader.call, lambda updated: self.dp_call("distributed_loader", updated))
                how = "handed to paddle.Model.fit, which does not shard a DataLoader" if fitted else "trains"
                self.report(loader.call, "change", f"training DataLoader{_named(loader.name)} ({how}) sharded: "
                            "dp.distributed_loader gives each rank a disjoint part (DistributedBatchSampler)",
                            effect="shard")
                evaluated_share_note(self, loader)
        imported_share_notes(self)


def _named(name: str | None) -> str:
    return f" `{name}`" if name else ""


def _drops_last(call: cst.Call) -> bool:
    """``DataLoader(..., drop_last=True)`` (or any value but a literal False)."""
    arg = argument(call, 7, "drop_last")  # DataLoader(dataset, ..., shuffle, drop_last)
    return arg is not None and not (isinstance(arg.value, cst.Name) and arg.value.value == "False")
