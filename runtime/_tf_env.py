"""TF_CONFIG from the shared Role, and the environment facts the TensorFlow backend checks before it starts.

``tf.distribute.MultiWorkerMirroredStrategy`` reads only ``TF_CONFIG``: every worker's ``host:port``
(each worker's gRPC server listens on its own entry's port) and this task's index. Other launchers
describe the job differently, so :func:`cluster_for` writes the TF_CONFIG they imply:

- ``TF_CONFIG`` already set (a cluster manager, ``dpmigrate launch``): used as it is;
- Paddle's launcher: ``PADDLE_TRAINER_ENDPOINTS`` already lists every worker's ``host:port``, in rank order;
- Slurm: the step's node list and tasks per node give each rank's host (block placement, as srun's
  default); worker ``r`` listens on ``MASTER_PORT + 1 + local rank`` of its node;
- torchrun / env:// / Open MPI on one node (``LOCAL_WORLD_SIZE`` = world size): every worker on
  ``MASTER_ADDR``, worker ``r`` on ``MASTER_PORT + 1 + r`` (``MASTER_PORT`` itself stays free for
  torchrun's own store);
- the same on several nodes: refused with the fix, since those variables do not say where the other
  nodes' workers are.

Standard library only (no TensorFlow): importable and testable without it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from .common import seconds_from_environment
from .hostlist import expand_hostlist, expand_tasks_per_node
from .role import LaunchEnvironmentError, Role

START_TIMEOUT_VARIABLE = "DPMIGRATE_START_TIMEOUT"  # set by `dpmigrate launch --start-timeout S`
LEGACY_KERAS_VARIABLE = "TF_USE_LEGACY_KERAS"


def _endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def cluster_for(role: Role, environ: Mapping[str, str] | None = None) -> dict | None:
    """The TF_CONFIG (as a dict) this worker needs, or None when there is nothing to write
    (one process, or the launcher set TF_CONFIG itself)."""
    env = os.environ if environ is None else environ
    if role.world_size == 1 or role.launcher == "tf_config":
        return None
    if role.launcher == "paddle":
        workers = [item.strip() for item in env.get("PADDLE_TRAINER_ENDPOINTS", "").split(",") if item.strip()]
    elif role.launcher == "slurm":
        workers = _slurm_workers(role, env)
    elif role.num_nodes == 1 and role.master_addr is not None and role.master_port is not None:
        workers = [_endpoint(role.master_addr, role.master_port + 1 + r) for r in range(role.world_size)]
    else:
        raise LaunchEnvironmentError(
            f"{role.describe()}: TensorFlow needs the address of every worker, and the {role.launcher} "
            "variables give only the master's. Start the workers with `dpmigrate launch` (it writes TF_CONFIG), "
            "with srun, or export TF_CONFIG yourself: "
            '{"cluster": {"worker": ["host0:port", "host1:port", ...]}, "task": {"type": "worker", "index": RANK}}',
            variable="TF_CONFIG", launcher=role.launcher)
    if len(workers) != role.world_size:
        raise LaunchEnvironmentError(
            f"{role.describe()}: found {len(workers)} worker address(es) ({', '.join(workers)}) for "
            f"{role.world_size} workers; export TF_CONFIG yourself", variable="TF_CONFIG", launcher=role.launcher)
    return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": role.rank}}


def _slurm_workers(role: Role, env: Mapping[str, str]) -> list[str]:
    names = ("SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST")
    hosts = next((expand_hostlist(env[n]) for n in names if env.get(n, "").strip()), [])
    counts_text = next((env[n] for n in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
                        if env.get(n, "").strip()), "")
    counts = expand_tasks_per_node(counts_text) if counts_text else [role.local_world_size] * role.num_nodes
    counts = counts * role.num_nodes if len(counts) == 1 else counts
    if not hosts or role.master_port is None or len(counts) != len(hosts[: len(counts)]):
        raise LaunchEnvironmentError(f"{role.describe()}: the Slurm node list or tasks per node are missing; "
                                     "export TF_CONFIG yourself", variable="SLURM_STEP_NODELIST", launcher="slurm")
    return [_endpoint(host, role.master_port + 1 + local) for host, n in zip(hosts, counts) for local in range(n)]


def workers_of(config: Mapping) -> list[str]:
    """Every task's ``host:port`` in rank order (chief first), from a TF_CONFIG dict."""
    cluster = config.get("cluster", {})
    return [*cluster.get("chief", []), *cluster.get("worker", [])]


def current_config(environ: Mapping[str, str] | None = None) -> dict:
    env = os.environ if environ is None else environ
    return json.loads(env["TF_CONFIG"])


def start_timeout(collective_timeout_s: float, environ: Mapping[str, str] | None = None) -> float:
    """How long ``init()`` waits for every worker: ``DPMIGRATE_START_TIMEOUT``, else the collective timeout."""
    return seconds_from_environment(START_TIMEOUT_VARIABLE, collective_timeout_s,
                                    "the seconds the workers have to meet, e.g. 60", environ)


def is_keras3_model(model) -> bool:
    """A Keras 3 model (``keras.src``), as opposed to tf-keras (``tf_keras``); no import needed."""
    return any(cls.__module__.startswith("keras.") for cls in type(model).__mro__ if cls.__name__ == "Model")


KERAS3_FIT_MESSAGE = (
    "Keras 3 model.{method}() does not work under tf.distribute.MultiWorkerMirroredStrategy in TensorFlow 2.21 "
    "(keras-team/keras#20585: 'Attempt to convert a value (PerReplica...)'). Run the workers with tf-keras: "
    "pip install --no-deps tf-keras==2.21.0 and export TF_USE_LEGACY_KERAS=1 before Python starts (dpmigrate "
    "launch sets it when tf-keras is installed), and import Keras as `from tensorflow import keras` (a bare "
    "`import keras` is always Keras 3). Custom training loops work with Keras 3 as they are."
)
