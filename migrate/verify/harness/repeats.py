"""Notes, for the shares pass, that the script's data reads some samples more than once per epoch by design.

The shares pass (:mod:`dpmigrate.verify.shares`) calls a sample read by two ranks in the first epoch's window
overlapping shares. That holds only when one process would read each sample once there. Three idioms read
repeats on one process too, and the seed of the job decides whether a repeat lands on one rank or on two:

- ``Dataset.repeat()`` then ``shuffle``: the shuffle buffer mixes the end of one epoch with the start of the next
  (measured on a converted TensorFlow script: overlapping shares on one job, a rank reading twice on the next);
- a sampler drawing with replacement (``RandomSampler(replacement=True)``, ``WeightedRandomSampler``);
- a ``RandomSampler`` asked for more samples than the data has (it chains permutations).

Each is noted on the record as it is met (``Recorder.repeats_samples``), in both the comparison and the shares
pass, and the pass then leaves the shares unjudged, saying why, instead of guessing from where the repeats fell.
"""

from __future__ import annotations

import functools


def install_tensorflow(recorder) -> None:
    """Wrap ``Dataset.shuffle`` as it is now (the harness's in-order one, or TensorFlow's)."""
    from tensorflow.python.data.ops import dataset_ops

    shuffle = dataset_ops.DatasetV2.shuffle

    @functools.wraps(shuffle)
    def noting(self, *args, **kwargs):
        if _repeats_upstream(self):
            recorder.repeats_samples("Dataset.shuffle after repeat()")
        return shuffle(self, *args, **kwargs)

    dataset_ops.DatasetV2.shuffle = noting


def install_samplers(io_module, recorder) -> None:
    """``torch.utils.data`` or ``paddle.io``: their ``RandomSampler`` and ``WeightedRandomSampler`` (same names,
    same ``replacement`` and ``num_samples`` attributes)."""
    for name in ("RandomSampler", "WeightedRandomSampler"):
        sampler = getattr(io_module, name, None)
        if sampler is not None:
            sampler.__iter__ = _noting_iter(sampler.__iter__, name, recorder)


def _noting_iter(original, name: str, recorder):
    @functools.wraps(original)
    def __iter__(self):
        if getattr(self, "replacement", False):
            recorder.repeats_samples(f"{name}(replacement=True)")
        elif name == "RandomSampler" and _more_than_the_data(self):
            recorder.repeats_samples("RandomSampler(num_samples=) over the data's length")
        return original(self)
    return __iter__


def _more_than_the_data(sampler) -> bool:
    try:
        return int(sampler.num_samples) > len(sampler.data_source)
    except Exception:  # a data source without a length: nothing to say
        return False


def _repeats_upstream(dataset, depth: int = 0) -> bool:
    """A ``repeat()`` anywhere in the pipeline that makes ``dataset`` (its inputs, transitively)."""
    if depth > 200:
        return False
    if "Repeat" in type(dataset).__name__:
        return True
    try:
        inputs = dataset._inputs()  # noqa: SLF001 - tf.data's own graph of datasets
    except Exception:
        return False
    return any(_repeats_upstream(d, depth + 1) for d in inputs)
