"""The framework-neutral :class:`~dpmigrate.runtime.strategy.Strategy` mapped onto TensorFlow's own options.

``MultiWorkerMirroredStrategy(communication_options=tf.distribute.experimental.CommunicationOptions(...))``
is the one place TensorFlow 2.21 takes tuning for its gradient all-reduce:

- ``bucket_size_mb`` -> ``bytes_per_pack``: gradients are packed into chunks of that size, one
  all-reduce per chunk (TF's gradient fusion);
- the collective implementation is ``AUTO`` (TF picks RING on CPU, NCCL on GPU), the collective timeout
  ``timeout_seconds`` (``init(timeout=)`` / ``DPMIGRATE_TIMEOUT``).

No TF option does the rest, so each raises :class:`UnsupportedStrategy` naming the alternative:
``hierarchical_allreduce`` (NCCL chooses its own algorithm), ``localsgd_steps``, ``gradient_compression``
(TF all-reduces gradients in their own dtype; train in mixed precision to all-reduce fp16) and
``gradient_accumulation`` (accumulate in the training loop), ``sync_batchnorm`` (a Keras layer argument,
``BatchNormalization(synchronized=True)``). ``find_unused_parameters`` is honoured as it is: TF all-reduces the
gradients a step has, with no reducer waiting for the others.
"""

from __future__ import annotations

from .strategy import Strategy, UnsupportedStrategy


def check(strategy: Strategy) -> None:
    """Raise UnsupportedStrategy for a knob TensorFlow cannot honour."""
    if strategy.hierarchical_allreduce:
        raise UnsupportedStrategy(
            "Strategy(hierarchical_allreduce=True): tf.distribute has no hierarchical all-reduce option "
            "(CommunicationOptions has bytes_per_pack, timeout_seconds and implementation only); drop the knob, "
            "NCCL picks tree or ring algorithms itself")
    if strategy.localsgd_steps is not None:
        raise UnsupportedStrategy(
            f"Strategy(localsgd_steps={strategy.localsgd_steps}): tf.distribute has no LocalSGD; drop the knob "
            "(every step all-reduces the gradients), or use the Paddle backend")
    if strategy.gradient_compression is not None:
        raise UnsupportedStrategy(
            f"Strategy(gradient_compression={strategy.gradient_compression!r}): MultiWorkerMirroredStrategy "
            "all-reduces gradients in their own dtype and has no compression option; drop the knob, or train "
            "with keras.mixed_precision so the gradients themselves are float16")
    if strategy.sync_batchnorm:
        raise UnsupportedStrategy(
            "Strategy(sync_batchnorm=True): Keras synchronises batch normalisation in the layer itself, "
            "BatchNormalization(synchronized=True), on any device (dpmigrate --sync-batchnorm writes it there); "
            "drop the knob")
    if strategy.gradient_accumulation > 1:
        raise UnsupportedStrategy(
            f"Strategy(gradient_accumulation={strategy.gradient_accumulation}): tf.distribute does not accumulate "
            "gradients; drop the knob and sum the micro-batches' gradients in your loop before apply_gradients")


def communication_options(strategy: Strategy, timeout_s: float):
    """The ``tf.distribute.experimental.CommunicationOptions`` for ``strategy`` (after :func:`check`)."""
    import tensorflow as tf

    check(strategy)
    bytes_per_pack = 0 if strategy.bucket_size_mb is None else int(strategy.bucket_size_mb * 2**20)
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=bytes_per_pack, timeout_seconds=timeout_s,
        implementation=tf.distribute.experimental.CommunicationImplementation.AUTO)
