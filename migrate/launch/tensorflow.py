"""The TensorFlow backend of ``dpmigrate launch``: TensorFlow has no launcher, so the supervisor starts the workers.

Every worker is ``python SCRIPT ARGS`` with a ``TF_CONFIG`` (``MultiWorkerMirroredStrategy`` reads it)
and the variables every rank gets (``with_common_env``), plus:

- ``DPMIGRATE_START_TIMEOUT`` = ``--start-timeout``: ``dpmigrate.runtime.tensorflow.init()`` gives up
  after that long if the workers have not all joined, naming the ones that never came up (a TF worker
  whose peer never starts waits forever and ignores SIGTERM, measured with TF 2.21);
- ``TF_USE_LEGACY_KERAS=1`` when tf-keras is installed and the user did not set it: Keras 3's
  ``model.fit`` fails under MultiWorkerMirroredStrategy in TF 2.21 (keras-team/keras#20585), tf-keras
  works; it must be set before TensorFlow is imported, so before the script starts. Not for a script
  that reads Keras 3-only APIs (``keras.ops``...): tf-keras has none of them.

One node (``--nnodes 1``, the default): N workers started by the supervisor itself (it sees each exit status, stops
the others when one fails and kills them, SIGKILL to their process groups, after ``PEER_GRACE_S``). A TF
worker's gRPC server listens on every interface (TF 2.21 hard-codes ``[::]``) without authentication,
so the workers run in a private network namespace with only loopback, and the ports are picked there by
the OS: :mod:`.tensorflow_worker` (rank 0 makes the namespace, the others join it, then each becomes the
script with its TF_CONFIG). Nothing of the job is reachable from the network, and no port is guessed.

Several nodes (``--nnodes M --node-rank R --master HOST:PORT``): this node's ``-n`` workers, each
with a ``TF_CONFIG`` listing every node's workers. Node 0 serves a rendezvous on the master address and
port (:mod:`.tensorflow_nodes`); each worker says there where it listens (this node's address towards the
master, chosen by :mod:`.network` or ``--iface``, port ``PORT + 1 + j`` for its local worker ``j``) and
builds its ``TF_CONFIG`` once every worker has. ``--hosts H0,H1,...`` overrides it: node ``i`` at ``Hi``
(node 0 at the ``--master`` host), local worker ``j`` on port ``PORT + j``, nothing served. TensorFlow
cannot be told to listen on this node's address only; the bind guard (:mod:`.bind_guard`, preloaded by the
launcher) turns its ``[::]`` bind into that address. Its servers have no authentication either way: the
nodes must share a trusted network.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

from . import tensorflow_nodes
from .backend import Job, Plan, Process

PEER_GRACE_S = 3  # after a worker failed: the others' time to stop on SIGTERM (a TF worker in a collective ignores
# it) before their process groups get SIGKILL
GRACE_S = 5


def unavailable() -> str | None:
    """Why TensorFlow jobs cannot run here, or None. Finds tensorflow without importing it."""
    if importlib.util.find_spec("tensorflow") is None:
        return (f"tensorflow is not installed for {sys.executable}; install it (pip install 'dpmigrate[tensorflow]') "
                "or run dpmigrate from the environment the script trains in")
    return None


def job_file(job: Job):
    """Where rank 0 tells the other workers its namespace and the ports (private, in the log dir)."""
    return job.log_dir / f"tensorflow-job-{job.run_id}.json"


def _shared_env(job: Job) -> dict[str, str]:
    env = {"DPMIGRATE_START_TIMEOUT": f"{job.start_timeout_s:g}"}
    if "TF_USE_LEGACY_KERAS" not in os.environ and importlib.util.find_spec("tf_keras") is not None and \
            not uses_keras3_only(job.script):
        env["TF_USE_LEGACY_KERAS"] = "1"
    return env


_KERAS3_ONLY = re.compile(rb"\bkeras\.(ops|random|distribution|tree|config)\b|\bPyDataset\b"
                          rb"|\bKERAS_BACKEND\b(?![^\n]*tensorflow)|\bfrom\s+keras\s+import\s+[^\n]*\b(ops|random)\b")


def uses_keras3_only(script) -> bool:
    """The script reads Keras 3-only APIs (``keras.ops``, ``keras.random``, ``PyDataset``, ``KERAS_BACKEND`` set to
    another backend than TensorFlow):
    tf-keras has none of them, so its workers keep Keras 3 (its custom loops run; its ``fit`` is declined by
    the converter, and refused under the strategy with the reason)."""
    try:
        return bool(_KERAS3_ONLY.search(Path(script).read_bytes()))
    except OSError:
        return False


def plan(job: Job) -> Plan:
    return _one_node(job) if job.nnodes == 1 else _several_nodes(job)


def _one_node(job: Job) -> Plan:
    n, shared = job.nproc_per_node, _shared_env(job)
    ranks = tuple(
        Process(f"rank{r}", (sys.executable, "-m", "dpmigrate.launch.tensorflow_worker", str(job_file(job)), str(r),
                             str(n), str(job.script), *job.script_args), dict(shared), "rank", rank=r)
        for r in job.ranks)
    return Plan(processes=ranks, grace_s=GRACE_S, peer_grace_s=PEER_GRACE_S, private_files=(job_file(job),))


def cluster(job: Job) -> list[str]:
    """Every worker's ``host:port`` in rank order, for several nodes."""
    host, port = job.master
    hosts = list(job.hosts) if job.hosts else []
    if len(hosts) != job.nnodes:
        raise ValueError(f"--hosts lists {len(hosts)} host(s) for --nnodes {job.nnodes}")
    hosts[0] = host
    if job.network is not None:
        hosts[job.node_rank] = job.network.local_ip
    return [f"[{h}]:{port + j}" if ":" in h else f"{h}:{port + j}" for h in hosts for j in range(job.nproc_per_node)]


def _several_nodes(job: Job) -> Plan:
    if not job.hosts:
        return _meeting_at_the_master(job)
    workers, shared = cluster(job), _shared_env(job)
    processes = tuple(
        Process(f"rank{r}", (sys.executable, "-m", "dpmigrate.launch.tensorflow_worker", "-", str(r), str(job.nproc_per_node),
                             str(job.script), *job.script_args),
                {**shared, "TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                                    "task": {"type": "worker", "index": r}})}, "rank", rank=r)
        for r in job.ranks)
    return Plan(processes=processes, grace_s=GRACE_S, peer_grace_s=PEER_GRACE_S)


def _meeting_at_the_master(job: Job) -> Plan:
    """``--master`` alone: every worker says where it listens at the master's rendezvous (:mod:`.tensorflow_nodes`,
    served by node 0) and writes its TF_CONFIG from what all said."""
    host, port = job.master
    master_ip = job.network.master_ip if job.network is not None else host
    local_ip = job.network.local_ip if job.network is not None else host
    shared = _shared_env(job)

    def meeting(worker_port: int) -> str:
        return tensorflow_nodes.meeting_env(master=(master_ip, port), run_id=job.run_id, nnodes=job.nnodes,
                                            nproc=job.nproc_per_node, host=local_ip, port=worker_port)

    processes = [
        Process(f"rank{r}", (sys.executable, "-m", "dpmigrate.launch.tensorflow_worker", "meet", str(r),
                             str(job.nproc_per_node), str(job.script), *job.script_args),
                {**shared, tensorflow_nodes.VARIABLE: meeting(port + 1 + j)}, "rank", rank=r)
        for j, r in enumerate(job.ranks)]
    if job.node_rank == 0:
        processes.insert(0, Process("rendezvous", (sys.executable, "-m", "dpmigrate.launch.tensorflow_nodes", "serve"),
                                    {tensorflow_nodes.VARIABLE: meeting(port)}, "service"))
    return Plan(processes=tuple(processes), grace_s=GRACE_S, peer_grace_s=PEER_GRACE_S)


def split_rank(line: str) -> tuple[int | None, str]:
    """No framework launcher: never called (the supervisor prefixes the workers' lines itself)."""
    return None, line


def trim_traceback(held: list[str]) -> list[str]:
    return held
