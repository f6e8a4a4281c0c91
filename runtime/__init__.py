"""dpmigrate.runtime: what a converted script imports to train on N processes.

One contract, one module per framework, chosen by the import line, as ``import horovod.torch as
hvd`` does::

    import dpmigrate.runtime.torch as dp        # torch.distributed / DDP
    import dpmigrate.runtime.tensorflow as dp   # tf.distribute            (later issue)
    import dpmigrate.runtime.paddle as dp       # paddle.distributed.fleet (later issue)

Importing this package imports no framework; each backend imports only its own.

The contract (identical names in every backend)
-----------------------------------------------
``init(strategy=None, *, timeout=None) -> Role``
    Idempotent. Reads the launcher's environment (see :mod:`dpmigrate.runtime.role_reader`) and starts
    the framework's engine. With no launcher environment it starts nothing: world size 1, and
    every call below behaves like the plain single-process code.
``role() -> Role``, ``rank()``, ``local_rank()``, ``world_size()``, ``is_main_process()``, ``device()``
``distributed_model(model)``
    Wraps for data parallelism. The wrapped model's ``state_dict()`` has the unwrapped keys (no
    ``module.``), and unknown attributes are forwarded to the original model.
``distributed_optimizer(optimizer)``
    Averages gradients exactly once (by the wrapped model, or by an all-reduce for parameters no
    wrapped model owns) and applies ``Strategy.gradient_accumulation``.
``distributed_loader(loader_or_dataset, *, evaluation=False)``
    Each rank reads a disjoint shard, batch size / shuffle / drop_last / collate kept, the epoch
    advanced on every new iteration. ``evaluation=True`` shards without padding, so metrics summed
    with ``all_reduce(..., op="sum")`` are exact.
``shard(sequence)``
    This rank's contiguous part of any indexable (for scripts that batch by hand).
``per_rank_batch_size(global_batch_size)``
    The ``--batch global`` policy: ``global_batch_size // world_size()``; raises if not divisible.
``scale_lr(lr, rule="linear")``
    The ``--scale-lr`` policy: ``lr * N`` (``"linear"``) or ``lr * sqrt(N)`` (``"sqrt"``).
``all_reduce(value, op="mean")``, ``all_gather(value)``, ``broadcast(value, src=0)``, ``barrier()``
    Accept framework tensors and plain Python numbers; return the same kind.
``save(obj, path)``
    Rank 0 writes atomically (temporary file, fsync, rename), then all ranks meet.
``print(*args, **kwargs)``
    Only on the main process.
``main_process_first()``
    Context manager: the main process runs the block first (downloads, caches), then the others.
``scope()``
    TF's strategy scope; a no-op context elsewhere.
``Strategy``
    Framework-neutral knobs (:mod:`dpmigrate.runtime.strategy`), mapped onto native options; a
    knob a backend cannot honour raises ``UnsupportedStrategy``.
``shutdown()``
    Ends the engine cleanly; registered at exit by ``init``.
"""

from .role import LaunchEnvironmentError, Role
from .role_reader import read_role
from .strategy import Strategy, UnsupportedStrategy

__all__ = ["LaunchEnvironmentError", "Role", "Strategy", "UnsupportedStrategy", "read_role"]
