"""What only TensorFlow scripts need, outside the contract (the torch and Paddle backends have no use for it):
``dp.enter_scope()`` and ``dp.chief_path(path)`` from ``import dpmigrate.runtime.tensorflow as dp``. Defined here,
not in the backend module, as ``dp.loop`` lives in :mod:`._tf_loop`: the contract is the names every backend
shares, and these are TensorFlow's alone.

- :func:`enter_scope`: the strategy's scope for the rest of the program, for scripts that train through Keras;
- :func:`chief_path`: the real path on the chief, a private temporary one on the other workers.

At world size 1 both change nothing, so the converted script run plainly behaves as the original.
"""

from __future__ import annotations

_backend = None  # set by dpmigrate.runtime.tensorflow: the backend module itself (init, world size, the strategy)


def enter_scope() -> None:
    """The strategy's scope for the rest of the program, for scripts that train through Keras (``fit``, a
    ``train_step``): every variable, wherever the script creates it, is the strategy's (sub-models and
    optimizers built first, layers called on ``keras.Input`` before the model, an adapted
    ``TextVectorization``). Not for hand-written loops (``dp.distributed_optimizer`` averages outside any
    strategy). Nothing at world size 1. See :mod:`._tf_keras`."""
    from . import _tf_keras

    backend = _backend
    backend.init()
    if backend.world_size() == 1:
        return
    _tf_keras.enter_program_scope(backend._strategy())
    import tensorflow as tf

    tf.keras.Model  # noqa: B018 - loads Keras (tf-keras when launched), so its hooks go in now
    _tf_keras.install_keras_hooks()


def chief_path(path):
    """``path`` on the chief (and at world size 1); on every other worker the same name in a private
    temporary folder of its own, removed when the process ends. For what every worker must write (a
    SavedModel export, a summary writer's log dir) but only the chief's copy is kept: TensorFlow's own
    pattern for multi-worker saving."""
    from ._tf_save import private_copy_path

    backend = _backend
    backend.init()
    if backend.world_size() == 1 or backend.is_main_process():
        return path
    return private_copy_path(path, backend.rank())
