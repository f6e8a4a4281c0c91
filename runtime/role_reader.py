"""read_role: which launcher started this process, and so who it is in the job.

One small reader per launcher (:mod:`dpmigrate.runtime.launchers`) answers the same two questions,
as Lightning Fabric's cluster environments do: ``detect(env)``, were we started by it, and
``read(env)``, the validated :class:`~dpmigrate.runtime.role.Role`. They are tried in this order
(:data:`~dpmigrate.runtime.launchers.LAUNCHERS`), the first detected wins:

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

This module sits above both :mod:`~dpmigrate.runtime.role` (the data) and
:mod:`~dpmigrate.runtime.launchers` (the readers, which build Roles), so neither imports the other back.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .launchers import LAUNCHERS
from .role import Role


def read_role(environ: Mapping[str, str] | None = None) -> Role:
    """Read the Role from ``environ`` (default ``os.environ``); raise LaunchEnvironmentError.

    Pure: reads the mapping, changes nothing, imports no framework; cheap enough to call per use.
    """
    env = os.environ if environ is None else environ
    for launcher in LAUNCHERS:
        if launcher.detect(env):
            return launcher.read(env)
    return Role()
