"""The runtime's collectives on TensorFlow: always the strategy's own, never a home-made exchange.

Each one runs ``strategy.run`` (one replica per worker on CPU) with the replica context's
``all_reduce`` (SUM or MEAN) or ``all_gather``, the collectives ``MultiWorkerMirroredStrategy``
itself uses for gradients. ``max``/``min``/``product`` have no TF all-reduce: they are the strategy's
all-gather followed by the local reduction. Tensors of different lengths are padded to the longest
before the all-gather (lengths first, by an all-reduce of a one-hot vector) and cut back after.
Python objects travel pickled, one byte per int32 element, between the workers of the same job.
"""

from __future__ import annotations

import pickle

import numpy as np
import tensorflow as tf


def _in_replica(strategy, fn, *args):
    """``fn(*args)`` in the replica context of ``strategy`` (one local replica: the plain result).

    The inputs are placed on this worker's device first: in a ``tf.function`` a tensor has no device
    yet, and the strategy's all-reduce sends its result to the input's device."""
    with strategy.scope(), tf.device(strategy.extended.worker_devices[0]):
        args = tuple(tf.identity(a) for a in args)
        result = strategy.run(fn, args=args)
    values = strategy.experimental_local_results(result)
    return values[0] if len(values) == 1 else result


def all_reduce_sum_or_mean(strategy, tensors: list, op: str) -> list:
    """The strategy's all-reduce of a list of tensors (one batched collective)."""
    reduce_op = tf.distribute.ReduceOp.MEAN if op == "mean" else tf.distribute.ReduceOp.SUM

    def reduce(*values):
        return tf.distribute.get_replica_context().all_reduce(reduce_op, list(values))

    return list(_in_replica(strategy, reduce, *tensors))


def _gather_equal(strategy, tensor: tf.Tensor) -> tf.Tensor:
    def gather(value):
        return tf.distribute.get_replica_context().all_gather(value, axis=0)

    return _in_replica(strategy, gather, tensor)


def all_gather(strategy, tensor: tf.Tensor, rank: int, world_size: int) -> tf.Tensor:
    """``tensor`` of every worker concatenated along axis 0 in rank order; lengths may differ."""
    one_hot = np.zeros(world_size, np.int64)
    one_hot[rank] = int(tensor.shape[0])
    (lengths,) = all_reduce_sum_or_mean(strategy, [tf.constant(one_hot)], "sum")
    lengths = [int(n) for n in lengths.numpy()]
    longest = max(lengths)
    pad = [[0, longest - int(tensor.shape[0])]] + [[0, 0]] * (len(tensor.shape) - 1)
    gathered = _gather_equal(strategy, tf.pad(tensor, pad))
    return tf.concat([gathered[i * longest: i * longest + n] for i, n in enumerate(lengths)], axis=0)


def reduce(strategy, tensor: tf.Tensor, op: str, rank: int, world_size: int) -> tf.Tensor:
    """All-reduce one tensor with ``op`` in sum, mean, max, min, product."""
    if op in ("sum", "mean"):
        return all_reduce_sum_or_mean(strategy, [tensor], op)[0]
    stacked = all_gather(strategy, tf.expand_dims(tensor, 0), rank, world_size)
    return {"max": tf.reduce_max, "min": tf.reduce_min, "product": tf.reduce_prod}[op](stacked, axis=0)


def gather_objects(strategy, value, rank: int, world_size: int) -> list:
    """Every worker's picklable ``value``, as a list in rank order."""
    data = np.frombuffer(pickle.dumps(value), dtype=np.uint8)
    one_hot = np.zeros(world_size, np.int64)
    one_hot[rank] = data.size
    (lengths,) = all_reduce_sum_or_mean(strategy, [tf.constant(one_hot)], "sum")
    # TF's collectives take no uint8: the bytes travel as int32
    gathered = all_gather(strategy, tf.constant(data.astype(np.int32)), rank, world_size).numpy().astype(np.uint8)
    out, start = [], 0
    for n in lengths.numpy():
        out.append(pickle.loads(gathered[start:start + int(n)].tobytes()))  # from this job's own workers
        start += int(n)
    return out
