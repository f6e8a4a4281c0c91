"""End a TensorFlow worker that waits forever for peers that never come, and say which never came.

Why a separate process: measured with TensorFlow 2.21, a worker whose peers never start blocks inside
``MultiWorkerMirroredStrategy()`` (the coordination service waits for every task to register; the
leader's wait has no deadline, ``cluster_register_timeout_in_ms`` notwithstanding), holding the GIL: no
Python thread, signal handler or ``SIGTERM`` gets a turn. So ``init()`` starts this small watcher
(standard library only) before it builds the strategy and tells it when every worker has met. If
that does not happen within the start timeout, the watcher checks which peers' gRPC ports answer,
prints one line naming the workers that never came up, and kills the worker with SIGKILL, the only
signal it cannot ignore. If the worker exits first, the watcher sees its pipe close and leaves.

    python -m dpmigrate.runtime._tf_watchdog PID TIMEOUT_S RANK WORKERS_JSON
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys


class Watchdog:
    """The watcher of one ``init()``: started before the wait, ``done()`` once every worker has met."""

    def __init__(self, timeout_s: float, rank: int, workers: list[str]):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dpmigrate.runtime._tf_watchdog", str(os.getpid()), f"{timeout_s:g}", str(rank),
             json.dumps(workers)], stdin=subprocess.PIPE, close_fds=True)

    def done(self) -> None:
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.write(b"ok\n")
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _answers(endpoint: str) -> bool:
    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except (OSError, ValueError):
        return False


def describe_missing(rank: int, workers: list[str]) -> str:
    """Which peers never came up: those whose gRPC port nothing listens on (a started worker listens)."""
    missing = [f"worker {i} ({w})" for i, w in enumerate(workers) if i != rank and not _answers(w)]
    if missing:
        return f"{', '.join(missing)} never came up: nothing listens there"
    return ("every peer's port answers, but they did not all join the cluster (a peer may be stuck before its "
            "first collective, or belong to another job)")


def main(argv: list[str]) -> int:
    pid, timeout_s, rank, workers = int(argv[0]), float(argv[1]), int(argv[2]), json.loads(argv[3])
    ready, _, _ = select.select([sys.stdin], [], [], timeout_s)
    if ready:  # "ok" (every worker met) or end of file (the worker exited): nothing to do
        return 0
    line = (f"dpmigrate: worker {rank} waited {timeout_s:g} s for the other workers to join and gave up: "
            f"{describe_missing(rank, workers)}. Start every worker (dpmigrate launch does), check the addresses "
            "in TF_CONFIG and that their ports are reachable from here, or raise --start-timeout "
            "(DPMIGRATE_START_TIMEOUT).")
    print(line, file=sys.stderr, flush=True)
    try:
        os.kill(pid, signal.SIGKILL)  # a TF worker waiting for its peers ignores SIGTERM
    except ProcessLookupError:
        pass
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
