"""Shard a dygraph evaluation DataLoader when its metrics can be made exact, else leave it whole."""

from __future__ import annotations

from ...codemod.loaders import Loader
from ..common.evaluation_loader import EvaluationLoader
from ._analyses import TRAINING_DATA, HighLevelModels, evaluated_by_a_model


class PaddleEvaluationLoader(EvaluationLoader):
    """Shard an evaluation ``paddle.io.DataLoader`` with ``evaluation=True`` and all-reduce its sums.

    Why: evaluating the whole set on every rank is correct but does N times the work; sharded without
    padding (the runtime's unpadded ``DistributedBatchSampler``), each sample is seen once, so the sums
    all-reduced after the loop are exactly the single-process sums.
    Example:  for x, y in test_loader():                 for x, y in test_loader():
                  correct += int((pred == y).sum())   ->      correct += int((pred == y).sum())
                                                          correct = dp.all_reduce(correct, op="sum")
    The decision and its limits are the torch rule's (``evaluation-loader``): only loops that add into
    variables they report, keep no per-batch value and do not divide by ``len(loader)``.
    Leaves alone (with a note): any other evaluation loop; static-graph files (the static rules).
    """

    name = "paddle-evaluation-loader"
    generations = ("dygraph",)

    def evaluates(self, loader: Loader) -> bool:
        """Not a loader a ``paddle.Model.fit`` trains on, though a loop peeks at it (``for x, y in loader(): ...;
        break``): the training-loader rule shards that one (the issue 19 audit's recommender notebook), as it
        shards one a ``paddle.Model`` evaluates after such a peek."""
        return (super().evaluates(loader) and not self.ctx.analysis(HighLevelModels).reads(loader, TRAINING_DATA)
                and not evaluated_by_a_model(self.ctx, loader))
