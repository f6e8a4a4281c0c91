"""Several nodes under Paddle's launcher: dpmigrate serves the nodes' meeting point itself, on one address.

Paddle 3.3.1's ``python -m paddle.distributed.launch --master IP:PORT`` (HTTP mode) meets its peers
through a key-value store on the master: node 0's launcher starts ``KVServer(port)``, an HTTP server
bound to ``''`` (every interface, no option), unless something already answers at ``IP:PORT`` (it
probes with a connect first, then joins as a client). So on node 0, :mod:`.paddle_launcher` starts
:class:`MasterStore` before Paddle's launcher: the same protocol (GET a key prefix -> JSON of the
matching keys, or 404; POST/PUT a key; DELETE; ``/healthy`` -> ``ok``), bound to the master address
only, and answering only for keys under ``/<run id>/`` (the nodes' shared secret) and ``/healthy``.
Paddle's launcher on node 0 then finds it ready and becomes a participant like the others.

:class:`Meeting` watches that store from every node (node 0 in-process, the others over HTTP):
- start: the nodes have met when each node's launcher has written ``/<run id>/info/<pod>/<node rank>``;
  if that has not happened ``--start-timeout`` seconds after this node started, it says which master
  it tried and which nodes (and their ranks) never arrived, and the job on this node is stopped;
- run: each node publishes its ranks that failed by themselves (``/<run id>/dpmigrate/failed/<rank>``,
  from :mod:`.rank_status` files, with when it ended) and reads the others'. A rank of another node that
  failed before any rank of this node did is recorded for the final line once this node's ranks have all
  ended (:mod:`.diagnosis`: "it lost rank 1, on another node"); the ranks of this node get ``PEER_GRACE_S``
  to fail by themselves (a gloo collective with a dead peer fails at once), then the job on this node is
  stopped, so no node waits for gloo's 30 s or the TCPStore's 900 s.
Standard library only: importing it loads no framework.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from . import diagnosis, rank_status

PEER_GRACE_S = 3.0  # after a rank of another node failed, this node's ranks have this long to fail by themselves
HTTP_TIMEOUT_S = 2.0
REMOTE_POLL_S = 0.5  # how often a node other than 0 asks the master (node 0 reads its own store directly)


class _Handler(BaseHTTPRequestHandler):
    """Paddle's ``KVHandler`` protocol (paddle/distributed/launch/utils/kv_server.py), on the run's keys only."""

    server: MasterStore

    def do_GET(self) -> None:
        if self.path != "/healthy" and not self.server.allowed(self.path):
            self._reply(404)
            return
        found = self.server.prefix(self.path)
        self._reply(200, json.dumps(found).encode()) if found else self._reply(404)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if not self.server.allowed(self.path):
            self._reply(403)
            return
        self.server.put(self.path, body.decode("utf-8", "replace"))
        self._reply(200)

    do_PUT = do_POST

    def do_DELETE(self) -> None:
        removed = self.server.allowed(self.path) and self.server.delete(self.path)
        self._reply(200 if removed else 404)

    def _reply(self, code: int, body: bytes = b"") -> None:
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "application/json; charset=utf8")
        self.end_headers()
        if body:
            self.wfile.write(body)

    def log_message(self, *_args) -> None:  # Paddle's is silent too
        return


class MasterStore(ThreadingHTTPServer):
    """The nodes' meeting point, served by node 0 on ``(ip, port)`` only, from a thread of this process."""

    daemon_threads = True

    def __init__(self, ip: str, port: int, run_id: str):
        super().__init__((ip, port), _Handler)
        self.run_id = run_id
        self._lock = threading.Lock()
        self._kv: dict[str, str] = {"/healthy": "ok"}
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()

    def allowed(self, path: str) -> bool:
        return path.startswith(f"/{self.run_id}/")

    def prefix(self, path: str) -> dict[str, str]:
        with self._lock:
            return {k: v for k, v in self._kv.items() if k.startswith(path)}

    def put(self, path: str, value: str) -> None:
        with self._lock:
            self._kv[path] = value

    def delete(self, path: str) -> bool:
        with self._lock:
            return self._kv.pop(path, None) is not None

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class Meeting:
    """What one node knows of the others, from the master's store; :meth:`poll` says when to stop, and why."""

    def __init__(self, *, node: int, nnodes: int, nproc: int, master: tuple[str, int], run_id: str,
                 start_timeout_s: float, status_dir: Path, diagnosis_dir: Path | None, started: float,
                 store: MasterStore | None = None):
        self.node, self.nnodes, self.nproc, self.run_id = node, nnodes, nproc, run_id
        self.master, self.store = master, store
        self.deadline = started + start_timeout_s
        self.start_timeout_s = start_timeout_s
        self.status_dir, self.diagnosis_dir = status_dir, diagnosis_dir
        self.met = False
        self.reached = store is not None  # the master answered at least once
        self.published: set[int] = set()
        self.lost_elsewhere: dict[int, dict] = {}
        self.stop_at: float | None = None
        self._next_remote = 0.0

    @property
    def endpoint(self) -> str:
        host, port = self.master
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def my_ranks(self) -> tuple[int, ...]:
        return tuple(range(self.node * self.nproc, (self.node + 1) * self.nproc))

    def poll(self, now: float) -> str | None:
        """None while the job should go on; else the line that says why this node stops it."""
        if not self.met:
            return self._check_start(now)
        return self._check_peers(now)

    # --- start ------------------------------------------------------------------------------------

    def _check_start(self, now: float) -> str | None:
        info = self._get(f"/{self.run_id}/info/")
        if info is not None:
            self.reached = True
            arrived = {int(k.rsplit("/", 1)[1]) for k in info if k.rsplit("/", 1)[1].isdigit()}
            if arrived >= set(range(self.nnodes)):
                self.met = True
                return None
        else:
            arrived = set()
        if now < self.deadline:
            return None
        if not self.reached:
            return (f"dpmigrate launch: node {self.node} could not reach the master {self.endpoint} within "
                    f"--start-timeout {self.start_timeout_s:g} s: node 0 ({self._ranks_of([0])}) never arrived; "
                    "start it with the same --master, or check the address and any firewall between the nodes")
        missing = [n for n in range(self.nnodes) if n not in arrived]
        nodes = ", ".join(map(str, missing))
        return (f"dpmigrate launch: node{'s' if len(missing) > 1 else ''} {nodes} ({self._ranks_of(missing)}) never "
                f"arrived at the master {self.endpoint} within --start-timeout {self.start_timeout_s:g} s (seen from "
                f"node {self.node}); start every node with the same --master, --nnodes {self.nnodes} and --run-id")

    def _ranks_of(self, nodes: Iterable[int]) -> str:
        ranks = [r for n in nodes for r in range(n * self.nproc, (n + 1) * self.nproc)]
        if len(ranks) == 1:
            return f"rank {ranks[0]}"
        if ranks == list(range(ranks[0], ranks[-1] + 1)):
            return f"ranks {ranks[0]}-{ranks[-1]}"
        return "ranks " + ", ".join(map(str, ranks))

    # --- run ----------------------------------------------------------------------------------------

    def _check_peers(self, now: float) -> str | None:
        failed_here = [e for e in rank_status.read_statuses(self.status_dir, self.my_ranks).values() if e.failed]
        for exit_ in failed_here:
            if exit_.rank not in self.published:
                self._put(f"/{self.run_id}/dpmigrate/failed/{exit_.rank}", json.dumps(
                    {"rank": exit_.rank, "node": self.node, "how": exit_.describe(), "ended": exit_.ended,
                     "killed": exit_.returncode == -signal.SIGKILL}))
                self.published.add(exit_.rank)
        first_here = min((e.ended for e in failed_here), default=float("inf"))
        if self.store is None and now < self._next_remote:
            return self._stop_when_due(now)
        self._next_remote = now + REMOTE_POLL_S
        failed = self._get(f"/{self.run_id}/dpmigrate/failed/") or {}
        for value in failed.values():
            with contextlib.suppress(ValueError, KeyError, TypeError):
                data = json.loads(value)
                rank, ended = int(data["rank"]), float(data["ended"])
                if ended > first_here and not data.get("killed"):
                    continue  # it failed after a rank of this node did: lost because of this node, not the cause
                    # (unless killed from outside: then it is the cause, whenever its wrapper saw it die)
                if rank not in self.my_ranks and rank not in self.lost_elsewhere:
                    self.lost_elsewhere[rank] = data
                    if self.stop_at is None:
                        self.stop_at = now + PEER_GRACE_S
        return self._stop_when_due(now)

    def settle(self, now: float, wait_s: float = PEER_GRACE_S) -> None:
        """After this node's job failed: publish its failed ranks and, for up to ``wait_s``, look for the rank
        of another node whose loss made them fail (the other node may publish it a moment later)."""
        deadline = now + wait_s
        while True:
            self._next_remote = 0.0
            self._check_peers(now)
            if self.lost_elsewhere or now >= deadline or any(
                    e.failed and e.returncode == -signal.SIGKILL
                    for e in rank_status.read_statuses(self.status_dir, self.my_ranks).values()):
                return  # found it, gave up, or this node's own rank was killed from outside: the culprit is here
                # (not a SIGABRT: gloo aborts a rank whose peer on another node is gone)
            time.sleep(REMOTE_POLL_S)
            now = time.monotonic()

    def _stop_when_due(self, now: float) -> str | None:
        if self.stop_at is None or now < self.stop_at:
            return None
        lost = "; ".join(f"rank {r} failed on node {d.get('node')} ({d.get('how')})"
                         for r, d in sorted(self.lost_elsewhere.items()))
        return f"dpmigrate launch: {lost}; stopping the ranks of node {self.node}"

    def record_lost(self) -> None:
        """Once this node's ranks have all ended: for the final line (:mod:`.diagnosis`'s file, as the torch
        runtime writes it, found by this node's first rank), the ranks of other nodes that failed before any
        rank of this node did. Decided only now, from every status: when another node's failure was seen, a
        rank of this node may already have died without its status written yet (its wrapper still
        finishing), and then that failure is a consequence, not the cause."""
        if self.diagnosis_dir is None:
            return
        failed_here = [e for e in rank_status.read_statuses(self.status_dir, self.my_ranks).values() if e.failed]
        if any(e.returncode == -signal.SIGKILL for e in failed_here):
            return  # killed from outside (not asked to stop, and no rank kills itself so): the culprit is here,
            # whatever the clocks say (on a loaded machine its wrapper may see the death after the peer's abort)
        first_here = min((e.ended for e in failed_here), default=float("inf"))
        lost = sorted(r for r, data in self.lost_elsewhere.items()
                      if float(data["ended"]) <= first_here or data.get("killed"))  # (see _check_peers)
        if lost:
            by = self.my_ranks[0]
            with contextlib.suppress(OSError):
                rank_status._write_atomically(self.diagnosis_dir, f"lost-by-rank{by}.json",
                                              json.dumps({"rank": by, "lost": lost}))

    # --- the store ------------------------------------------------------------------------------------

    def _get(self, prefix: str) -> dict[str, str] | None:
        """The keys under ``prefix`` ({} if none); None if the master cannot be reached."""
        if self.store is not None:
            return self.store.prefix(prefix)
        try:
            with _OPENER.open(f"http://{self.endpoint}{prefix}", timeout=HTTP_TIMEOUT_S) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as e:
            return {} if e.code == 404 else None
        except (OSError, ValueError):
            return None

    def _put(self, key: str, value: str) -> None:
        if self.store is not None:
            self.store.put(key, value)
            return
        request = urllib.request.Request(f"http://{self.endpoint}{key}", data=value.encode(), method="POST")
        with contextlib.suppress(OSError), _OPENER.open(request, timeout=HTTP_TIMEOUT_S):
            pass


_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an HTTP proxy


def diagnosis_dir_from_env() -> Path | None:
    folder = os.environ.get(diagnosis.VARIABLE)
    return Path(folder) if folder else None
