"""The TensorFlow adapter of the ``dpmigrate verify`` harness: installed when the script imports TensorFlow.

TensorFlow runs most training code as graphs: the Python of a ``tf.function`` runs once, when it is
traced, and never again. So the harness registers what it needs at trace time and takes its
measurements at the eager points between graph calls:

- Seeds TensorFlow's global generator (:func:`dpmigrate.verify.harness.core.seed_for`; Keras draws its
  initializers' seeds from Python's ``random``, which the core seeds).
- Steps: the optimizers' gradient application is wrapped at the class level (tf-keras' ``Optimizer`` and
  legacy ``OptimizerV2`` ``apply_gradients``, Keras 3's ``apply``, see :mod:`._tf_keras`), so every
  optimizer is seen, wrapped by ``dp.distributed_optimizer`` or not (that wrapper calls the bound original).
  The first call registers the optimizer with the variables it updates; inside a trace the initial
  snapshot is read through ``tf.init_scope``. Steps are its ``iterations`` since registration. Boundaries
  are taken after every eager call of a ``tf.function`` (Keras' ``fit`` runs one per step), before an eager
  ``apply_gradients`` and before every element an eager dataset iterator produces, each only once the
  step count has moved: between steps, never inside one, and at the same points on every worker.
  The snapshot before the first step holds the values the first eager gradient was computed from:
  ``dp.distributed_optimizer`` synchronises the workers inside its first ``apply_gradients``, which in an
  eager loop is after each worker computed its first gradients from its own initial weights.
- Dropout off: Keras' dropout-like layers return their inputs, as at inference, and ``tf.nn.dropout`` and
  the Keras random generators' dropout are the identity (:mod:`._tf_keras`; there, too, Keras 3's random
  layers stop drawing seeds, so a Keras 3 script and its tf-keras conversion start alike).
- Shuffling off: ``Dataset.shuffle`` returns the dataset unchanged, ``Dataset.list_files`` keeps its
  order, and ``Model.fit`` runs with ``shuffle=False``.
- Inputs: the first tensor of every element an eager ``tf.data`` iterator produces (``loader``; the
  converted script iterates what ``dp.distributed_loader`` made of the dataset, so its worker's share),
  and the batch each ``train_step`` of ``fit`` receives, read inside the graph by ``tf.numpy_function``
  (``step``; on a worker of MultiWorkerMirroredStrategy, that worker's per-replica batch).

Importing TensorFlow with ``TF_USE_LEGACY_KERAS=1`` imports tf-keras before TensorFlow has finished
importing, so the Keras half waits for :func:`install` (it needs the finished module).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import re
import threading
import weakref

from . import batch_scale, file_wrappers, repeats
from ._tf_common import is_numeric, quietly

_state: dict = {"tf": None, "kerases": [], "steps": None}
_REPLICA_SUFFIX = re.compile(r"(/replica_\d+)?(:\d+)?$")


def install(tf, recorder) -> None:
    recorder.framework = "tensorflow"
    _state["tf"] = tf
    if not recorder.shuffled:  # (the shares pass keeps "no global seed": it decides what an op seed gives, and
        tf.random.set_seed(recorder.seed)  # the runtime seeds the script's unseeded shuffles alike on every worker)
    steps = _Steps(tf, recorder)
    _state["steps"] = steps
    _after_function_calls(steps)
    _first_gradient(tf, steps)
    if not recorder.shuffled:
        _no_shuffle(tf, recorder)
    repeats.install_tensorflow(recorder)
    _record_dataset_elements(tf, recorder, steps)
    _no_nn_dropout(tf, recorder)
    batch_scale.install_tensorflow(tf, recorder)
    file_wrappers.install_tensorflow(tf, recorder)  # tf.io.gfile works in C++
    pending, _state["kerases"] = _state["kerases"], []
    for module in pending:
        _install_keras_now(module, recorder)


def install_keras(keras, recorder) -> None:
    """tf-keras or Keras 3: now if TensorFlow is ready, else when :func:`install` runs."""
    if _state["tf"] is None:
        _state["kerases"].append(keras)
    else:
        _install_keras_now(keras, recorder)


def _install_keras_now(keras, recorder) -> None:
    from . import _tf_keras

    _tf_keras.install(keras, _state["tf"], recorder, _state["steps"])
    file_wrappers.install_keras(keras, recorder)  # Model.save writes h5 and SavedModels in C++


def clean_name(variable) -> str:
    name = getattr(variable, "path", None) or getattr(variable, "name", None) or ""
    return _REPLICA_SUFFIX.sub("", str(name))


def read_eagerly(tf, variable):
    """The variable's value as a NumPy array (a mirrored variable's local copy), also from inside a trace."""
    import numpy as np

    with tf.init_scope():
        value = variable.numpy() if hasattr(variable, "numpy") else tf.convert_to_tensor(variable).numpy()
    array = np.array(value, copy=True)
    if array.dtype.kind == "f" and array.dtype.itemsize < 4 or array.dtype.name == "bfloat16":
        array = array.astype("float32")
    return array


def _ref(value):
    """A weak reference where the object takes one, else a strong one: called, it gives the object."""
    try:
        return weakref.ref(value)
    except TypeError:
        return lambda: value


class _Steps:
    """The optimizers that stepped, the counted one, and the step boundaries."""

    def __init__(self, tf, recorder):
        self.tf, self.recorder = tf, recorder
        self.primary = None
        self.seen: int | None = None  # the step count at the last boundary
        self.start: dict[int, int] = {}  # iterations of each optimizer when it first stepped
        self.owners: dict[int, tuple] = {}  # id(variable) -> (ref to it, layer class, layer name, is batch norm)
        self.first_gradient: dict[int, tuple] = {}  # id(variable) -> (ref, value when the first gradient was taken)
        self._local = threading.local()

    def inside_apply(self) -> bool:
        return getattr(self._local, "depth", 0) > 0

    @contextlib.contextmanager
    def applying(self):
        """An optimizer is applying gradients (a subclass's apply_gradients calls its base's: count it once)."""
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            yield
        finally:
            self._local.depth -= 1

    def iterations(self, optimizer) -> int:
        return int(read_eagerly(self.tf, optimizer.iterations))

    def done(self, optimizer) -> int:
        return self.iterations(optimizer) - self.start.get(id(optimizer), 0)

    def note_owner(self, variable, layer) -> None:
        kinds = {c.__name__ for c in type(layer).__mro__}
        batchnorm = bool(kinds & {"BatchNormalization", "BatchNormalizationBase", "SyncBatchNormalization"})
        self.owners[id(variable)] = (_ref(variable), type(layer).__name__, getattr(layer, "name", ""), batchnorm)

    def describe(self, optimizer, variables) -> list:
        described = []
        for j, variable in enumerate(variables):
            known = self.owners.get(id(variable))
            owner = ""
            if known is not None and known[0]() is variable:
                owner = known[1]
                if known[3]:
                    self.recorder.note_batchnorm([known[2]])
            name = clean_name(variable) or f"{type(optimizer).__name__}.var{j}"
            described.append((name, list(variable.shape), owner, functools.partial(self.read, variable)))
        return described

    def read(self, variable):
        """Its value now, or, the first time, the value the first eager gradient was computed from."""
        early = self.first_gradient.pop(id(variable), None)
        if early is not None and early[0]() is variable:
            return early[1]
        return read_eagerly(self.tf, variable)

    def gradient_taken(self, sources) -> None:
        """The first eager ``tape.gradient``, before any optimizer stepped: keep the values it differentiates at.
        ``dp.distributed_optimizer`` makes the workers' variables worker 0's inside the first
        ``apply_gradients``: an eager first step whose gradients were computed from each worker's own
        initial weights then shows as ranks that disagree before the first step (in a ``tf.function`` the
        variables are synchronised while it is traced, before the step runs)."""
        for variable in self.tf.nest.flatten(sources):
            if hasattr(variable, "assign") and hasattr(variable, "numpy"):
                self.first_gradient[id(variable)] = (_ref(variable), read_eagerly(self.tf, variable))

    def before_apply(self, optimizer, variables) -> None:
        """An optimizer is about to apply gradients to ``variables`` (eagerly, or while being traced)."""
        recorder = self.recorder
        if recorder.finished or not variables:
            return
        if id(optimizer) not in self.start:  # a tracked optimizer stays alive: its id stays its own
            self.start[id(optimizer)] = self.iterations(optimizer)
        if not recorder.track(optimizer, lambda: self.describe(optimizer, variables), lambda: self.done(optimizer)):
            return
        self.primary = optimizer  # (some optimizer stepped: boundaries from now on)
        if self.tf.executing_eagerly():
            self.seen = recorder.steps_total()
            recorder.boundary(self.seen, pending=True)
        else:
            self.first_gradient.clear()  # a graph's variables are read as they are when it is traced
            with self.tf.init_scope():
                recorder.take_initial_snapshot()
        self.first_gradient.clear()

    def safe_point(self) -> None:
        """Between steps (after a graph call, before a dataset element): a boundary if the count moved."""
        if self.primary is None or self.recorder.finished:
            return
        done = self.recorder.steps_total()
        if done != self.seen:
            self.seen = done
            self.recorder.boundary(done, pending=False)


def _after_function_calls(steps: _Steps) -> None:
    from tensorflow.python.eager import context
    from tensorflow.python.eager.polymorphic_function import polymorphic_function

    original = polymorphic_function.Function.__call__
    check = quietly("step boundary after a tf.function call")(steps.safe_point)

    @functools.wraps(original)
    def call(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if steps.primary is not None and context.executing_eagerly():
            check()
        return result

    polymorphic_function.Function.__call__ = call


def _first_gradient(tf, steps: _Steps) -> None:
    from tensorflow.python.eager import backprop, context

    original = backprop.GradientTape.gradient
    note = quietly("reading the variables of the first gradient")(steps.gradient_taken)

    @functools.wraps(original)
    def gradient(self, target, sources, *args, **kwargs):
        if steps.primary is None and not steps.first_gradient and context.executing_eagerly():
            note(sources)
        return original(self, target, sources, *args, **kwargs)

    backprop.GradientTape.gradient = gradient


def _no_shuffle(tf, recorder) -> None:
    from tensorflow.python.data.ops import dataset_ops

    def shuffle(self, *args, **kwargs):
        recorder.changed("shuffling off: Dataset.shuffle")
        return self

    dataset_ops.DatasetV2.shuffle = shuffle
    list_files = dataset_ops.DatasetV2.list_files

    def in_order(file_pattern, shuffle=None, seed=None, name=None):
        if shuffle is None or shuffle:
            recorder.changed("shuffling off: Dataset.list_files")
        return list_files(file_pattern, shuffle=False, seed=seed, name=name)

    dataset_ops.DatasetV2.list_files = staticmethod(in_order)


def _to_numpy(tf):
    def convert(value):
        return value.numpy() if is_numeric(tf, value) else None
    return convert


def _record_dataset_elements(tf, recorder, steps: _Steps) -> None:
    from tensorflow.python.data.ops import dataset_ops, iterator_ops
    from tensorflow.python.eager import context

    from .fingerprint import arrays

    convert = _to_numpy(tf)
    streams: dict[int, int] = {}  # id of a dataset iterated eagerly -> its stream, while it lives
    counter = itertools.count()
    dataset_iter = dataset_ops.DatasetV2.__iter__

    @functools.wraps(dataset_iter)
    def new_iterator(self):
        iterator = dataset_iter(self)
        try:
            if id(self) not in streams:
                weakref.finalize(self, streams.pop, id(self), None)  # a later dataset may get the same id
                streams[id(self)] = next(counter)
            iterator._dpmigrate_stream = streams[id(self)]
        except (TypeError, AttributeError):  # not weakly referable: its elements are stream -1
            pass
        return iterator

    dataset_ops.DatasetV2.__iter__ = new_iterator
    original = iterator_ops.OwnedIterator._next_internal
    safe_point = quietly("step boundary before a dataset element")(steps.safe_point)
    consumed = quietly("recording a dataset element")(
        lambda element, stream: recorder.consumed(arrays(element, convert), "loader", stream=stream))

    @functools.wraps(original)
    def next_element(self):
        if not context.executing_eagerly():
            return original(self)
        safe_point()
        element = original(self)
        if not recorder.finished:
            consumed(element, getattr(self, "_dpmigrate_stream", -1))
        return element

    iterator_ops.OwnedIterator._next_internal = next_element


def _no_nn_dropout(tf, recorder) -> None:
    def identity(x, *args, **kwargs):
        recorder.changed("dropout off: tf.nn.dropout")
        return tf.identity(x)

    for api in (tf.nn, getattr(getattr(tf.compat, "v2", None), "nn", None),
                getattr(getattr(tf.compat, "v1", None), "nn", None)):
        if api is not None and hasattr(api, "dropout"):
            api.dropout = identity
