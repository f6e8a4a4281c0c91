"""The Keras half of the TensorFlow adapter (:mod:`.tensorflow`): tf-keras and Keras 3, whichever the script uses.

- Steps: ``apply_gradients`` of tf-keras' optimizers (the current ``Optimizer`` and the legacy
  ``OptimizerV2``) and ``apply`` of Keras 3's (which its ``apply_gradients`` and ``fit`` call) tell the
  adapter which variables an optimizer updates, before it updates them; the variables whose gradient is
  None are left out, as the optimizers themselves (and ``dp.distributed_optimizer``) leave them out.
- Names and owners: ``Layer.add_weight`` notes which layer made each variable (the owner's class, and
  batch normalisation, for the report).
- ``Model.fit`` runs with ``shuffle=False``, and the model's ``train_step`` (its own, or the override of a
  subclass) is wrapped on the instance before ``fit`` (or ``train_on_batch``) builds its train function:
  every numeric tensor of the batch it receives (features and labels) goes to the recorder through ``tf.numpy_function`` (a
  stateful op, so it runs inside the graph at every step). Not under ``jit_compile=True``: XLA cannot run
  Python.
- Dropout off: ``Dropout`` and the spatial dropouts, ``GaussianNoise``, ``GaussianDropout`` and
  ``AlphaDropout`` return their inputs (their inference behaviour), and the generators' dropout (RNN
  masks, ``keras.random.dropout``) is the identity. Keras 3's versions of those layers no longer draw a
  seed from Python's ``random`` when constructed (tf-keras' never do), so a Keras 3 script and its conversion
  to tf-keras start from the same weights.
"""

from __future__ import annotations

import functools
import importlib
import inspect

from . import batch_scale
from ._tf_common import is_numeric, quietly

_DROPOUT_LAYERS = {
    "tf_keras": ("tf_keras.src.layers.regularization.dropout:Dropout",
                 "tf_keras.src.layers.regularization.gaussian_noise:GaussianNoise",
                 "tf_keras.src.layers.regularization.gaussian_dropout:GaussianDropout",
                 "tf_keras.src.layers.regularization.alpha_dropout:AlphaDropout"),
    "keras": ("keras.src.layers.regularization.dropout:Dropout",
              "keras.src.layers.regularization.spatial_dropout:BaseSpatialDropout",
              "keras.src.layers.regularization.gaussian_noise:GaussianNoise",
              "keras.src.layers.regularization.gaussian_dropout:GaussianDropout",
              "keras.src.layers.regularization.alpha_dropout:AlphaDropout"),
}


def _find(path: str):
    """``"package.module:Name"`` (or a module alone), None where this Keras has no such thing."""
    module, _, name = path.partition(":")
    try:
        found = importlib.import_module(module)
        return getattr(found, name) if name else found
    except (ImportError, AttributeError):
        return None


def install(keras, tf, recorder, steps) -> None:
    which = keras.__name__.split(".")[0]
    if which == "tf_keras":
        for path in ("tf_keras.src.optimizers.optimizer:_BaseOptimizer", "tf_keras.src.optimizers.optimizer:Optimizer",
                     "tf_keras.src.optimizers.legacy.optimizer_v2:OptimizerV2"):
            _wrap_apply_gradients(_find(path), steps)
        layer, model = _find("tf_keras.src.engine.base_layer:Layer"), _find("tf_keras.src.engine.training:Model")
        generator = _find("tf_keras.src.backend:RandomGenerator")
        if generator is not None:
            generator.dropout = _identity_dropout(recorder)
    elif which == "keras" and _find("keras.src.optimizers.base_optimizer:BaseOptimizer") is not None:  # Keras 3
        _wrap_apply(_find("keras.src.optimizers.base_optimizer:BaseOptimizer"), steps)
        layer, model = _find("keras.src.layers.layer:Layer"), _find("keras.src.models.model:Model")
        random = _find("keras.src.backend.tensorflow.random")
        if random is not None and hasattr(random, "dropout"):
            dropout = _identity_dropout(recorder)
            random.dropout = lambda inputs, *args, **kwargs: dropout(None, inputs)
    else:
        return
    _note_owners(layer, steps)
    _wrap_fit(model, tf, recorder)
    batch_scale.install_keras_fit(model, tf, recorder)
    for path in _DROPOUT_LAYERS[which]:
        _identity_call(_find(path), tf, recorder)
        if which == "keras":
            _no_seed_drawn(_find(path))


def _identity_dropout(recorder):
    def dropout(self, inputs, *args, **kwargs):
        recorder.changed("dropout off: random dropout masks (RNN cells, keras.random.dropout)")
        return inputs
    return dropout


def _wrap_apply_gradients(cls, steps) -> None:
    """tf-keras: ``apply_gradients(grads_and_vars, ...)`` (the subclass's, then its base's: only the outer call)."""
    if cls is None or "apply_gradients" not in cls.__dict__:
        return
    original = cls.__dict__["apply_gradients"]
    before = quietly("registering an optimizer")(steps.before_apply)

    @functools.wraps(original)
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        if steps.inside_apply():
            return original(self, grads_and_vars, *args, **kwargs)
        pairs = list(grads_and_vars)  # often a zip: read it once, pass the list on
        before(self, [v for g, v in pairs if g is not None])
        with steps.applying():
            return original(self, pairs, *args, **kwargs)

    cls.apply_gradients = apply_gradients


def _wrap_apply(cls, steps) -> None:
    """Keras 3: ``apply(grads, trainable_variables=None)``, which ``apply_gradients`` and ``fit`` call."""
    original = cls.apply
    before = quietly("registering an optimizer")(steps.before_apply)

    @functools.wraps(original)
    def apply(self, grads, trainable_variables=None):
        if steps.inside_apply():
            return original(self, grads, trainable_variables)
        grads = list(grads)
        if trainable_variables is not None:
            trainable_variables = list(trainable_variables)
        listed = trainable_variables if trainable_variables is not None else list(
            getattr(self, "_trainable_variables", None) or [])
        before(self, [v for g, v in zip(grads, listed) if g is not None])
        with steps.applying():
            return original(self, grads, trainable_variables)

    cls.apply = apply


def _note_owners(layer_class, steps) -> None:
    if layer_class is None:
        return
    original = layer_class.add_weight
    note = quietly("noting a variable's layer")(steps.note_owner)

    @functools.wraps(original)
    def add_weight(self, *args, **kwargs):
        variable = original(self, *args, **kwargs)
        if variable is not None:
            note(variable, self)
        return variable

    layer_class.add_weight = add_weight


def _wrap_fit(model_class, tf, recorder) -> None:
    if model_class is None:
        return
    original = model_class.fit
    signature = inspect.signature(original)
    record = quietly("recording the batches of train_step")(functools.partial(_record_train_step, tf, recorder))

    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        if not recorder.finished:
            if not recorder.shuffled:
                args, kwargs = _unshuffled(signature, tf, recorder, self, args, kwargs)
            record(self)
        return original(self, *args, **kwargs)

    model_class.fit = fit
    on_batch = getattr(model_class, "train_on_batch", None)
    if on_batch is not None:
        @functools.wraps(on_batch)
        def train_on_batch(self, *args, **kwargs):
            if not recorder.finished:
                record(self)
            return on_batch(self, *args, **kwargs)

        model_class.train_on_batch = train_on_batch


def _unshuffled(signature, tf, recorder, model, args, kwargs):
    try:
        bound = signature.bind(model, *args, **kwargs)
    except TypeError:  # fit will say what is wrong
        return args, kwargs
    parameter = signature.parameters.get("shuffle")
    if parameter is None or not bound.arguments.get("shuffle", parameter.default):
        return args, kwargs
    bound.arguments["shuffle"] = False
    if not isinstance(bound.arguments.get("x"), tf.data.Dataset):  # fit never shuffles a dataset
        recorder.changed("shuffling off: Model.fit(shuffle=False)")
    return bound.args[1:], bound.kwargs


def _record_train_step(tf, recorder, model) -> None:
    if model.__dict__.get("_dpmigrate_train_step") or getattr(model, "train_function", None) is not None:
        return
    if getattr(model, "jit_compile", False) is True:
        recorder.changed("train_step inputs not recorded (jit_compile=True)")
        return
    import numpy as np

    step = model.train_step

    def take(*leaves):
        recorder.consumed_from(lambda: list(leaves), "step")
        return np.int32(0)

    def train_step(data):
        leaves = [t for t in tf.nest.flatten(data) if is_numeric(tf, t)]
        if leaves and not recorder.finished:
            tf.numpy_function(take, leaves, tf.int32, stateful=True)
        return step(data)

    object.__setattr__(model, "train_step", train_step)
    object.__setattr__(model, "_dpmigrate_train_step", True)


def _no_seed_drawn(cls) -> None:
    """Keras 3's random layers draw a seed from Python's ``random`` when they are constructed, tf-keras' only
    when they drop: with dropout off neither should move the generator, so that a Keras 3 script and its
    conversion to tf-keras (``from tensorflow import keras``) initialise the same weights."""
    if cls is None or "__init__" not in cls.__dict__:
        return
    import random

    original = cls.__init__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        state = random.getstate()
        try:
            original(self, *args, **kwargs)
        finally:
            random.setstate(state)

    __init__.__signature__ = inspect.signature(original)  # Keras 3 reads the arguments of __init__
    cls.__init__ = __init__


def _identity_call(cls, tf, recorder) -> None:
    if cls is None or "call" not in cls.__dict__:
        return
    keras3 = cls.__module__.startswith("keras.")

    def call(self, inputs, training=None):  # Keras reads call's arguments: keep `training`
        if getattr(self, "rate", 0) or getattr(self, "stddev", 0):
            recorder.changed(f"dropout off: {type(self).__name__}")
        return inputs if keras3 else tf.identity(inputs)

    cls.call = call
