"""``dp.distributed_optimizer``: gradients averaged over the workers before they are applied (Horovod's design).

For custom training loops written the single-process way (a ``GradientTape`` whose loss is the mean over
the local batch, ``optimizer.apply_gradients`` in a ``@tf.function`` or eagerly, the model built
outside any strategy scope). The optimizer's own ``apply_gradients`` is replaced, on this instance only
(so ``isinstance`` checks and ``compile`` still see the user's optimizer), by one that:

1. the first time it runs (the first trace of a ``tf.function``, or the first eager call), sets every
   variable it updates to worker 0's value, so all workers start from the same model whatever their
   random initialisation (run eagerly through ``tf.init_scope``: every worker traces the same step);
2. averages the gradients with one all-reduce of the strategy (``strategy.run`` + the replica
   context's ``all_reduce(MEAN)``, the collective MultiWorkerMirroredStrategy uses itself);
3. applies them with the user's optimizer.

The mean of the workers' local-batch-mean gradients is the gradient of the global-batch mean (equal
per-worker batches), so the loss needs no scaling. Inside a strategy's replica context (``model.fit``
under ``dp.scope()``, or a step run by ``strategy.run``) the strategy already sums the gradients, so the
wrapper passes them through untouched: never averaged twice.
"""

from __future__ import annotations

import tensorflow as tf

from . import _tf_collectives


def _inside_a_strategy() -> bool:
    return tf.distribute.has_strategy()


def make_distributed(optimizer, strategy, rank: int):
    if getattr(optimizer, "_dpmigrate_distributed", False):
        return optimizer
    original = optimizer.apply_gradients
    state = {"synced": False}

    def apply_gradients(grads_and_vars, *args, **kwargs):
        if _inside_a_strategy():
            return original(grads_and_vars, *args, **kwargs)
        pairs = [(g, v) for g, v in grads_and_vars]
        present = [(g, v) for g, v in pairs if g is not None]
        if not state["synced"]:
            with tf.init_scope():
                _start_from_worker0(strategy, [v for _, v in pairs], rank)
            state["synced"] = True
        grads = [tf.convert_to_tensor(g) for g, _ in present]  # IndexedSlices (embeddings) become dense
        averaged = _tf_collectives.all_reduce_sum_or_mean(strategy, grads, "mean") if grads else []
        return original(list(zip(averaged, [v for _, v in present])), *args, **kwargs)

    optimizer.apply_gradients = apply_gradients
    optimizer._dpmigrate_distributed = True
    return optimizer


def _start_from_worker0(strategy, variables: list, rank: int) -> None:
    """Every variable set to worker 0's value: the strategy's all-reduce of (value on 0, zeros elsewhere)."""
    if not variables:
        return
    values = [tf.convert_to_tensor(v) if rank == 0 else tf.zeros_like(v) for v in variables]
    for variable, value in zip(variables, _tf_collectives.all_reduce_sum_or_mean(strategy, values, "sum")):
        variable.assign(value)
