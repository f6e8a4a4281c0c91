"""Sharding a torch DataLoader or Dataset so each rank reads a disjoint part.

Training loaders get a ``DistributedSampler`` (padded so every rank runs the same number of steps,
which DDP needs) that advances its epoch on every new iteration, so shuffles differ per epoch and
agree across ranks even when the script never calls ``set_epoch``. Evaluation loaders get a sampler
without padding: every sample is seen exactly once, so sums all-reduced afterwards are exact.
The rebuilt DataLoader keeps batch size, shuffle, drop_last, collate_fn, workers, pin_memory and
the rest of the original's settings.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    Subset,
)

from . import _torch_draws

SHUFFLE_SEED = 0
"""Seed of the distributed shuffle (plus the epoch): the same on every rank, whatever the script seeded."""


class EpochAdvancingDistributedSampler(DistributedSampler):
    """A DistributedSampler whose epoch moves on by itself at each new pass over the data.

    An explicit ``set_epoch(e)`` (scripts already written for DDP) wins over the automatic count.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._passes = 0
        self._epoch_was_set = False

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        self._epoch_was_set = True

    def __iter__(self):
        if self._passes and not self._epoch_was_set:
            self.epoch += 1
        self._passes += 1
        self._epoch_was_set = False
        return super().__iter__()


class UnpaddedDistributedSampler(Sampler):
    """Rank r takes positions r, r+N, r+2N... of the (optionally shuffled) index list: no sample twice.

    Ranks may get one sample fewer than others; fine for evaluation, where no gradient all-reduce
    needs every rank to run the same number of steps.
    """

    def __init__(self, dataset, num_replicas: int, rank: int, shuffle: bool = False, seed: int = SHUFFLE_SEED):
        self.dataset, self.num_replicas, self.rank, self.shuffle, self.seed = dataset, num_replicas, rank, shuffle, seed
        self.epoch = 0
        self._passes = 0
        self._epoch_was_set = False

    def set_epoch(self, epoch: int) -> None:
        self.epoch, self._epoch_was_set = epoch, True

    def __iter__(self):
        if self._passes and not self._epoch_was_set:
            self.epoch += 1
        self._passes += 1
        self._epoch_was_set = False
        n = len(self.dataset)
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=g).tolist()
        else:
            order = list(range(n))
        return iter(order[self.rank :: self.num_replicas])

    def __len__(self) -> int:
        return max(0, math.ceil((len(self.dataset) - self.rank) / self.num_replicas))


def _loader_shuffles(loader: DataLoader) -> bool:
    if isinstance(loader.sampler, RandomSampler):
        return True
    if isinstance(loader.sampler, SequentialSampler):
        return False
    raise ValueError(
        f"this DataLoader uses its own sampler ({type(loader.sampler).__name__}); dpmigrate cannot shard it "
        "without changing what it samples. Make the sampler rank-aware yourself (each rank a disjoint "
        "part, e.g. torch.utils.data.DistributedSampler(dataset) for uniform sampling) and pass the loader "
        "unwrapped"
    )


class _TrainingLoader(DataLoader):
    """A sharded training loader: its first pass is where the ranks' random streams part (``_torch_draws``)."""

    def __iter__(self):
        _torch_draws.training_started()
        return super().__iter__()


def _rebuild(loader: DataLoader, sampler: Sampler, training: bool = False) -> DataLoader:
    kwargs = dict(
        batch_size=loader.batch_size, sampler=sampler, num_workers=loader.num_workers,
        collate_fn=loader.collate_fn, pin_memory=loader.pin_memory, drop_last=loader.drop_last,
        timeout=loader.timeout, worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context, generator=loader.generator,
        persistent_workers=loader.persistent_workers, pin_memory_device=loader.pin_memory_device,
    )
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    if hasattr(loader, "in_order"):
        kwargs["in_order"] = loader.in_order
    return (_TrainingLoader if training else DataLoader)(loader.dataset, **kwargs)


def distributed_loader_for(obj, rank: int, world_size: int, *, evaluation: bool = False):
    if isinstance(obj, DataLoader):
        return _shard_loader(obj, rank, world_size, evaluation)
    if isinstance(obj, IterableDataset):
        raise TypeError(_ITERABLE_MESSAGE)
    if isinstance(obj, Dataset) or hasattr(obj, "__getitem__") and hasattr(obj, "__len__"):
        if world_size == 1:
            return obj
        return Subset(obj, list(range(len(obj)))[rank::world_size])
    raise TypeError(
        f"distributed_loader() takes a torch DataLoader or an indexable Dataset, got {type(obj).__name__}"
    )


_ITERABLE_MESSAGE = (
    "an IterableDataset has no indices to shard; split the stream by rank inside its __iter__ "
    "(e.g. skip items whose position % dp.world_size() != dp.rank()) and pass the loader unwrapped"
)


def _shard_loader(loader: DataLoader, rank: int, world_size: int, evaluation: bool) -> DataLoader:
    if world_size == 1 or isinstance(loader.sampler, (DistributedSampler, UnpaddedDistributedSampler)):
        return loader  # not launched, or already sharded (a converted or hand-written DDP script)
    if isinstance(loader.dataset, IterableDataset):
        raise TypeError(_ITERABLE_MESSAGE)
    if loader.batch_size is None:
        raise ValueError(
            "this DataLoader was built with batch_sampler=; dpmigrate cannot shard it. Build the batch "
            "sampler on a torch.utils.data.DistributedSampler instead"
        )
    shuffle = _loader_shuffles(loader)
    if evaluation:
        sampler: Sampler = UnpaddedDistributedSampler(loader.dataset, world_size, rank, shuffle=shuffle)
    else:
        sampler = EpochAdvancingDistributedSampler(
            loader.dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=SHUFFLE_SEED
        )
    return _rebuild(loader, sampler, training=not evaluation)
