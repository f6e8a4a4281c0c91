"""The process environment Paddle's collective engine reads, checked and completed before ``fleet.init``.

Why a module of its own: Paddle reads its launcher's variables straight from ``os.environ`` in C++
(``PADDLE_TRAINER_ID``, ``PADDLE_TRAINERS_NUM``, ``PADDLE_TRAINER_ENDPOINTS``, ``PADDLE_CURRENT_ENDPOINT``,
``PADDLE_MASTER`` for its TCPStore, ``PADDLE_DISTRI_BACKEND`` for gloo), so a process started another way
(torchrun-style ``RANK``/``WORLD_SIZE``/``MASTER_*``, Slurm, Open MPI, ``TF_CONFIG``) must be given them
from the shared :class:`~dpmigrate.runtime.role.Role` first. Three traps measured with Paddle 3.3.1:

- a CPU build started without Paddle's launcher has no collective backend unless
  ``PADDLE_DISTRI_BACKEND=gloo`` ("If you want to use CPU-only version, please use 'gloo' as backend");
- ``CUDA_VISIBLE_DEVICES=""`` (set, but empty) makes ``python -m paddle.distributed.launch`` die with
  ``IndexError: list index out of range`` in ``_build_pod_with_master``, and on a CUDA build leaves a
  process with no GPU at all: :func:`explain_empty_cuda_visible_devices` says so in words;
- ``PADDLE_TRAINER_ENDPOINTS`` must list one distinct ``host:port`` per rank even though the process
  group of dygraph mode only uses the first one (the TCPStore, run by rank 0).
Standard library only; the caller passes in what it learnt from Paddle (``compiled_with_cuda``).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from .role import LaunchEnvironmentError, Role

EMPTY_CUDA_VISIBLE_DEVICES = (
    "CUDA_VISIBLE_DEVICES is set to an empty string, so no GPU is visible to this process (Paddle's own "
    "launcher dies on it with IndexError: list index out of range in _build_pod_with_master). Unset it "
    "(`unset CUDA_VISIBLE_DEVICES`, or `env -u CUDA_VISIBLE_DEVICES ...`) to train on the GPUs, or start the "
    "job with `dpmigrate launch`, which removes an empty value and trains on the CPU with gloo"
)


def cuda_visible_devices_is_empty(environ: MutableMapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return "CUDA_VISIBLE_DEVICES" in env and not env["CUDA_VISIBLE_DEVICES"].strip()


def explain_empty_cuda_visible_devices(compiled_with_cuda: bool,
                                       environ: MutableMapping[str, str] | None = None) -> str | None:
    """The message for an empty ``CUDA_VISIBLE_DEVICES`` where it breaks a job (a CUDA build), else None.

    A CPU build trains on gloo whatever the variable says, so there it is harmless."""
    if compiled_with_cuda and cuda_visible_devices_is_empty(environ):
        return EMPTY_CUDA_VISIBLE_DEVICES
    return None


def complete_environment(role: Role, *, gpu: bool, environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Give Paddle the variables it reads for ``role``; returns the names set (an existing value wins).

    Under Paddle's launcher everything is there already except, for a process started by hand on CPU,
    the backend. For any other launcher the rank, world size and endpoints come from the Role: the
    master endpoint is the TCPStore rank 0 serves (under torchrun, whose agent store holds MASTER_PORT,
    the port after it); the other endpoints are placeholders (dygraph process groups never listen on
    them), made distinct so Paddle's checks pass.
    """
    env = os.environ if environ is None else environ
    wanted: dict[str, str] = {}
    if not gpu:
        wanted["PADDLE_DISTRI_BACKEND"] = "gloo"
    if role.launcher != "paddle" and role.world_size > 1:
        if role.master_endpoint is None:
            raise LaunchEnvironmentError(
                f"{role.describe()}: no master address, so the ranks cannot meet; export MASTER_ADDR=<host of "
                "rank 0> MASTER_PORT=<free port>", variable="MASTER_ADDR", launcher=role.launcher)
        host, port = role.master_addr, role.master_port
        if role.launcher == "torchrun":
            port += 1  # torchrun's own agent store already listens on MASTER_PORT; Paddle's takes the next
        endpoints = [f"{host}:{port + r}" for r in range(role.world_size)]
        master = endpoints[0] if ":" not in host else f"[{host}]:{port}"
        wanted.update({
            "PADDLE_TRAINER_ID": str(role.rank), "PADDLE_TRAINERS_NUM": str(role.world_size),
            "PADDLE_TRAINER_ENDPOINTS": ",".join(endpoints), "PADDLE_CURRENT_ENDPOINT": endpoints[role.rank],
            "PADDLE_MASTER": master, "PADDLE_LOCAL_RANK": str(role.local_rank),
            "PADDLE_RANK_IN_NODE": str(role.local_rank), "PADDLE_LOCAL_SIZE": str(role.local_world_size),
            "PADDLE_NNODES": str(role.num_nodes), "FLAGS_selected_gpus": str(role.local_rank),
        })
        if not gpu:
            del wanted["FLAGS_selected_gpus"]
    set_now = [name for name in wanted if not env.get(name)]
    for name in set_now:
        env[name] = wanted[name]
    return set_now
