"""Sharding a ``paddle.io.DataLoader`` or Dataset so each rank reads a disjoint part.

Training loaders get Paddle's own ``DistributedBatchSampler`` with the loader's batch size, shuffle and
drop_last. Its layout keeps the trajectory of the single-process script: global batch ``k`` is rank 0's
``k``-th batch, then rank 1's, and so on, i.e. ``N`` consecutive per-rank batches of the same index list;
it pads the list so every rank runs the same number of steps (DataParallel needs that). In Paddle 3.3.1 a
shuffled pass already advances the sampler's epoch by itself (``np.random.RandomState(epoch)`` then
``epoch += 1``), so shuffles differ per epoch and agree across ranks without a ``set_epoch`` call;
an explicit ``set_epoch(e)`` still wins.

Evaluation loaders get :class:`UnpaddedDistributedBatchSampler`: positions ``r, r+N, ...`` of the index
list, never a sample twice, so sums all-reduced afterwards are exact; with ``drop_last``, over the part of the
data set one process evaluates (:func:`_evaluated_part`). The rebuilt DataLoader keeps
collate_fn, workers, return_list, shared memory, buffering, timeout and worker_init_fn.
"""

from __future__ import annotations

import numpy as np
from paddle.io import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedBatchSampler,
    IterableDataset,
    RandomSampler,
    SequenceSampler,
    Subset,
)

from . import _paddle_draws


class _TrainingLoader(DataLoader):
    """A sharded training loader: its first pass is where the ranks' random streams part (``_paddle_draws``), before
    its worker processes start and inherit the streams."""

    def __iter__(self):
        _paddle_draws.training_started()
        return super().__iter__()


class UnpaddedDistributedBatchSampler(DistributedBatchSampler):
    """Rank r takes positions r, r+N, r+2N... of the (optionally shuffled) index list: no sample twice."""

    def __iter__(self):
        order = np.arange(len(self.dataset)).tolist()
        if self.shuffle:
            np.random.RandomState(self.epoch).shuffle(order)
            self.epoch += 1
        mine = order[self.local_rank :: self.nranks]
        for start in range(0, len(mine), self.batch_size):
            batch = mine[start : start + self.batch_size]
            if len(batch) == self.batch_size or not self.drop_last:
                yield batch

    def __len__(self) -> int:
        mine = max(0, -(-(len(self.dataset) - self.local_rank) // self.nranks))
        return mine // self.batch_size if self.drop_last else -(-mine // self.batch_size)


_ITERABLE_MESSAGE = (
    "a paddle.io.IterableDataset has no indices to shard; split the stream by rank inside its __iter__ "
    "(e.g. skip items whose position % dp.world_size() != dp.rank()) and pass the loader unwrapped"
)


def _settings(loader: DataLoader) -> tuple[int, bool, bool]:
    """(batch size, shuffle, drop_last) of a loader built with batch_size= / shuffle= / drop_last=."""
    sampler = loader.batch_sampler
    if type(sampler) is not BatchSampler or not isinstance(sampler.sampler, (RandomSampler, SequenceSampler)):
        raise ValueError(
            f"this DataLoader samples with its own {type(sampler).__name__}"
            f"{'' if type(sampler) is not BatchSampler else ' over ' + type(sampler.sampler).__name__}; "
            "dpmigrate cannot shard it without changing what it samples. Make it rank-aware yourself "
            "(paddle.io.DistributedBatchSampler(dataset, batch_size, shuffle=..., drop_last=...) for uniform "
            "sampling) and pass the loader unwrapped"
        )
    return sampler.batch_size, isinstance(sampler.sampler, RandomSampler), sampler.drop_last


def _evaluated_part(dataset, batch_size: int):
    """An evaluation loader with ``drop_last=True`` reads the first ``len // batch_size`` batches' worth of samples:
    that part of the data set, which the ranks then split without dropping more. Each rank dropping its own last
    batch evaluated other samples than one process did, and ``paddle.Model``, whose gathered metrics trim the
    padding by counting up to ``len(dataset)``, carried the count into the next evaluation ("Eval samples: 16", then
    4: issue 19's round Q). Shuffled, one process leaves out other samples each pass; here always the last ones."""
    kept = len(dataset) // batch_size * batch_size
    return dataset if kept == len(dataset) else Subset(dataset, list(range(kept)))


def _rebuild(loader: DataLoader, batch_sampler, dataset=None, training: bool = False) -> DataLoader:
    return (_TrainingLoader if training else DataLoader)(
        loader.dataset if dataset is None else dataset, feed_list=loader.feed_list, places=loader.places,
        return_list=loader.return_list,
        batch_sampler=batch_sampler, collate_fn=loader.collate_fn, num_workers=loader.num_workers,
        use_buffer_reader=loader.use_buffer_reader, reader_buffer_size=loader.reader_buffer_size,
        prefetch_factor=loader.prefetch_factor, use_shared_memory=loader.use_shared_memory,
        timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
        persistent_workers=loader._persistent_workers,
    )


def shardable(sequence):
    """``sequence`` as something ``len()`` and slicing work on: a ``DenseTensor`` (what a ``paddle.io.DataLoader``
    yields in static graph mode, without ``len()``) becomes its NumPy array; anything else is returned as it is."""
    if hasattr(sequence, "__len__"):
        return sequence
    from paddle.base import core

    if isinstance(sequence, core.DenseTensor):
        return np.array(sequence)
    return sequence


def distributed_loader_for(obj, rank: int, world_size: int, *, evaluation: bool = False):
    if isinstance(obj, DataLoader):
        if world_size == 1 or isinstance(obj.batch_sampler, DistributedBatchSampler):
            return obj  # not launched, or already sharded (a converted or hand-written Fleet script)
        if isinstance(obj.dataset, IterableDataset):
            raise TypeError(_ITERABLE_MESSAGE)
        batch_size, shuffle, drop_last = _settings(obj)
        if evaluation:
            dataset = _evaluated_part(obj.dataset, batch_size) if drop_last else obj.dataset
            sampler = UnpaddedDistributedBatchSampler(dataset, batch_size, num_replicas=world_size, rank=rank,
                                                      shuffle=shuffle, drop_last=False)
            return _rebuild(obj, sampler, dataset)
        sampler = DistributedBatchSampler(obj.dataset, batch_size, num_replicas=world_size, rank=rank, shuffle=shuffle,
                                          drop_last=drop_last)
        return _rebuild(obj, sampler, training=True)
    if isinstance(obj, IterableDataset):
        raise TypeError(_ITERABLE_MESSAGE)
    if isinstance(obj, Dataset) or (hasattr(obj, "__getitem__") and hasattr(obj, "__len__")):
        if world_size == 1:
            return obj
        return Subset(obj, list(range(len(obj)))[rank::world_size])
    raise TypeError(
        f"distributed_loader() takes a paddle.io.DataLoader or an indexable Dataset, got {type(obj).__name__}"
    )
