"""This worker's share of a ``tf.data`` pipeline, for custom training loops with ``dp.distributed_optimizer``.

The dataset the script built is already batched with its per-worker batch ``b`` (the ``--batch global``
policy wrote ``dp.per_rank_batch_size(B)``, ``per-device`` kept ``b``). Worker ``r`` of ``N`` takes
batches ``r, r+N, r+2N...`` (``Dataset.shard`` on batches), so at step ``k`` the workers together hold
the original batches ``kN ... kN+N-1``; with ``b = B/N`` those are exactly the single-process batch
``k`` of size ``B``, in order, and averaging the workers' gradients gives its gradient.

Training: every worker must run the same number of steps (a worker with one batch more waits forever
in the gradient all-reduce), so the batches beyond a multiple of ``N`` are dropped (at most ``N-1``,
the end of the last epoch); a dataset whose length TensorFlow cannot know (after ``filter``) is refused
with the fix. Evaluation (``evaluation=True``): every batch exactly once, uneven counts allowed (sum
the metrics with ``dp.all_reduce(..., op="sum")`` after the loop).

The auto-shard policy is set explicitly to ``OFF`` on the result: it is sharded already, and a strategy
must not shard it a second time. Not for ``model.fit``: Keras under MultiWorkerMirroredStrategy takes
the batch of the dataset given to ``fit`` as the *global* batch and shards it itself (pass the dataset
as it is, batched by the global batch size).
"""

from __future__ import annotations

import tensorflow as tf


def _without_auto_shard(dataset: tf.data.Dataset) -> tf.data.Dataset:
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)


def _as_dataset(obj, batch_size: int | None) -> tf.data.Dataset:
    if isinstance(obj, tf.data.Dataset):
        return obj if batch_size is None else obj.batch(batch_size)
    if batch_size is None:
        raise TypeError(
            f"distributed_loader() got {type(obj).__name__}: pass a batched tf.data.Dataset, or arrays with their "
            "per-worker batch size: dp.distributed_loader((x, y), batch_size=dp.per_rank_batch_size(B))")
    return tf.data.Dataset.from_tensor_slices(obj).batch(batch_size)


def distributed_loader_for(obj, rank: int, world_size: int, *, evaluation: bool = False,
                           batch_size: int | None = None) -> tf.data.Dataset:
    dataset = _as_dataset(obj, batch_size)
    if world_size == 1:
        return dataset
    if evaluation:
        return _without_auto_shard(dataset.shard(world_size, rank))
    batches = int(dataset.cardinality())
    if batches == tf.data.UNKNOWN_CARDINALITY:
        raise ValueError(
            "distributed_loader(): TensorFlow cannot tell how many batches this dataset has (a filter, or a "
            "generator), so the workers could run different numbers of steps and wait forever in the gradient "
            "all-reduce. Give it a known length (.apply(tf.data.experimental.assert_cardinality(n))), or repeat() "
            "it and pass steps_per_epoch / stop after a fixed number of steps")
    if batches != tf.data.INFINITE_CARDINALITY:
        usable = batches - batches % world_size
        if usable == 0:
            raise ValueError(f"distributed_loader(): the dataset has {batches} batch(es), fewer than the "
                             f"{world_size} workers; use a smaller batch size")
        dataset = dataset.take(usable)
    return _without_auto_shard(dataset.shard(world_size, rank))
