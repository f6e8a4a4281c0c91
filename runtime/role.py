"""Who this process is in the job, read from whichever launcher started it.

A ``Role`` is framework-free: the torch, TensorFlow and Paddle backends all start from it. One small
reader per launcher answers the same questions (as Lightning Fabric's cluster environments do); the
first launcher whose variables are present wins. With no launcher the process is rank 0 of 1.
"""

from __future__ import annotations

import dataclasses


class LaunchEnvironmentError(ValueError):
    """The launcher's environment is contradictory or malformed; the message names the variable."""


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


def read_role(environ=None) -> Role:
    """Read the Role from ``environ`` (default ``os.environ``); raise LaunchEnvironmentError."""
    raise NotImplementedError  # being written (issue 2)
