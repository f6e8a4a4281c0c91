"""Dataset-wide averages of a sharded dygraph training loop, summed over all ranks."""

from __future__ import annotations

from ..common.training_averages import TrainingAverages


class PaddleTrainingAverages(TrainingAverages):
    """All-reduce the sums a training loop divides by ``len(loader.dataset)`` afterwards.

    Why: once the training loader is sharded each rank adds up only its own part, while
    ``len(train_loader.dataset)`` is still the whole dataset's size: the average would be about 1/N.
    Example:  for x, y in train_loader():                for x, y in train_loader():
                  total += float(loss) * len(x)   ->         total += float(loss) * len(x)
                                                         total = dp.all_reduce(total, op="sum")
              print(total / len(train_loader.dataset))
    The decision is the torch rule's (``training-dataset-averages``).
    Leaves alone: sums not divided by ``len(<loader>.dataset)``; static-graph files.
    """

    name = "paddle-training-dataset-averages"
    generations = ("dygraph",)
