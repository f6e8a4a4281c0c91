"""dpmigrate.runtime: what a converted script imports to train on N processes.

One contract, one module per framework, chosen by the import line, as ``import horovod.torch as
hvd`` does::

    import dpmigrate.runtime.torch as dp        # torch.distributed / DDP
    import dpmigrate.runtime.tensorflow as dp   # tf.distribute (MultiWorkerMirroredStrategy)
    import dpmigrate.runtime.paddle as dp       # paddle.distributed.fleet

Importing this package imports no framework; each backend imports only its own.

The contract is :data:`CONTRACT`, below: every backend exports exactly these names (its ``__all__``),
functions with these parameters in this order (a backend may add keyword-only parameters with
defaults, e.g. torch's ``init(..., backend=None)``), and the shared classes themselves.
``tests/test_contract.py`` checks every backend against it with
:func:`dpmigrate.runtime.contract_check.check_backend`. The listing that follows is generated from it.
"""

from __future__ import annotations

import dataclasses

from .role import LaunchEnvironmentError, Role
from .role_reader import read_role
from .strategy import Strategy, UnsupportedStrategy

__all__ = ["CONTRACT", "ContractName", "LaunchEnvironmentError", "Role", "Strategy", "UnsupportedStrategy",
           "read_role"]


@dataclasses.dataclass(frozen=True)
class ContractName:
    """One name every backend exports.

    ``spec`` is a function's parameter list as written in Python (``"(value, op='mean') -> value"``;
    the return annotation is documentation only), or, for a class the backends share, the class itself:
    a backend must export that very object.
    """

    name: str
    spec: str | type
    doc: str

    def synopsis(self) -> str:
        return self.name + self.spec if isinstance(self.spec, str) else self.name


CONTRACT: tuple[ContractName, ...] = (
    ContractName("init", "(strategy=None, *, timeout=None) -> Role", """
        Idempotent. Reads the launcher's environment (:func:`read_role`) and starts the framework's
        engine, with a collective timeout of ``timeout`` seconds (default ``DPMIGRATE_TIMEOUT``, else
        600). With no launcher environment it starts nothing: world size 1, and every call below
        behaves like the plain single-process code."""),
    ContractName("role", "() -> Role", "This process's Role (calls ``init()`` if needed)."),
    ContractName("rank", "() -> int", "This process's rank in the job."),
    ContractName("local_rank", "() -> int", "Its rank among the processes on its node."),
    ContractName("world_size", "() -> int", "The number of processes in the job."),
    ContractName("is_main_process", "() -> bool", "Whether this is rank 0."),
    ContractName("device", "()", "This rank's device: its local accelerator when there is one, else the CPU."),
    ContractName("distributed_model", "(model)", """
        Wraps for data parallelism. The wrapped model's ``state_dict()`` has the unwrapped keys (no
        ``module.``), and unknown attributes are forwarded to the original model. With
        ``Strategy(sync_batchnorm=True)``, launched, its batch normalisation layers become the framework's
        synchronised ones where the framework runs them (torch: CUDA; Paddle: GPUs), else the job stops
        with :class:`UnsupportedStrategy` (TF: the layers' own ``synchronized=True``)."""),
    ContractName("unwrap", "(model)", """
        The model as the user built it: the framework's data-parallel wrapper removed (the argument
        itself when it is not wrapped). What whole-model saves and exports must see."""),
    ContractName("distributed_optimizer", "(optimizer)", """
        Averages gradients exactly once (by the wrapped model, or by an all-reduce for parameters no
        wrapped model owns) and applies ``Strategy.gradient_accumulation``. Parameters no wrapped model
        owns start from rank 0's values on every rank; ``step(closure)`` averages the gradients the
        closure computes and returns the loss averaged over the ranks (LBFGS decides alike everywhere)."""),
    ContractName("distributed_loader", "(loader_or_dataset, *, evaluation=False)", """
        Each rank reads a disjoint shard, batch size / shuffle / drop_last / collate kept, the epoch
        advanced on every new iteration. ``evaluation=True`` shards without padding, so metrics summed
        with ``all_reduce(..., op="sum")`` are exact."""),
    ContractName("shard", "(sequence)", """
        This rank's contiguous part of any indexable (for scripts that batch by hand); the first ranks
        take one more when it does not split evenly."""),
    ContractName("per_rank_batch_size", "(global_batch_size) -> int", """
        The ``--batch global`` policy: ``global_batch_size // world_size()``; raises if not divisible."""),
    ContractName("scale_lr", "(lr, rule='linear') -> float", """
        The ``--scale-lr`` policy: ``lr * N`` (``"linear"``), ``lr * sqrt(N)`` (``"sqrt"``) or ``lr``
        (``"none"``)."""),
    ContractName("all_reduce", "(value, op='mean')", """
        ``op`` is ``"mean"``, ``"sum"``, ``"max"``, ``"min"`` or ``"product"``. Like every collective
        here, accepts framework tensors and plain Python numbers and returns the same kind."""),
    ContractName("all_gather", "(value)", """
        Tensors concatenated along dim 0 in rank order (sizes may differ); other objects as a list."""),
    ContractName("broadcast", "(value, src=0)", "Rank ``src``'s value on every rank."),
    ContractName("barrier", "() -> None", "Every rank waits until all have arrived."),
    ContractName("save", "(obj, path) -> None", """
        Rank 0 writes atomically (:mod:`dpmigrate.runtime.atomic`: a private temporary file, fsync,
        rename), then all ranks meet; every rank must call it. A wrapped model, as ``obj`` or as a value
        of a top-level dict/list/tuple, is saved as :func:`unwrap` gives it."""),
    ContractName("print", "(*args, **kwargs) -> None", "``print``, only on the main process."),
    ContractName("main_process_first", "(local=True)", """
        Context manager: the main process (of each node when ``local``) runs the block first
        (downloads, caches), then the others."""),
    ContractName("scope", "()", "TF's strategy scope; a no-op context elsewhere."),
    ContractName("shutdown", "() -> None", "Ends the engine cleanly; registered at exit by ``init``; safe twice."),
    ContractName("Role", Role, "Who this process is (:mod:`dpmigrate.runtime.role`)."),
    ContractName("Strategy", Strategy, """
        Framework-neutral knobs (:mod:`dpmigrate.runtime.strategy`), mapped onto native options."""),
    ContractName("UnsupportedStrategy", UnsupportedStrategy, """
        Raised for a Strategy knob a backend cannot honour; none is silently ignored."""),
)


def _listing(contract: tuple[ContractName, ...]) -> str:
    lines = ["", "The contract (identical in every backend)", "-----------------------------------------"]
    for entry in contract:
        lines.append(f"``{entry.synopsis()}``")
        lines.extend("    " + line.strip() for line in entry.doc.strip().splitlines())
    return "\n".join(lines) + "\n"


__doc__ = (__doc__ or "") + _listing(CONTRACT)
