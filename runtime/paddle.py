"""The Paddle backend of the runtime contract, built on ``paddle.distributed.fleet`` (collective mode).

``import dpmigrate.runtime.paddle as dp``. Launched by ``python -m paddle.distributed.launch`` (or
``dpmigrate launch``, which runs it), or by torchrun, Slurm, Open MPI or TF_CONFIG through the shared
:class:`~dpmigrate.runtime.role.Role`, ``init()`` completes Paddle's own variables
(:mod:`._paddle_env`: gloo on a CPU build, the endpoints for other launchers) and calls
``fleet.init(is_collective=True, strategy=...)``; not launched, it starts nothing and every function
here behaves like the plain single-process code. Dygraph: ``distributed_model`` is
``fleet.distributed_model`` (a ``paddle.DataParallel`` whose ``state_dict`` keys are the layer's own),
``distributed_optimizer`` is ``fleet.distributed_optimizer``, ``distributed_loader`` uses
``DistributedBatchSampler`` (:mod:`._paddle_data`). The Strategy is mapped in :mod:`._paddle_strategy`.

What needs no framework (batch and learning-rate policies, print, ``main_process_first``, ``shard``'s
split) is :mod:`.common`'s. ``timeout`` (``init(timeout=)``, ``DPMIGRATE_TIMEOUT``): the barriers
(``barrier``, ``save``, ``main_process_first``) wait that long on the job's TCPStore; NCCL groups get it
as ``PADDLE_PG_TIMEOUT``; gloo's own collectives keep their fixed 30 s (Paddle 3.3.1 has no option).
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager

import numpy as np
import paddle
import paddle.distributed as dist
from paddle.distributed import fleet

from . import _paddle_draws, _paddle_env, _paddle_model, _paddle_static, _paddle_strategy, common
from ._paddle_data import distributed_loader_for, shardable
from ._paddle_store import StoreBarrier
from .atomic import atomic_write
from .role import Role
from .role_reader import read_role
from .strategy import Strategy, UnsupportedStrategy

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
        self.native = None  # the fleet.DistributedStrategy given to fleet.init
        self.timeout_s = common.DEFAULT_TIMEOUT_SECONDS
        self.started = False  # True when init() ran fleet.init (and so shutdown must end it)
        self.barrier: StoreBarrier | None = None  # on the job's TCPStore, with the runtime's timeout


_state = _State()


def _reset_for_tests() -> None:
    """Back to a fresh import's state (ending, as ``shutdown()`` does, what ``init()`` started)."""
    global _state
    shutdown()
    _state = _State()
    _paddle_draws._reset_for_tests()


def _uses_gpu() -> bool:
    return paddle.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0


# --- lifecycle ------------------------------------------------------------------------------------


def init(strategy: Strategy | None = None, *, timeout: float | None = None) -> Role:
    """Join the job the launcher started (or, not launched, do nothing) and return this process's Role."""
    if _state.role is not None:
        if strategy is not None and strategy != _state.strategy:
            raise ValueError(
                f"dp.init() was already called with {_state.strategy}; call it once, with the Strategy you want"
            )
        return _state.role
    strategy = strategy or Strategy()
    mode = _mode()
    _paddle_strategy.check(strategy, mode=mode)
    timeout_s = common.timeout_seconds(timeout)
    role = read_role()
    if role.world_size > 1:
        problem = _paddle_env.explain_empty_cuda_visible_devices(paddle.is_compiled_with_cuda())
        if problem:
            raise RuntimeError(problem)
        _paddle_env.complete_environment(role, gpu=_uses_gpu())
        os.environ.setdefault("PADDLE_PG_TIMEOUT", str(int(timeout_s * 1000)))  # NCCL groups, in ms
        native = _paddle_strategy.to_distributed_strategy(strategy, mode=mode)
        if mode == "static-allreduce":
            _paddle_static.start_process_group_in_dynamic_mode(lambda: fleet.init(is_collective=True, strategy=native))
        else:
            fleet.init(is_collective=True, strategy=native)
        _state.native, _state.started = native, True
        _paddle_model.keep_reducers_alive()  # two wrappers of one layer (two paddle.Model): see _paddle_model
        _state.barrier = StoreBarrier.from_default_store(role.world_size, timeout_s)
        atexit.register(shutdown)
    _state.role, _state.strategy, _state.timeout_s = role, strategy, timeout_s
    if role.world_size > 1:
        common.share_host_generators(broadcast)
    return role


def _mode() -> str:
    """How data parallelism runs here: dygraph, static with Fleet's minimize (GPU), static with all-reduces (CPU)."""
    if paddle.in_dynamic_mode():
        return "dygraph"
    return "static-fleet" if _uses_gpu() else "static-allreduce"


def shutdown() -> None:
    """Forget the engine ``init`` started (registered at exit by ``init``); safe to call twice.

    Paddle 3.3.1 tears its gloo process group down itself at exit; destroying it explicitly while a
    peer may still be in its last collective would make that peer fail, so nothing is destroyed here.
    """
    _state.started = False


def role() -> Role:
    return init()


def rank() -> int:
    return init().rank


def local_rank() -> int:
    return init().local_rank


def world_size() -> int:
    return init().world_size


def is_main_process() -> bool:
    return init().rank == 0


def device() -> str:
    """This rank's device for ``paddle.set_device`` / ``Tensor.to`` / ``Executor``: ``"gpu:<i>"`` or ``"cpu"``."""
    if _uses_gpu():
        return f"gpu:{init().local_rank % paddle.device.cuda.device_count()}"
    return "cpu"


# --- model, optimizer, data -------------------------------------------------------------------------


def distributed_model(model: paddle.nn.Layer) -> paddle.nn.Layer:
    """``fleet.distributed_model``: a ``paddle.DataParallel`` (keys as unwrapped) that forwards the attributes and
    methods it lacks to the layer, and hands ``paddle.jit.to_static`` on to it (:mod:`._paddle_model`); the
    model itself when not launched."""
    init()
    if isinstance(model, paddle.DataParallel):
        return _paddle_model.forwarding(model)
    if world_size() == 1:
        return model
    if not isinstance(model, paddle.nn.Layer):
        raise TypeError(f"distributed_model() needs a paddle.nn.Layer, got {type(model).__name__}")
    if not paddle.in_dynamic_mode():
        raise RuntimeError("distributed_model() is for dygraph (paddle.nn.Layer) training; in static graph mode "
                           "use dp.distributed_optimizer(optimizer).minimize(loss) instead")
    if _state.strategy.sync_batchnorm:
        model = _paddle_strategy.synchronised_batchnorm(model)
    return _paddle_model.forwarding(fleet.distributed_model(model))


def unwrap(model):
    """The layer inside a ``paddle.DataParallel``; ``model`` itself when it is not wrapped."""
    while isinstance(model, paddle.DataParallel):
        model = model._layers
    return model


def distributed_optimizer(optimizer):
    """Gradients averaged over the ranks; the optimizer itself when not launched.

    Dygraph: ``fleet.distributed_optimizer`` (with the Strategy given to ``fleet.init``); ``LBFGS``, which steps
    through a closure, averages each closure call's gradients and loss instead (:mod:`._paddle_closure`). Static graph:
    an optimizer whose ``minimize`` is Fleet's on GPU builds, and on CPU builds appends one
    ``all_reduce`` per gradient to the program (:mod:`._paddle_static`: Fleet's fails there).
    """
    init()
    if world_size() == 1:
        return optimizer
    if _mode() == "static-allreduce":
        return _paddle_static.AllReduceGradientsOptimizer(optimizer, world_size())
    if _mode() == "static-fleet":
        return fleet.distributed_optimizer(optimizer, strategy=_state.native)
    if isinstance(optimizer, paddle.optimizer.LBFGS):  # step(closure): fleet's optimizer has none
        from ._paddle_closure import ClosureAveragingOptimizer

        return ClosureAveragingOptimizer(optimizer, world_size(), mean=lambda value: _all_reduce(value, "mean"))
    return fleet.distributed_optimizer(optimizer)  # the strategy was given to fleet.init; passing it again warns


def distributed_loader(loader_or_dataset, *, evaluation: bool = False):
    """This rank's shard of a DataLoader (a new DataLoader) or of a Dataset (a Subset)."""
    init()
    return distributed_loader_for(loader_or_dataset, rank(), world_size(), evaluation=evaluation)


def shard(sequence: Sequence) -> Sequence:
    """This rank's contiguous part of any indexable; the first ranks take one more when uneven.

    Paddle tensors of either mode count as indexable: a static-graph ``DataLoader`` yields ``DenseTensor``s,
    which have no ``len()``; their part comes back as a NumPy array (what ``Executor.run`` feeds)."""
    sequence = shardable(sequence)
    start, stop = common.shard_indices(len(sequence), rank(), world_size())
    return sequence[start:stop]


def per_rank_batch_size(global_batch_size: int) -> int:
    """The ``--batch global`` policy: each rank takes B / N, so the global batch stays B."""
    return common.per_rank_batch_size(global_batch_size, world_size())


def scale_lr(lr: float, rule: str = "linear") -> float:
    """The ``--scale-lr`` policy: ``lr * N`` or ``lr * sqrt(N)`` for a global batch N times larger."""
    return common.scale_lr(lr, world_size(), rule)


# --- collectives ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _run_now() -> Iterator[None]:
    """Collectives that run when called: in static graph mode ``paddle.distributed`` would instead append
    them as ops to the program being built, so the runtime's own collectives run in dynamic mode."""
    if paddle.in_dynamic_mode():
        yield
        return
    paddle.disable_static()
    try:
        yield
    finally:
        paddle.enable_static()


_REDUCE_OPS = {"sum": "SUM", "mean": "SUM", "max": "MAX", "min": "MIN", "product": "PROD"}


def _number_tensor(value, op: str) -> paddle.Tensor:
    exact_int = isinstance(value, int) and not isinstance(value, bool) and op != "mean"
    return paddle.to_tensor(np.array(value, dtype=np.int64 if exact_int else np.float64))


def all_reduce(value, op: str = "mean"):
    """Reduce a tensor or Python number over all ranks; returns a new value of the same kind."""
    with _run_now():
        return _all_reduce(value, op)


def _all_reduce(value, op: str = "mean"):
    if op not in _REDUCE_OPS:
        raise ValueError(f"all_reduce(op={op!r}): use one of {sorted(_REDUCE_OPS)}")
    is_tensor = isinstance(value, paddle.Tensor)
    if world_size() == 1:
        return value.clone() if is_tensor else value
    tensor = value.detach().clone() if is_tensor else _number_tensor(value, op)
    if op == "mean" and not tensor.is_floating_point():
        tensor = tensor.astype("float64")
    dist.all_reduce(tensor, op=getattr(dist.ReduceOp, _REDUCE_OPS[op]))
    if op == "mean":
        tensor = tensor / world_size()
    if is_tensor:
        return tensor.astype(value.dtype) if op != "mean" or value.is_floating_point() else tensor
    return tensor.item()


def all_gather(value):
    """Tensors: concatenated along dim 0 in rank order (sizes may differ). Other objects: a list."""
    with _run_now():
        return _all_gather(value)


def _all_gather(value):
    if not isinstance(value, paddle.Tensor):
        if world_size() == 1:
            return [value]
        out: list = []
        dist.all_gather_object(out, value)
        return out
    tensor = value.detach().reshape([1]) if value.ndim == 0 else value.detach()
    if world_size() == 1:
        return tensor.clone()
    sizes: list = []
    dist.all_gather(sizes, paddle.to_tensor([tensor.shape[0]], dtype="int64"))
    counts = [int(s.item()) for s in sizes]
    padded = paddle.zeros([max(counts), *tensor.shape[1:]], dtype=tensor.dtype)
    if tensor.shape[0]:
        padded[: tensor.shape[0]] = tensor
    parts: list = []
    dist.all_gather(parts, padded)
    return paddle.concat([p[:n] for p, n in zip(parts, counts)])


def broadcast(value, src: int = 0):
    """Rank ``src``'s value on every rank (tensors and any picklable object)."""
    with _run_now():
        return _broadcast(value, src)


def _broadcast(value, src: int = 0):
    if world_size() == 1:
        return value
    if isinstance(value, paddle.Tensor):
        comm = value.detach().clone()
        dist.broadcast(comm, src=src)
        return comm
    box = [value]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier() -> None:
    """Every rank waits until all have arrived, up to the runtime's timeout (:mod:`._paddle_store`: not
    gloo's barrier, which fails after a fixed 30 s)."""
    if world_size() == 1:
        return
    if _state.barrier is not None:
        _state.barrier.wait(rank())
        return
    with _run_now():
        dist.barrier()


# --- rank-aware side effects ------------------------------------------------------------------------


def save(obj, path, **kwargs) -> None:
    """``paddle.save`` by rank 0 only, atomically; every rank must call it (they meet afterwards). Like
    ``paddle.save``, it makes the folder the path names when it is missing (a recommender tutorial saved into
    ``./checkpoint/`` it never created: issue 19 audit, round H)."""
    if is_main_process():
        if isinstance(path, (str, os.PathLike)):
            buffer = io.BytesIO()  # paddle.save writes to a path or a BytesIO, not to an open file
            paddle.save(obj, buffer, **kwargs)
            folder = os.path.dirname(os.fspath(path))
            if folder:
                os.makedirs(folder, exist_ok=True)
            atomic_write(path, lambda f: f.write(buffer.getbuffer()))
        else:  # a BytesIO: the caller owns it
            paddle.save(obj, path, **kwargs)
    barrier()


def print(*args, **kwargs) -> None:  # noqa: A001 - the point is to stand in for print
    """``print`` on the main process only, so logs are not repeated N times."""
    common.print_on_main_process(is_main_process(), *args, **kwargs)


def main_process_first(local: bool = True) -> AbstractContextManager[None]:
    """Run the block on the main process (of each node when ``local``) first, then on the others."""
    return common.main_process_first(local_rank if local else rank, barrier)


@contextlib.contextmanager
def scope() -> Iterator[None]:
    """TF's strategy scope in the TF backend; nothing to enter for Paddle."""
    yield
