"""What Keras scripts need under MultiWorkerMirroredStrategy beyond its scope (measured with TF 2.21, tf-keras).

- :func:`enter_program_scope` (``dp.enter_scope()``): the strategy's scope for the rest of the program.
  A fit-style script builds variables in many places (sub-models and optimizers at module level, layers
  called on ``keras.Input`` statements before the model, a ``TextVectorization`` adapted first, a GAN
  wrapping two models): with the strategy current from ``dp.init()`` on, none can be made outside it.
  Only for scripts that train through Keras (``fit``, a ``train_step`` override): a hand-written loop's
  ``dp.distributed_optimizer`` averages outside any strategy and must not run inside one.
- :func:`share_shuffle_seeds`: every worker shuffles alike. An unseeded ``Dataset.shuffle`` (and Keras'
  own shuffle of NumPy inputs to ``fit``, ``tf.random.shuffle`` in its data handler) draws a different
  order on each worker; when the data is then split per worker (``fit``'s auto-shard by DATA, or
  ``dp.distributed_loader``'s batches r, r+N, ...) the workers' shares overlap and part of every epoch
  is never seen (measured: 118 of 256 samples read by both workers in one epoch of ``fit`` on NumPy
  arrays; 0 with the seeds shared). So an unseeded shuffle gets a seed drawn once per job by worker 0
  (plus its call's index: still random from job to job, the same on every worker), or, when the script
  set a global seed, one made from that seed (the same from job to job, as on one process), Keras builds its
  data handler under such a seed, and an ``ImageDataGenerator`` iterator without a seed gets the job's (it
  then reseeds NumPy before each batch, as it does for a seed of the script's). Other randomness (dropout,
  GAN noise) stays each worker's own.
- :func:`_local_mean_losses`: a ``keras.losses`` object called in a ``train_step`` returns its replica's batch
  mean (tf-keras refuses that default reduction under a strategy; the converter scales those losses itself).
- :func:`local_predict`: ``predict`` of a model built under the strategy runs on this worker alone.
  Keras' own splits the input over the replicas (one sample leaves a replica an empty batch: a
  BatchNormalization model then kills that worker), and reads sync-on-read variables (BatchNormalization's
  moving statistics) with a collective on every call: each call left about 4-10 threads behind
  (thousands of one-sample calls reached 32,000 threads). Here each batch runs through ``predict_step``
  in the replica context of this worker's own replica (its local values, no collective), one
  ``tf.function`` per model: threads stay flat and no worker waits for another. The model's weights are
  the same on every worker; BatchNormalization's moving statistics are each worker's own (as they are
  under the strategy: only their cross-worker read averages them).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import sys

import numpy as np
import tensorflow as tf

_installed: dict[str, object] = {}  # what was patched, once per process (see _reset_for_tests)


def _reset_for_tests() -> None:
    """Undo the patches (tests start several jobs' worth of state in one process)."""
    from tensorflow.python.data.ops import dataset_ops

    if "shuffle" in _installed:
        dataset_ops.DatasetV2.shuffle = _installed["shuffle"]
    if "data_handler" in _installed:
        sys.modules["tf_keras.src.engine.data_adapter"].get_data_handler = _installed["data_handler"]
    if "predict" in _installed:
        model_class, original = _installed["predict"]
        model_class.predict = original
    if "loss_reduction" in _installed:
        loss_class, original = _installed["loss_reduction"]
        loss_class._get_reduction = original
    if "image_iterator" in _installed:
        iterator_class, original = _installed["image_iterator"]
        iterator_class.__init__ = original
    _installed.clear()


def enter_program_scope(strategy) -> None:
    """The strategy current for the rest of the program (``tf.distribute.experimental_set_strategy``)."""
    if tf.distribute.has_strategy() and tf.distribute.get_strategy() is strategy:
        return
    tf.distribute.experimental_set_strategy(strategy)


# --- shuffles -------------------------------------------------------------------------------------


def share_shuffle_seeds(base_seed: int) -> None:
    """Unseeded ``Dataset.shuffle`` calls take ``base_seed + n`` (n: the call's index on this worker)."""
    from tensorflow.python.data.ops import dataset_ops

    if "shuffle" in _installed:
        return
    original = dataset_ops.DatasetV2.shuffle
    counter = itertools.count()

    @functools.wraps(original)
    def shuffle(self, buffer_size, seed=None, reshuffle_each_iteration=None, name=None):
        if seed is None:
            seed = _unseeded_call_seed(next(counter))
        return original(self, buffer_size, seed=seed, reshuffle_each_iteration=reshuffle_each_iteration, name=name)

    dataset_ops.DatasetV2.shuffle = shuffle
    _installed["shuffle"] = original
    _installed["base_seed"] = base_seed


def _unseeded_call_seed(index: int) -> int:
    """The seed of the ``index``-th unseeded shuffle: the same on every worker; from the script's global seed when it
    set one (``tf.random.set_seed``, ``keras.utils.set_random_seed``), so a seeded script shuffles alike from job to
    job as it did on one process (measured: a converted ``repeat().shuffle()`` read another first batch on every
    job), else from worker 0's seed of the job."""
    from tensorflow.python.eager import context

    script_seed = context.global_seed()
    base = _installed["base_seed"] if script_seed is None else int(script_seed) * 1_000_003
    return (base + index) % 2**31


def _seed_image_iterators() -> None:
    """``ImageDataGenerator().flow(...)`` (and ``flow_from_directory``...) without a ``seed`` orders and augments
    its samples with NumPy's global generator: on each worker its own way, so the parts of a batch Keras gives the
    workers come from different batches (overlapping, some samples never seen). With a seed (the job's) Keras
    reseeds NumPy before every batch: the same order and the same augmentation on every worker."""
    image = sys.modules.get("tf_keras.src.preprocessing.image")
    if image is None or "image_iterator" in _installed or "base_seed" not in _installed:
        return
    original = image.Iterator.__init__

    @functools.wraps(original)
    def __init__(self, n, batch_size, shuffle, seed):
        original(self, n, batch_size, shuffle, _installed["base_seed"] % 2**31 if seed is None else seed)

    image.Iterator.__init__ = __init__
    _installed["image_iterator"] = (image.Iterator, original)


@contextlib.contextmanager
def _global_seed(seed: int):
    """TensorFlow's global seed set to ``seed`` inside, the script's own (and its sequence) restored after."""
    from tensorflow.python.eager import context

    ctx = context.context()
    saved_seed, saved_rng = context.global_seed(), getattr(ctx, "_rng", None)
    state = saved_rng.getstate() if saved_rng is not None else None
    tf.random.set_seed(seed)
    try:
        yield
    finally:
        ctx._set_global_seed(saved_seed)  # noqa: SLF001 - the only way back to "no global seed"
        if state is not None and getattr(ctx, "_rng", None) is not None:
            ctx._rng.setstate(state)  # noqa: SLF001


def _seed_keras_data_handlers(keras_module) -> None:
    """tf-keras builds fit's input (its shuffle of NumPy arrays) in ``data_adapter.get_data_handler``."""
    if "data_handler" in _installed or "base_seed" not in _installed:
        return
    adapter = sys.modules.get(f"{keras_module}.src.engine.data_adapter")
    if adapter is None or not hasattr(adapter, "get_data_handler"):
        return
    original = adapter.get_data_handler
    counter = itertools.count(10_000)

    @functools.wraps(original)
    def get_data_handler(*args, **kwargs):
        with _global_seed(_unseeded_call_seed(next(counter))):
            return original(*args, **kwargs)

    adapter.get_data_handler = get_data_handler
    _installed["data_handler"] = original


# --- losses in a train_step --------------------------------------------------------------------------


def _local_mean_losses() -> None:
    """A ``keras.losses`` object called in a ``train_step`` under the strategy averages over this replica's batch.

    tf-keras refuses its default reduction (``AUTO``/``SUM_OVER_BATCH_SIZE``) inside a strategy, outside
    ``compile``: "Please use Reduction.SUM or Reduction.NONE ..." (measured: the keras.io DCGAN and conditional
    GAN died so on every worker). The converter divides every such loss whose gradients an optimizer applies
    by ``num_replicas_in_sync`` inside its tape (``keras-train-step-loss``, or declines the step), which is
    exactly what that refusal guards against; so here the local batch mean is what the loss returns."""
    losses = sys.modules.get("tf_keras.src.losses")
    if losses is None or "loss_reduction" in _installed:
        return
    reduction = losses.losses_utils.ReductionV2
    original = losses.Loss._get_reduction

    @functools.wraps(original)
    def _get_reduction(self):
        if self.reduction in (reduction.AUTO, reduction.SUM_OVER_BATCH_SIZE):
            return reduction.SUM_OVER_BATCH_SIZE
        return self.reduction

    losses.Loss._get_reduction = _get_reduction
    _installed["loss_reduction"] = (losses.Loss, original)


# --- predict --------------------------------------------------------------------------------------


def install_keras_hooks() -> None:
    """Once tf-keras is loaded: local ``predict`` and seeded data handlers (no-op before, or for Keras 3)."""
    if "tf_keras" not in sys.modules:
        return
    _seed_keras_data_handlers("tf_keras")
    _seed_image_iterators()
    _local_mean_losses()
    training = sys.modules.get("tf_keras.src.engine.training")
    model_class = getattr(training, "Model", None)
    if model_class is None or "predict" in _installed:
        return
    original = model_class.predict

    @functools.wraps(original)
    def predict(self, x, batch_size=None, verbose="auto", steps=None, callbacks=None, **kwargs):
        strategy = getattr(self, "distribute_strategy", None)  # the model's, else the one current (dp.enter_scope)
        if not _is_multi_worker(strategy) or kwargs.get("use_multiprocessing") or callbacks:
            return original(self, x, batch_size=batch_size, verbose=verbose, steps=steps, callbacks=callbacks,
                            **kwargs)
        return local_predict(self, strategy, x, batch_size, steps, lambda: original(
            self, x, batch_size=batch_size, verbose=verbose, steps=steps, callbacks=callbacks, **kwargs))

    model_class.predict = predict
    _installed["predict"] = (model_class, original)


def _is_multi_worker(strategy) -> bool:
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) or \
        type(strategy).__name__ == "CollectiveAllReduceStrategy"


def local_predict(model, strategy, x, batch_size, steps, fallback):
    """``model.predict(x)`` computed on this worker's replica alone (see the module's docstring)."""
    batches = _batches(x, batch_size, steps)
    if batches is None:
        return fallback()
    step = model.__dict__.get("_dpmigrate_local_predict")
    if step is None:
        @tf.function(reduce_retracing=True)
        def step(data):
            return strategy.run(model.predict_step, args=(data,))
        object.__setattr__(model, "_dpmigrate_local_predict", step)  # tf-keras tracks plain attributes
    outputs = []
    for data in batches:
        result = step(data)
        outputs.append(tf.nest.map_structure(lambda t: np.asarray(strategy.experimental_local_results(t)[0]),
                                             result))
    if not outputs:
        raise ValueError("predict(): the input has no samples")
    return tf.nest.map_structure(lambda *parts: np.concatenate(parts, axis=0), *outputs)


def _batches(x, batch_size, steps):
    """An iterator of ``predict_step`` inputs, or None for an input this does not read (Keras' own then runs)."""
    if isinstance(x, tf.data.Dataset):
        return iter(x.take(steps) if steps is not None else x)
    keras_sequence = getattr(sys.modules.get("tf_keras.src.utils.data_utils"), "Sequence", None)
    if keras_sequence is not None and isinstance(x, keras_sequence):
        count = len(x) if steps is None else min(steps, len(x))
        return (x[i] for i in range(count))
    leaves = tf.nest.flatten(x)
    if not leaves or not all(len(getattr(a, "shape", ())) >= 1 for a in leaves):
        return None  # a generator, a DatasetCreator...: Keras' own predict reads it
    size = int(leaves[0].shape[0])
    batch = batch_size or 32
    stop = size if steps is None else min(size, steps * batch)
    return ((tf.nest.map_structure(lambda a, i=i: tf.convert_to_tensor(a[i:i + batch]), x),)
            for i in range(0, stop, batch))
