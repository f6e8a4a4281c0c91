"""``dp.loop``: helpers for custom training loops written the tf.distribute way (``strategy.run``).

Outside the contract (a torch or Paddle script has no use for them), reached as ``dp.loop`` from
``import dpmigrate.runtime.tensorflow as dp``. At world size 1 each is what plain TensorFlow does with
the default strategy, so the same loop runs unchanged on one process::

    with dp.scope():
        model, optimizer = build_model(), keras.optimizers.SGD(0.1)
    dist_ds = dp.loop.distribute(dataset_batched_by_the_global_batch)

    @tf.function
    def train_step(x, y):
        def step(x, y):
            with tf.GradientTape() as tape:
                per_example = loss_fn(y, model(x))            # reduction=NONE: one loss per example
                loss = dp.loop.compute_average_loss(per_example, global_batch_size=GLOBAL_B)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return dp.loop.reduce(dp.loop.run(step, args=(x, y)), op="sum")

The trap this module exists for: inside ``strategy.run`` ``apply_gradients`` SUMS the replicas'
gradients. A loss that is a plain ``reduce_mean`` over the local batch then trains with N times the
update, silently (measured: ratio 2.000 on 2 replicas). The loss must be divided by the global batch
(``compute_average_loss``) or a mean loss by the number of replicas (``scale_mean_loss``), inside the
tape. (The other design, a loop left as written plus ``dp.distributed_optimizer`` and
``dp.distributed_loader``, averages instead and needs no scaling.)
"""

from __future__ import annotations

import tensorflow as tf

_strategy_getter = None  # set by dpmigrate.runtime.tensorflow: returns the job's strategy (after init)


def strategy() -> tf.distribute.Strategy:
    """The job's strategy: MultiWorkerMirroredStrategy when launched, TF's default strategy otherwise."""
    return _strategy_getter()


def distribute(dataset: tf.data.Dataset):
    """``strategy.experimental_distribute_dataset``: the dataset's batch is the GLOBAL batch, split over the
    workers (auto-shard by data). At world size 1 the dataset itself."""
    s = strategy()
    if s.num_replicas_in_sync == 1:
        return dataset
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return s.experimental_distribute_dataset(dataset.with_options(options))


def run(fn, args=(), kwargs=None):
    """``strategy.run(fn, args, kwargs)``: ``fn`` once per replica, in replica context."""
    return strategy().run(fn, args=args, kwargs=kwargs)


def reduce(value, op: str = "sum"):
    """``strategy.reduce``: a per-replica result of :func:`run` reduced to one tensor (``"sum"``/``"mean"``)."""
    ops = {"sum": tf.distribute.ReduceOp.SUM, "mean": tf.distribute.ReduceOp.MEAN}
    if op not in ops:
        raise ValueError(f"dp.loop.reduce(op={op!r}): use 'sum' or 'mean'")
    return strategy().reduce(ops[op], value, axis=None)


def compute_average_loss(per_example_loss, global_batch_size=None, sample_weight=None):
    """``tf.nn.compute_average_loss``: the sum of the losses divided by the GLOBAL batch size (by default the
    local batch times the replicas in sync), so the summed gradients are the global batch's mean."""
    return tf.nn.compute_average_loss(per_example_loss, sample_weight=sample_weight,
                                      global_batch_size=global_batch_size)


def scale_mean_loss(mean_loss):
    """A loss already averaged over the local batch, divided by the number of replicas in sync (inside the tape)."""
    replicas = tf.distribute.get_replica_context().num_replicas_in_sync
    return mean_loss / tf.cast(replicas, mean_loss.dtype)
