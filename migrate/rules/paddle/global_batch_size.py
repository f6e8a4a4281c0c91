"""The ``--batch global`` policy for Paddle: each rank takes B / N, so the global batch stays B."""

from __future__ import annotations

import libcst as cst

from ...codemod.calls import argument
from ...codemod.loaders import LoaderFlow
from ..common.global_batch_size import GlobalBatchSize
from ._analyses import TRAINING_DATA, HighLevelModels, training_loaders


class PaddleGlobalBatchSize(GlobalBatchSize):
    """Rewrite a training batch size B to ``dp.per_rank_batch_size(B)`` (``--batch global``).

    Why: by default (``--batch per-device``) each rank keeps B, so the global batch grows N times. With
    ``--batch global`` the global batch and the training trajectory stay those of the original.
    Example:  paddle.io.DataLoader(ds, batch_size=args.batch_size)
           -> paddle.io.DataLoader(ds, batch_size=dp.per_rank_batch_size(args.batch_size))
              model.fit(train_ds, epochs=2, batch_size=64)        (a paddle.Model given a Dataset)
           -> model.fit(train_ds, epochs=2, batch_size=dp.per_rank_batch_size(64))
    Found as ``batch_size=`` or the ``'batch_size'`` entry of the dict a loader gets as ``**kwargs``
    (``paddle.io.DataLoader``'s second positional parameter is ``feed_list``, not the batch size). Under a
    launcher ``fit`` on a Dataset reads ``batch_size`` samples per rank (measured, Paddle 3.3.1).
    Leaves alone: evaluation loaders and ``evaluate``/``predict``; a batch size it cannot find
    (declined: the default of 1 cannot be split); static-graph files.
    """

    name = "paddle-global-batch-size"
    positional_batch_size = None  # paddle.io.DataLoader(dataset, feed_list=None, ...): never the batch size

    generations = ("dygraph",)

    def training_loader_calls(self) -> list[cst.Call]:
        return [loader.call for loader in training_loaders(self.ctx)]

    def other_batch_sizes(self) -> None:
        """``fit`` of a ``paddle.Model`` on a Dataset: under a launcher it reads ``batch_size`` per rank."""
        high_level = self.ctx.analysis(HighLevelModels)
        loaders = self.ctx.analysis(LoaderFlow).loaders
        names = {loader.name for loader in loaders if loader.name}
        for fit, data in high_level.data_arguments(TRAINING_DATA):
            if (isinstance(data.value, cst.Name) and data.value.value in names) or self.q.is_call_to(
                data.value, self.vocabulary.data_loaders
            ) or any(high_level.is_argument(loader, data.value) for loader in loaders):
                continue  # a DataLoader (also one a local function returns): its own batch size; fit's is not used
            size = argument(fit.call, 2, "batch_size")  # fit(train_data, eval_data, batch_size, ...)
            if size is None:
                self.report(fit.call, "declined", "--batch global: this fit(...) uses the default batch size of 1",
                            "pass batch_size=dp.per_rank_batch_size(B), B being the global batch")
                continue
            self.per_rank(size, size.value)
