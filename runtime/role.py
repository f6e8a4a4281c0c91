"""Who this process is in the job, read from whichever launcher started it.

A ``Role`` is framework-free: the torch, TensorFlow and Paddle backends all start from it. One small
reader per launcher answers the same two questions (as Lightning Fabric's cluster environments do):
``detect(env)``, were we started by it, and ``read(env)``, the validated ``Role``. They are tried in
this order, the first detected wins (see :mod:`dpmigrate.runtime.launchers` for each one's variables):

1. ``torchrun`` -- torchrun / torch.distributed.run, or ``RANK`` + ``WORLD_SIZE`` exported by hand (env://)
2. ``paddle``   -- ``python -m paddle.distributed.launch`` (``PADDLE_TRAINER_ID``, ``PADDLE_TRAINERS_NUM``)
3. ``tf_config`` -- a ``TF_CONFIG`` JSON cluster spec (chief and workers)
4. ``openmpi``  -- ``mpirun`` of Open MPI (``OMPI_COMM_WORLD_*``)
5. ``slurm``    -- ``srun`` with more than one task (``SLURM_PROCID`` in a job step)
6. ``none``     -- rank 0 of 1: the script runs exactly as the single-process original

The order puts the launcher closest to the process first. ``srun torchrun ...`` gives every worker
both Slurm's variables (describing the one torchrun agent per node) and torchrun's (describing the
worker); the same holds for ``mpirun`` inside a Slurm allocation, whose daemons Open MPI starts with
``srun``, so Open MPI is tried before Slurm.

Every malformed value raises :class:`LaunchEnvironmentError` naming the variable, its value, the
launcher and the fix; never a bare ``KeyError`` or ``json.JSONDecodeError`` from deep inside ``init()``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping


class LaunchEnvironmentError(ValueError):
    """The launcher's environment is contradictory or malformed; the message names the variable.

    ``variable``, ``value`` and ``launcher`` carry the same facts for programs (``None`` if unknown).
    """

    def __init__(self, message: str, *, variable: str | None = None, value: str | None = None,
                 launcher: str | None = None):
        super().__init__(message)
        self.variable = variable
        self.value = value
        self.launcher = launcher


@dataclasses.dataclass(frozen=True)
class Role:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    launcher: str = "none"  # "torchrun", "paddle", "tf_config", "slurm", "openmpi", "none"

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_main_process(self) -> bool:
        return self.rank == 0

    @property
    def master_endpoint(self) -> str | None:
        """``"host:port"`` of the rendezvous (``"[::1]:29500"`` for IPv6), or None when there is none."""
        if self.master_addr is None or self.master_port is None:
            return None
        host = f"[{self.master_addr}]" if ":" in self.master_addr else self.master_addr
        return f"{host}:{self.master_port}"

    def describe(self) -> str:
        """One line for logs and error messages: who this process is and how it was started."""
        if self.launcher == "none":
            return "rank 0 of 1 (no launcher: a single process)"
        text = (
            f"rank {self.rank} of {self.world_size}, local rank {self.local_rank} of {self.local_world_size}"
            f" on node {self.node_rank} of {self.num_nodes}"
        )
        if self.master_endpoint is not None:
            text += f", master {self.master_endpoint}"
        return f"{text} (launcher: {self.launcher})"


def read_role(environ: Mapping[str, str] | None = None) -> Role:
    """Read the Role from ``environ`` (default ``os.environ``); raise LaunchEnvironmentError.

    Pure: reads the mapping, changes nothing, imports no framework; cheap enough to call per use.
    """
    from .launchers import LAUNCHERS  # the readers build Roles, so they import this module

    env = os.environ if environ is None else environ
    for launcher in LAUNCHERS:
        if launcher.detect(env):
            return launcher.read(env)
    return Role()
