"""Several nodes of TensorFlow workers from ``--master`` alone: the workers meet at dpmigrate's own rendezvous.

    python -m dpmigrate.launch.tensorflow_nodes serve          (node 0: the master's store, until stopped)

TensorFlow has no rendezvous: ``MultiWorkerMirroredStrategy`` reads every worker's ``host:port`` from
``TF_CONFIG``. Before, ``--hosts H0,H1,...`` had to list every node; now each worker tells the others where
it listens through the store Paddle's several-node jobs already use (:class:`.paddle_nodes.MasterStore`:
node 0 serves it on the master address and port only, answering only for keys under the run id, the
nodes' shared secret), then writes its ``TF_CONFIG`` from what every worker said:

- node 0's launcher runs ``serve`` as a service of its job (stopped when node 0's workers are done);
- every worker (:mod:`.tensorflow_worker`, before the script starts) posts
  ``/<run id>/tensorflow/<rank>`` = its ``host:port`` (this node's address towards the master, the
  master port + 1 + its local rank: the master port itself is the store's) and reads
  ``/<run id>/tensorflow/`` until every rank of every node is there;
- if that does not happen within ``--start-timeout``, the worker exits naming the master it tried and
  the nodes and ranks that never arrived (or that the master never answered).

The details travel in the environment (``DPMIGRATE_TF_MEET``, a JSON object), never on command lines:
the run id is a secret and other users can read a process's arguments. ``--hosts`` still overrides all
of this (every worker then listens on ``Hi:PORT+j``, as before). Standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request

from .paddle_nodes import HTTP_TIMEOUT_S, MasterStore

VARIABLE = "DPMIGRATE_TF_MEET"
POLL_S = 0.2
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an HTTP proxy


def endpoint(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def meeting_env(*, master: tuple[str, int], run_id: str, nnodes: int, nproc: int, host: str, port: int) -> str:
    """The value of :data:`VARIABLE` for a worker listening at ``host:port``."""
    return json.dumps({"master": endpoint(*master), "run_id": run_id, "nnodes": nnodes, "nproc": nproc,
                       "me": endpoint(host, port)})


def _ranks_of(nodes: list[int], nproc: int) -> str:
    ranks = [r for n in nodes for r in range(n * nproc, (n + 1) * nproc)]
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def cluster(meeting: dict, rank: int, timeout_s: float) -> list[str]:
    """Every worker's ``host:port`` in rank order, once all have said it (this one first says its own)."""
    master, run_id = meeting["master"], meeting["run_id"]
    total = meeting["nnodes"] * meeting["nproc"]
    prefix = f"/{run_id}/tensorflow/"
    deadline = time.monotonic() + timeout_s
    posted, reached, known = False, False, {}
    while True:
        if not posted:
            posted = _post(master, f"{prefix}{rank}", meeting["me"])
        if posted:
            reached = True
            found = _get(master, prefix)
            if found is not None:
                known = {int(k[len(prefix):]): v for k, v in found.items() if k[len(prefix):].isdigit()}
                if len(known) >= total:
                    return [known[r] for r in range(total)]
        if time.monotonic() > deadline:
            raise SystemExit(_never_met(meeting, rank, timeout_s, reached, known))
        time.sleep(POLL_S)


def _never_met(meeting: dict, rank: int, timeout_s: float, reached: bool, known: dict[int, str]) -> str:
    nproc, nnodes, master = meeting["nproc"], meeting["nnodes"], meeting["master"]
    node = rank // nproc
    if not reached:
        return (f"dpmigrate launch: worker {rank} (node {node}) could not reach the master {master} within "
                f"--start-timeout {timeout_s:g} s: node 0 ({_ranks_of([0], nproc)}) never arrived; start it with the "
                "same --master, or check the address and any firewall between the nodes")
    missing = [n for n in range(nnodes) if not all(r in known for r in range(n * nproc, (n + 1) * nproc))]
    nodes = ", ".join(map(str, missing))
    return (f"dpmigrate launch: node{'s' if len(missing) > 1 else ''} {nodes} ({_ranks_of(missing, nproc)}) never "
            f"arrived at the master {master} within --start-timeout {timeout_s:g} s (seen from worker {rank}); start "
            f"every node with the same --master, --nnodes {nnodes} and --run-id")


def _post(master: str, key: str, value: str) -> bool:
    request = urllib.request.Request(f"http://{master}{key}", data=value.encode(), method="POST")
    try:
        with _OPENER.open(request, timeout=HTTP_TIMEOUT_S) as reply:
            return reply.status == 200
    except (OSError, ValueError):
        return False


def _get(master: str, prefix: str) -> dict[str, str] | None:
    try:
        with _OPENER.open(f"http://{master}{prefix}", timeout=HTTP_TIMEOUT_S) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as e:
        return {} if e.code == 404 else None
    except (OSError, ValueError):
        return None


def serve(meeting: dict) -> int:
    """Node 0's store, on the master address only, until SIGTERM (the supervisor's, when the workers are done)."""
    host, _, port = meeting["master"].rpartition(":")
    try:
        store = MasterStore(host.strip("[]"), int(port), meeting["run_id"])
    except OSError as e:
        print(f"dpmigrate launch: cannot serve the workers' rendezvous at {meeting['master']} ({e.strerror or e}); "
              "pick a free --master port", file=sys.stderr, flush=True)
        return 1
    stopped = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopped.set())
    stopped.wait()
    store.close()
    return 0


def main(argv: list[str]) -> int:
    meeting = json.loads(os.environ.get(VARIABLE) or "{}")
    if argv[:1] != ["serve"] or not meeting:
        print(f"usage: {VARIABLE}=... python -m dpmigrate.launch.tensorflow_nodes serve (run by dpmigrate launch)",
              file=sys.stderr)
        return 2
    return serve(meeting)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
