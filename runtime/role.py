"""Who this process is in the job: the framework-free ``Role`` every backend starts from.

A ``Role`` is plain data: the torch, TensorFlow and Paddle backends all start from it. It is read from
the launcher's environment by :func:`dpmigrate.runtime.read_role` (:mod:`dpmigrate.runtime.role_reader`,
which tries the launchers of :mod:`dpmigrate.runtime.launchers` in a documented order).

Every malformed value raises :class:`LaunchEnvironmentError` naming the variable, its value, the
launcher and the fix; never a bare ``KeyError`` or ``json.JSONDecodeError`` from deep inside ``init()``.
This module imports nothing of the runtime, so the launcher readers can build Roles without a loop.
"""

from __future__ import annotations

import dataclasses


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
