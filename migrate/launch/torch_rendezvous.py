"""torchrun with dpmigrate's static rendezvous: the master's store on one address, and no silent wait.

    python -m dpmigrate.launch.torch_rendezvous TORCHRUN_ARGS... --rdzv-backend dpmigrate-static
        --rdzv-endpoint HOST:PORT --rdzv-conf rank=R,bind=IP,start_timeout=S,nproc=N

Why not torchrun's own ``static`` backend (torch 2.13, ``static_tcp_rendezvous.py``):
- its TCPStore on node 0 listens on every interface of the machine (TCPStore has no bind address);
- a node waits for the others with the store's timeout, 600 s unless ``--rdzv-conf timeout=`` says
  otherwise, and says nothing meanwhile; when it gives up, torch's message does not say which nodes
  never came (node 1 whose master never started waited silently for over 5 minutes, issue 12).
This backend is the same rendezvous (node rank as given, one TCPStore at the master served by node 0's
agent, keys prefixed with the run id, the store handed to the ranks: ``use_agent_store``), registered
under its own name through torch's documented ``rendezvous_handler_registry``, with two differences:
- node 0 serves the store on a socket bound to ``bind`` only (torch's ``master_listen_fd``);
- every node writes ``dpmigrate/arrived/<node>`` and waits for all of them until ``start_timeout``
  seconds after this process started; then it exits (code 1) with one line naming the master address
  tried and the nodes (and their ranks) that never arrived. After the meeting the store's timeout
  goes back to torch's 600 s for the agent's later waits (its exit barrier has its own).
"""

from __future__ import annotations

import time

STARTED = time.time()  # the start timeout counts from here: before torch's import, which can take seconds

import datetime  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402

BACKEND_NAME = "dpmigrate-static"
ARRIVED = "dpmigrate/arrived/"
AFTER_MEETING_TIMEOUT_S = 600  # torch's static rendezvous default, for the agent's waits after the meeting
POLL_S = 0.1


class StartFailed(Exception):
    """The nodes did not all meet at the master within the start timeout (the message says which)."""


def main(argv: list[str]) -> int:
    from torch.distributed import run
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry

    rendezvous_handler_registry.register(BACKEND_NAME, create_handler)
    try:
        run.main(argv)
    except StartFailed as e:
        print(f"dpmigrate launch: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


def create_handler(params):
    from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

    host, port = parse_rendezvous_endpoint(params.endpoint, -1)
    config = params.config
    return _handler_class()(host, port, node=int(config["rank"]), nnodes=params.max_nodes, run_id=params.run_id,
                            bind=str(config["bind"]), start_timeout_s=float(config["start_timeout"]),
                            nproc=int(config["nproc"]))


def _handler_class():
    from torch.distributed import DistError, PrefixStore, TCPStore
    from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousInfo, RendezvousStoreInfo

    class DpmigrateStaticRendezvous(RendezvousHandler):
        def __init__(self, host: str, port: int, *, node: int, nnodes: int, run_id: str, bind: str,
                     start_timeout_s: float, nproc: int):
            self.host, self.port, self.node, self.nnodes, self.run_id = host, port, node, nnodes, run_id
            self.bind, self.start_timeout_s, self.nproc = bind, start_timeout_s, nproc
            self.deadline = STARTED + start_timeout_s
            self._store = None
            self._listener: socket.socket | None = None  # node 0: kept open while the store serves on it

        def get_backend(self) -> str:
            return BACKEND_NAME

        @property
        def use_agent_store(self) -> bool:
            return True

        def next_rendezvous(self):
            if self._store is None:
                self._store = self._connect()
            store = PrefixStore(self.run_id, self._store)
            store.set(f"{ARRIVED}{self.node}", "1")
            self._wait_for_every_node(store)
            self._store.set_timeout(datetime.timedelta(seconds=AFTER_MEETING_TIMEOUT_S))
            return RendezvousInfo(store, self.node, self.nnodes, RendezvousStoreInfo(self.host, self.port))

        def _remaining(self) -> datetime.timedelta:
            return datetime.timedelta(seconds=max(1.0, self.deadline - time.time()))

        def _connect(self):
            if self.node == 0:
                self._listener = _listen(self.bind, self.port, self.master)
                return TCPStore(self.host, self.port, None, True, self._remaining(), wait_for_workers=False,
                                master_listen_fd=self._listener.fileno())
            last = self._wait_until_the_master_listens()
            if last is None:
                try:
                    return TCPStore(self.host, self.port, None, False, self._remaining())
                except DistError as e:
                    last = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise StartFailed(
                f"node {self.node} could not reach the master {self.master} within --start-timeout "
                f"{self.start_timeout_s:g} s: node 0 ({self._ranks_of([0])}) never arrived; start it with the "
                f"same --master, or check the address and any firewall between the nodes (last error: {last})")

        def _wait_until_the_master_listens(self) -> str | None:
            """Probe the master with plain connects until it accepts one or the deadline passes (torch's
            TCPStore client retries with growing delays that can overshoot it, and logs each retry with a
            C++ stack): None once it listens, else the last error."""
            while True:
                left = self.deadline - time.time()
                try:
                    with socket.create_connection((self.host, self.port), timeout=max(0.2, min(left, 2.0))):
                        return None
                except OSError as e:
                    last = e.strerror or str(e) or type(e).__name__
                if self.deadline - time.time() <= 0:
                    return last
                time.sleep(min(0.5, max(0.0, self.deadline - time.time())))

        def _wait_for_every_node(self, store) -> None:
            keys = [f"{ARRIVED}{n}" for n in range(self.nnodes)]
            while True:
                missing = [n for n, key in enumerate(keys) if not store.check([key])]
                if not missing:
                    return
                if time.time() >= self.deadline:
                    nodes = ", ".join(map(str, missing))
                    raise StartFailed(
                        f"node{'s' if len(missing) > 1 else ''} {nodes} ({self._ranks_of(missing)}) never arrived "
                        f"at the master {self.master} within --start-timeout {self.start_timeout_s:g} s "
                        f"(seen from node {self.node}); start every node with the same --master, --nnodes "
                        f"{self.nnodes} and --run-id")
                time.sleep(POLL_S)

        @property
        def master(self) -> str:
            return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

        def _ranks_of(self, nodes: list[int]) -> str:
            ranks = [r for n in nodes for r in range(n * self.nproc, (n + 1) * self.nproc)]
            return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(map(str, ranks))

        def is_closed(self) -> bool:
            return False

        def set_closed(self) -> None:
            pass

        def num_nodes_waiting(self) -> int:
            return 0

        def get_run_id(self) -> str:
            return self.run_id

        def shutdown(self) -> bool:
            return True

    return DpmigrateStaticRendezvous


def _listen(address: str, port: int, shown: str) -> socket.socket:
    """Node 0: a TCP socket listening on ``address`` only, for the store (``SO_REUSEADDR`` as torch's own)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise StartFailed(f"node 0 cannot serve the rendezvous on {shown} ({e.strerror or e}): the --master "
                          "address must be one of node 0's own and the port free") from None
    return sock


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
