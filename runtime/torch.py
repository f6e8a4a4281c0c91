"""The torch backend of the runtime contract, built on torch.distributed and DDP.

``import dpmigrate.runtime.torch as dp``. Launched by torchrun, ``dpmigrate launch``, Slurm, Open MPI,
Paddle's launcher or TF_CONFIG, ``init()`` starts a process group (gloo on CPU, nccl on GPU with the
local GPU pinned) from the :class:`~dpmigrate.runtime.role.Role`; not launched, it starts nothing and
every function here behaves like the plain single-process code. The contract is declared once, as data,
in ``dpmigrate/runtime/__init__.py``; what needs no framework (batch and learning-rate policies, the
timeout, the main-process print, ``main_process_first``, ``shard``'s split) is :mod:`.common`'s.

Module state lives in ``_state`` here, and in ``_torch_faults`` and ``_torch_model``;
``_reset_for_tests()`` returns all of it to a fresh import's (ending first, as ``shutdown()`` does, a
process group ``init()`` started).
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import datetime
import os
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist

from . import _torch_draws, _torch_faults, _torch_model, _torch_teardown, common
from ._torch_data import distributed_loader_for
from ._torch_model import DistributedDataParallel, make_distributed_optimizer, wrap_model
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
        self.started_group = False  # True when init() created the process group (and so must end it)
        self.monitor: _torch_faults.PeerMonitor | None = None


_state = _State()


def _reset_for_tests() -> None:
    """Back to a fresh import: end what ``init()`` started, forget the role, strategy, broken flag and registries."""
    global _state
    shutdown()
    _state = _State()
    _torch_faults._reset_for_tests()
    _torch_model._reset_for_tests()
    _torch_draws._reset_for_tests()


# --- lifecycle ------------------------------------------------------------------------------------


def init(strategy: Strategy | None = None, *, timeout: float | None = None, backend: str | None = None) -> Role:
    """Join the job the launcher started (or, not launched, do nothing) and return this process's Role."""
    if _state.role is not None:
        if strategy is not None and strategy != _state.strategy:
            raise ValueError(
                f"dp.init() was already called with {_state.strategy}; call it once, with the Strategy you want"
            )
        return _state.role
    strategy = strategy or Strategy()
    if strategy.hierarchical_allreduce:
        raise UnsupportedStrategy(
            "Strategy(hierarchical_allreduce=True): torch DDP has no hierarchical gradient all-reduce; "
            "use the Paddle backend, or drop the knob (NCCL already picks tree/ring algorithms itself)"
        )
    role = read_role()
    if role.world_size > 1:
        _start_process_group(role, backend, common.timeout_seconds(timeout))
    _state.role, _state.strategy = role, strategy
    if role.world_size > 1:
        common.share_host_generators(broadcast)
    return role


def _start_process_group(role: Role, backend: str | None, timeout_s: float) -> None:
    if torch.cuda.is_available():
        torch.cuda.set_device(role.local_rank % torch.cuda.device_count())
    if dist.is_initialized():  # the script (or a library) started one already: adopt it
        if dist.get_world_size() != role.world_size or dist.get_rank() != role.rank:
            raise RuntimeError(
                f"a process group is already running as rank {dist.get_rank()} of {dist.get_world_size()}, "
                f"but the launcher says rank {role.rank} of {role.world_size} ({role.launcher})"
            )
        return
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    kwargs: dict[str, Any] = dict(
        backend=backend, rank=role.rank, world_size=role.world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    rendezvous = os.environ.get("DPMIGRATE_RENDEZVOUS")
    if rendezvous:  # dpmigrate launch on one node: a FileStore in its private log dir, no socket
        if not os.path.isabs(rendezvous):
            raise ValueError(f"DPMIGRATE_RENDEZVOUS={rendezvous!r}: give the absolute path of the job's "
                             "rendezvous file (dpmigrate launch sets it); unset it when not launched by it")
        kwargs["init_method"] = f"file://{rendezvous}"
    elif role.launcher == "torchrun":
        kwargs["init_method"] = "env://"  # reuses torchrun's agent store
    else:
        kwargs["init_method"] = f"tcp://{role.master_endpoint}"
    dist.init_process_group(**kwargs)
    _state.started_group = True
    _state.monitor = _torch_faults.PeerMonitor.start(role, timeout_s)
    # At exit, before Python finalizes: see _torch_teardown for why a plain exit can abort.
    atexit.register(shutdown)


def shutdown() -> None:
    """End the process group cleanly (registered at exit by ``init``); safe to call twice."""
    if _state.monitor is not None:
        _state.monitor.stop()  # and joined: a thread inside a store call at finalization aborts
        _state.monitor = None
    if _state.started_group and dist.is_initialized() and not _torch_faults.job_is_broken():
        if dist.get_backend() == "gloo":
            _torch_teardown.wait_for_idle_gloo_workers()
        dist.destroy_process_group()
    _state.started_group = False


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


def device() -> torch.device:
    """This rank's device: its local GPU when there is one, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", init().local_rank % torch.cuda.device_count())
    return torch.device("cpu")


# --- model, optimizer, data -------------------------------------------------------------------------


def distributed_model(model: torch.nn.Module) -> torch.nn.Module:
    """Wrap ``model`` in DDP (keys and attributes as unwrapped); unchanged when not launched."""
    init()
    if isinstance(model, (torch.nn.DataParallel,)):
        model = model.module  # DataParallel inside DDP would split each rank's batch again
    if isinstance(model, torch.nn.parallel.DistributedDataParallel) or world_size() == 1:
        return model
    return wrap_model(model, _state.strategy, device())


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module inside a DDP (or DataParallel) wrapper; ``model`` itself when it is not wrapped."""
    while isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
        model = model.module
    return model


def distributed_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Average gradients exactly once per step and apply accumulation/LocalSGD from the Strategy.

    Launched, the parameters no wrapped model owns (and their modules' buffers) take rank 0's values
    now, so every rank starts from the same model; ``step(closure)`` averages the gradients the closure
    computes and returns its loss averaged over the ranks. See ``_torch_model`` and ``_torch_start_state``.
    """
    init()
    return make_distributed_optimizer(optimizer, _state.strategy, world_size())


def distributed_loader(loader_or_dataset, *, evaluation: bool = False):
    """This rank's shard of a DataLoader (a new DataLoader) or of a Dataset (a Subset)."""
    init()
    return distributed_loader_for(loader_or_dataset, rank(), world_size(), evaluation=evaluation)


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

_REDUCE_OPS = {"sum": "SUM", "mean": "SUM", "max": "MAX", "min": "MIN", "product": "PRODUCT"}


def all_reduce(value, op: str = "mean"):
    """Reduce a tensor or Python number over all ranks; returns a new value of the same kind."""
    if op not in _REDUCE_OPS:
        raise ValueError(f"all_reduce(op={op!r}): use one of {sorted(_REDUCE_OPS)}")
    is_tensor = isinstance(value, torch.Tensor)
    if world_size() == 1:
        return value.clone() if is_tensor else value
    tensor = value.detach().clone() if is_tensor else torch.tensor(value, dtype=torch.float64)
    if not is_tensor and isinstance(value, int) and not isinstance(value, bool) and op != "mean":
        tensor = torch.tensor(value, dtype=torch.int64)
    if op == "mean" and not tensor.is_floating_point():
        tensor = tensor.double()
    backend_tensor = tensor.to(device()) if dist.get_backend() == "nccl" else tensor
    dist.all_reduce(backend_tensor, op=getattr(dist.ReduceOp, _REDUCE_OPS[op]))
    tensor = backend_tensor.to(tensor.device)
    if op == "mean":
        tensor = tensor / world_size()
    if is_tensor:
        return tensor.to(value.dtype) if op != "mean" or value.is_floating_point() else tensor
    return tensor.item()


def all_gather(value):
    """Tensors: concatenated along dim 0 in rank order (sizes may differ). Other objects: a list."""
    if not isinstance(value, torch.Tensor):
        if world_size() == 1:
            return [value]
        out: list = [None] * world_size()
        dist.all_gather_object(out, value)
        return out
    tensor = value.detach().reshape(1) if value.dim() == 0 else value.detach()
    if world_size() == 1:
        return tensor.clone()
    comm = tensor.to(device()) if dist.get_backend() == "nccl" else tensor
    sizes = [torch.zeros(1, dtype=torch.int64, device=comm.device) for _ in range(world_size())]
    dist.all_gather(sizes, torch.tensor([comm.shape[0]], dtype=torch.int64, device=comm.device))
    longest = int(max(s.item() for s in sizes))
    padded = torch.zeros((longest, *comm.shape[1:]), dtype=comm.dtype, device=comm.device)
    padded[: comm.shape[0]] = comm
    parts = [torch.empty_like(padded) for _ in range(world_size())]
    dist.all_gather(parts, padded)
    return torch.cat([p[: int(s.item())] for p, s in zip(parts, sizes)]).to(value.device)


def broadcast(value, src: int = 0):
    """Rank ``src``'s value on every rank (tensors and any picklable object)."""
    if world_size() == 1:
        return value
    if isinstance(value, torch.Tensor):
        comm = value.detach().clone()
        comm = comm.to(device()) if dist.get_backend() == "nccl" else comm
        dist.broadcast(comm, src=src)
        return comm.to(value.device)
    box = [value]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


# --- rank-aware side effects ------------------------------------------------------------------------


def save(obj, path, **kwargs) -> None:
    """``torch.save`` by rank 0 only, atomically; every rank must call it (they meet afterwards).

    A DDP wrapper is saved as the module inside it (``unwrap``), so ``torch.load`` gives back the
    model's own class, loadable without a process group. Looked at: ``obj`` itself, and the values of
    ``obj`` when it is a dict (any dict subclass, keys untouched), a list or a tuple (named tuples
    included), one level deep only; ``obj`` itself is never modified (a shallow copy is saved). A
    ``DataParallel`` the script built itself is saved as it is.
    """
    if is_main_process():
        obj = _without_ddp_wrappers(obj)
        if isinstance(path, (str, os.PathLike)):
            atomic_write(path, lambda f: torch.save(obj, f, **kwargs))
        else:  # a file-like object: the caller owns its atomicity
            torch.save(obj, path, **kwargs)
    barrier()


def _is_ddp(value) -> bool:
    return isinstance(value, torch.nn.parallel.DistributedDataParallel)


def _without_ddp_wrappers(obj):
    """``obj`` with a DDP wrapper replaced by its module, as itself or as a top-level value (see ``save``)."""
    if _is_ddp(obj):
        return unwrap(obj)
    if isinstance(obj, dict) and any(_is_ddp(v) for v in obj.values()):
        shallow = copy.copy(obj)  # keeps OrderedDict, defaultdict and other dict subclasses
        for key, value in obj.items():
            if _is_ddp(value):
                shallow[key] = unwrap(value)
        return shallow
    if isinstance(obj, (list, tuple)) and any(_is_ddp(v) for v in obj):
        items = [unwrap(v) if _is_ddp(v) else v for v in obj]
        if isinstance(obj, list):
            shallow = copy.copy(obj)
            shallow[:] = items
            return shallow
        return type(obj)._make(items) if hasattr(obj, "_fields") else type(obj)(items)
    return obj


def print(*args, **kwargs) -> None:  # noqa: A001 - the point is to stand in for print
    """``print`` on the main process only, so logs are not repeated N times."""
    common.print_on_main_process(is_main_process(), *args, **kwargs)


def main_process_first(local: bool = True) -> AbstractContextManager[None]:
    """Run the block on the main process (of each node when ``local``) first, then on the others.

    For downloads and caches: the first process fills the cache, the others find it full. Every rank
    passes exactly one barrier.
    """
    return common.main_process_first(local_rank if local else rank, barrier)


@contextlib.contextmanager
def scope() -> Iterator[None]:
    """TF's strategy scope in the TF backend; nothing to enter for torch."""
    yield


DistributedDataParallel = DistributedDataParallel  # re-exported for isinstance checks
