"""Serve the one-node job's TCPStore on the loopback socket ``dpmigrate launch`` hands over.

    DPMIGRATE_LISTEN_FD=<fd> python -m dpmigrate.launch.torch_store

Why: a script that calls ``init_process_group()`` itself uses env://, where rank 0 would start a
TCPStore listening on every interface (torch's TCPStore has no bind-address option). Under
``dpmigrate launch`` the ranks get ``TORCHELASTIC_USE_AGENT_STORE=True`` instead, so every rank is a
client, and this process is the server: torch's ``master_listen_fd`` makes it serve on the socket the
supervisor already bound to 127.0.0.1 and passed down. The ranks may connect before the store is up
(the kernel queues them on the listening socket). It serves until SIGTERM, and dies with the launcher.
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import sys


def main() -> int:
    fd = int(os.environ["DPMIGRATE_LISTEN_FD"])
    with socket.socket(fileno=os.dup(fd)) as sock:
        host, port = sock.getsockname()[:2]
    if host != "127.0.0.1":
        print(f"dpmigrate launch: refusing to serve the store on {host}:{port}, off loopback", file=sys.stderr)
        return 2
    from torch.distributed import TCPStore

    store = TCPStore(host, port, None, True, datetime.timedelta(days=365), wait_for_workers=False,  # noqa: F841
                     master_listen_fd=fd)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
