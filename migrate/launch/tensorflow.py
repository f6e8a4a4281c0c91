"""The TensorFlow backend of ``dpmigrate launch``: TensorFlow has no launcher, so the supervisor starts the workers.

Every worker is ``python SCRIPT ARGS`` with a ``TF_CONFIG`` (``MultiWorkerMirroredStrategy`` reads it)
and the variables every rank gets (``with_common_env``), plus:

- ``DPMIGRATE_START_TIMEOUT`` = ``--start-timeout``: ``dpmigrate.runtime.tensorflow.init()`` gives up
  after that long if the workers have not all joined, naming the ones that never came up (a TF worker
  whose peer never starts waits forever and ignores SIGTERM, measured with TF 2.21);
- ``TF_USE_LEGACY_KERAS=1`` when tf-keras is installed and the user did not set it: Keras 3's
  ``model.fit`` fails under MultiWorkerMirroredStrategy in TF 2.21 (keras-team/keras#20585), tf-keras
  works; it must be set before TensorFlow is imported, so before the script starts.

One node (``--nnodes 1``, the default): N workers started by the supervisor itself (it sees each exit status, stops
the others when one fails and kills them, SIGKILL to their process groups, after ``PEER_GRACE_S``). A TF
worker's gRPC server listens on every interface (TF 2.21 hard-codes ``[::]``) without authentication,
so the workers run in a private network namespace with only loopback, and the ports are picked there by
the OS: :mod:`.tensorflow_worker` (rank 0 makes the namespace, the others join it, then each becomes the
script with its TF_CONFIG). Nothing of the job is reachable from the network, and no port is guessed.

Several nodes (``--nnodes M --node-rank R --master HOST:PORT --hosts H0,H1,...``): this node's
``-n`` workers, ``TF_CONFIG`` listing every node's workers: node ``i`` at ``Hi`` (node 0 at the
``--master`` host), its local worker ``j`` on port ``PORT + j``; identical on every node but for the task
index. This node's own entries use the address the launcher chose towards the master (:mod:`.network`,
``--iface`` overrides). TensorFlow cannot be told to listen on that address only; the bind guard
(:mod:`.bind_guard`, preloaded by the launcher) turns its ``[::]`` bind into that address. Its servers
have no authentication either way: the nodes must share a trusted network.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

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
    if "TF_USE_LEGACY_KERAS" not in os.environ and importlib.util.find_spec("tf_keras") is not None:
        env["TF_USE_LEGACY_KERAS"] = "1"
    return env


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
    workers, shared = cluster(job), _shared_env(job)
    processes = tuple(
        Process(f"rank{r}", (sys.executable, "-m", "dpmigrate.launch.tensorflow_worker", "-", str(r), str(job.nproc_per_node),
                             str(job.script), *job.script_args),
                {**shared, "TF_CONFIG": json.dumps({"cluster": {"worker": workers},
                                                    "task": {"type": "worker", "index": r}})}, "rank", rank=r)
        for r in job.ranks)
    return Plan(processes=processes, grace_s=GRACE_S, peer_grace_s=PEER_GRACE_S)


def split_rank(line: str) -> tuple[int | None, str]:
    """No framework launcher: never called (the supervisor prefixes the workers' lines itself)."""
    return None, line


def trim_traceback(held: list[str]) -> list[str]:
    return held
