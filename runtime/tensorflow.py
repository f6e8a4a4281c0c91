"""The TensorFlow backend of the runtime contract, built on ``tf.distribute.MultiWorkerMirroredStrategy``.

``import dpmigrate.runtime.tensorflow as dp``. Launched (``dpmigrate launch``, a ``TF_CONFIG`` cluster,
torchrun-style variables on one node, Paddle's launcher, Slurm), ``init()`` writes the ``TF_CONFIG`` the
launcher implies when it did not (:mod:`._tf_env`), builds ONE ``MultiWorkerMirroredStrategy`` with the
Strategy's options (:mod:`._tf_strategy`) and waits until every worker has joined, within the start
timeout, else ends the worker naming the ones that never came (:mod:`._tf_watchdog`). Not launched, it
starts nothing: the strategy is TensorFlow's default one and every function here behaves like the plain
single-process code. Two ways to write training, both supported:

- Keras ``compile``/``fit``: build and compile the model under ``with dp.scope():``; the batch given to
  ``fit`` is the global batch (Keras shards it over the workers); save with ``dp.save(model, path)`` on
  every worker.
- Custom loops as written for one process: ``dp.distributed_optimizer(opt)`` averages the gradients in
  ``apply_gradients`` (:mod:`._tf_optimizer`), ``dp.distributed_loader(ds)`` gives each worker its batches
  (:mod:`._tf_data`). Or the tf.distribute way, ``strategy.run`` with the loss scaled by the global
  batch: the helpers are ``dp.loop`` (:mod:`._tf_loop`), outside the contract.

Keras 3 or tf-keras: Keras 3's ``model.fit`` fails under MultiWorkerMirroredStrategy in TF 2.21
(keras-team/keras#20585); tf-keras (``TF_USE_LEGACY_KERAS=1`` before TensorFlow is imported) works. The
variable must be in the environment before Python starts: importing this module changes nothing (a
script may import TensorFlow first, and a single process must run exactly as the original, on the Keras
it always used). ``dpmigrate launch`` sets it for multi-worker jobs when tf-keras is installed; under
other launchers, export it. A Keras 3 model's ``fit``/``evaluate``/``predict`` on several workers raises
a clear error naming that fix instead of the PerReplica error (``distributed_model`` marks the model).

``timeout`` (``init(timeout=)``, ``DPMIGRATE_TIMEOUT``) is the collectives' ``timeout_seconds``; the
start wait is ``DPMIGRATE_START_TIMEOUT`` (``dpmigrate launch --start-timeout``), else that timeout.
Module state lives in ``_state``; ``_reset_for_tests()`` forgets it (TF cannot undo a started server).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager

import numpy as np
import tensorflow as tf

from . import _tf_collectives, _tf_env, _tf_extras, _tf_keras, _tf_loop, _tf_save, _tf_strategy, common
from ._tf_data import distributed_loader_for
from ._tf_extras import chief_path, enter_scope  # noqa: F401 - dp.enter_scope(), dp.chief_path(): TF's alone, outside the contract
from ._tf_optimizer import make_distributed
from ._tf_watchdog import Watchdog
from .role import Role
from .role_reader import read_role
from .strategy import Strategy, UnsupportedStrategy

loop = _tf_loop  # dp.loop: the strategy.run helpers for custom loops (a module, outside the contract)

__all__ = [
    "Role", "Strategy", "UnsupportedStrategy", "all_gather", "all_reduce", "barrier", "broadcast",
    "device", "distributed_loader", "distributed_model", "distributed_optimizer", "init",
    "is_main_process", "local_rank", "main_process_first", "per_rank_batch_size", "print", "rank",
    "role", "save", "scale_lr", "scope", "shard", "shutdown", "unwrap", "world_size",
]


class _State:
    def __init__(self):
        self.role: Role | None = None
        self.strategy = Strategy()
        self.tf_strategy: tf.distribute.Strategy | None = None
        self.timeout_s = common.DEFAULT_TIMEOUT_SECONDS


_state = _State()


def _reset_for_tests() -> None:
    global _state
    _state = _State()
    _tf_keras._reset_for_tests()


def _strategy() -> tf.distribute.Strategy:
    init()
    return _state.tf_strategy


_tf_loop._strategy_getter = _strategy
_tf_extras._backend = sys.modules[__name__]


# --- lifecycle ------------------------------------------------------------------------------------


def init(strategy: Strategy | None = None, *, timeout: float | None = None) -> Role:
    """Join the job the launcher started (or, not launched, do nothing) and return this process's Role."""
    if _state.role is not None:
        if strategy is not None and strategy != _state.strategy:
            raise ValueError(
                f"dp.init() was already called with {_state.strategy}; call it once, with the Strategy you want")
        return _state.role
    strategy = strategy or Strategy()
    _tf_strategy.check(strategy)
    timeout_s = common.timeout_seconds(timeout)
    role = read_role()
    if role.world_size > 1:
        _state.tf_strategy = _start(role, strategy, timeout_s)
    else:
        _state.tf_strategy = tf.distribute.get_strategy()
    _state.role, _state.strategy, _state.timeout_s = role, strategy, timeout_s
    return role


def _start(role: Role, strategy: Strategy, timeout_s: float) -> tf.distribute.Strategy:
    config = _tf_env.cluster_for(role)
    if config is not None:
        os.environ["TF_CONFIG"] = json.dumps(config)  # what the launcher implied, in the form TF reads
    workers = _tf_env.workers_of(_tf_env.current_config())
    watchdog = Watchdog(_tf_env.start_timeout(timeout_s), role.rank, workers)
    try:
        native = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=_tf_strategy.communication_options(strategy, timeout_s))
        if native.num_replicas_in_sync < role.world_size:
            raise RuntimeError(f"{role.describe()}: MultiWorkerMirroredStrategy found {native.num_replicas_in_sync} "
                               f"replica(s) for {role.world_size} workers; check TF_CONFIG={os.environ['TF_CONFIG']}")
        _tf_collectives.all_reduce_sum_or_mean(native, [tf.constant(1.0)], "sum")  # every worker has joined
    finally:
        watchdog.done()
    # worker 0's random seed for the shuffles the script leaves unseeded (every worker shuffles alike)
    mine = np.random.SeedSequence().entropy % 2**31 if role.rank == 0 else 0
    (seed,) = _tf_collectives.all_reduce_sum_or_mean(native, [tf.constant(mine, tf.int64)], "sum")
    _tf_keras.share_shuffle_seeds(int(seed))
    return native


def shutdown() -> None:
    """Nothing to end: TensorFlow has no way to stop a started collective server; it ends with the process."""


def role() -> Role:
    return init()


def rank() -> int:
    return init().rank


def local_rank() -> int:
    return init().local_rank


def world_size() -> int:
    return init().world_size


def is_main_process() -> bool:
    """Rank 0: the chief (or worker 0 when the cluster has no chief)."""
    return init().rank == 0


def device() -> str:
    """This worker's device: ``"/GPU:<local rank>"`` when it sees GPUs, else ``"/CPU:0"`` (for ``tf.device``)."""
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return f"/GPU:{init().local_rank % len(gpus)}"
    return "/CPU:0"


@contextlib.contextmanager
def scope() -> Iterator[None]:
    """The strategy's scope: build and compile models (and their optimizers) inside it. At world size 1
    the default strategy's scope, which changes nothing."""
    with _strategy().scope():
        yield


# --- model, optimizer, data -------------------------------------------------------------------------


def distributed_model(model):
    """The model itself, checked: at world size > 1 a Keras model whose variables were built under
    ``dp.scope()`` (mirrored), and a Keras 3 model's fit/evaluate/predict replaced by a clear error."""
    init()
    if world_size() == 1:
        return model
    variables = list(getattr(model, "variables", []))
    strategy = _state.tf_strategy
    if variables and not all(_created_in_scope(strategy, v) for v in variables):
        raise ValueError(
            f"distributed_model(): {type(model).__name__}'s variables were created outside dp.scope(), so each "
            "worker would train its own copy. Build (and compile) the model inside `with dp.scope():`; for a "
            "custom loop that keeps the model outside, use dp.distributed_optimizer(optimizer) instead")
    if _tf_env.is_keras3_model(model):
        for method in ("fit", "evaluate", "predict"):
            object.__setattr__(model, method, _refuse(method))
    _tf_keras.install_keras_hooks()  # predict on this worker alone, fit's shuffles alike on every worker
    return model


def _created_in_scope(strategy, variable) -> bool:
    """Whether the strategy created it (a Keras 3 variable wraps the tf.Variable the strategy made)."""
    inner = next((v for v in (variable, getattr(variable, "_value", None)) if hasattr(v, "_distribute_strategy")), None)
    return inner is None or strategy.extended.variable_created_in_scope(inner)  # a kind TF does not track: trusted


def _refuse(method: str):
    def refused(*args, **kwargs):
        raise RuntimeError(_tf_env.KERAS3_FIT_MESSAGE.format(method=method))
    return refused


def unwrap(model):
    """The model itself: TensorFlow wraps variables, not models."""
    return model


def distributed_optimizer(optimizer):
    """The optimizer, with ``apply_gradients`` averaging the gradients over the workers first (and making
    every worker start from worker 0's variables); unchanged at world size 1. See :mod:`._tf_optimizer`."""
    init()
    if world_size() == 1:
        return optimizer
    return make_distributed(optimizer, _state.tf_strategy, rank())


def distributed_loader(loader_or_dataset, *, evaluation: bool = False, batch_size: int | None = None):
    """This worker's batches of a batched ``tf.data.Dataset`` (or of arrays, with ``batch_size=`` per worker):
    worker r takes batches r, r+N, ...; see :mod:`._tf_data`. The dataset itself at world size 1."""
    init()
    return distributed_loader_for(loader_or_dataset, rank(), world_size(), evaluation=evaluation,
                                  batch_size=batch_size)


def shard(sequence: Sequence) -> Sequence:
    """This rank's contiguous part of any indexable; the first ranks take one more when uneven."""
    start, stop = common.shard_indices(len(sequence), rank(), world_size())
    return sequence[start:stop]


def per_rank_batch_size(global_batch_size: int) -> int:
    """The ``--batch global`` policy: each rank takes B / N, so the global batch stays B."""
    return common.per_rank_batch_size(global_batch_size, world_size())


def scale_lr(lr: float, rule: str = "linear") -> float:
    """The ``--scale-lr`` policy: ``lr * N`` or ``lr * sqrt(N)`` for a global batch N times larger."""
    return common.scale_lr(lr, world_size(), rule)


# --- collectives ----------------------------------------------------------------------------------

_OPS = ("sum", "mean", "max", "min", "product")


def _as_tensor(value, op: str) -> tf.Tensor:
    if isinstance(value, (tf.Tensor, tf.Variable)):
        return tf.convert_to_tensor(value)
    if hasattr(value, "result") and callable(value.result):  # a Keras metric
        return tf.convert_to_tensor(value.result())
    exact_int = isinstance(value, (int, np.integer)) and not isinstance(value, bool) and op != "mean"
    return tf.constant(value, dtype=tf.int64 if exact_int else tf.float64)


def all_reduce(value, op: str = "mean"):
    """Reduce a tensor, Keras metric or Python number over all workers; returns a tensor for a tensor or
    metric, a Python number for a number."""
    if op not in _OPS:
        raise ValueError(f"all_reduce(op={op!r}): use one of {sorted(_OPS)}")
    is_number = not isinstance(value, (tf.Tensor, tf.Variable)) and not hasattr(value, "result")
    tensor = _as_tensor(value, op)
    if world_size() == 1:
        return value if is_number else tf.identity(tensor)
    original_dtype = tensor.dtype
    if op == "mean" and not tensor.dtype.is_floating:
        tensor = tf.cast(tensor, tf.float64)
    result = _tf_collectives.reduce(_state.tf_strategy, tensor, op, rank(), world_size())
    if is_number:
        return result.numpy().item()
    return result if op == "mean" else tf.cast(result, original_dtype)


def all_gather(value):
    """Tensors: concatenated along axis 0 in rank order (lengths may differ). Other objects: a list."""
    if not isinstance(value, (tf.Tensor, tf.Variable, np.ndarray)):
        if world_size() == 1:
            return [value]
        return _tf_collectives.gather_objects(_state.tf_strategy, value, rank(), world_size())
    tensor = tf.convert_to_tensor(value)
    tensor = tf.reshape(tensor, [1]) if tensor.shape.rank == 0 else tensor
    if world_size() == 1:
        return tf.identity(tensor)
    return _tf_collectives.all_gather(_state.tf_strategy, tensor, rank(), world_size())


def broadcast(value, src: int = 0):
    """Worker ``src``'s value on every worker (tensors and picklable objects), via the strategy's all-gather."""
    if world_size() == 1:
        return value
    if isinstance(value, (tf.Tensor, tf.Variable)):
        tensor = tf.convert_to_tensor(value)
        zeros = tf.zeros_like(tensor)
        return _tf_collectives.all_reduce_sum_or_mean(
            _state.tf_strategy, [tensor if rank() == src else zeros], "sum")[0]
    return _tf_collectives.gather_objects(_state.tf_strategy, value if rank() == src else None, rank(),
                                          world_size())[src]


def barrier() -> None:
    """Every worker waits until all have arrived (an all-reduce of the strategy, with its timeout)."""
    if world_size() > 1:
        _tf_collectives.all_reduce_sum_or_mean(_state.tf_strategy, [tf.constant(0.0)], "sum")


# --- rank-aware side effects ------------------------------------------------------------------------


def save(obj, path, *, weights_only: bool = False, **kwargs):
    """Every worker must call it: the chief writes ``path`` (atomically), the others a temporary path
    they remove, then all meet. ``obj``: a Keras model (``model.save``, or ``save_weights`` with
    ``weights_only=True``), a ``tf.train.Checkpoint`` (``save(prefix)``: returns the numbered path), a
    ``tf.Module`` (SavedModel), a ``tf.train.CheckpointManager`` (``path``: its directory; the chief saves through
    it) or a picklable object. Returns the path written on the chief."""
    init()
    written = _tf_save.save(obj, path, is_chief=is_main_process(), barrier=barrier, weights_only=weights_only,
                            **kwargs)
    if isinstance(obj, tf.train.CheckpointManager) and world_size() > 1:
        written = broadcast(written)  # the numbered path the chief's manager chose
    return written


def print(*args, **kwargs) -> None:  # noqa: A001 - the point is to stand in for print
    """``print`` on the main process only, so logs are not repeated N times."""
    common.print_on_main_process(is_main_process(), *args, **kwargs)


def main_process_first(local: bool = True) -> AbstractContextManager[None]:
    """Run the block on the main process (of each node when ``local``) first, then on the others."""
    return common.main_process_first(local_rank if local else rank, barrier)
