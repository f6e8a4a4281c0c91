"""Is the ``--master`` port free on node 0? Asked before anything starts, answered in one line.

Why: on node 0, torchrun's rendezvous serves its TCPStore on the master port (on the master address:
:mod:`.torch_rendezvous`). When something already listens there, the job would fail only once torch is
loaded (with torch's own static rendezvous, a 40-line traceback ending in ``EADDRINUSE``). A bind test first
(the same wildcard addresses, with ``SO_REUSEADDR`` as the store sets it, so a port whose old
connections linger in TIME_WAIT is not called busy) turns that into one line naming the address and a
port that is free now. The test and the start are not atomic: if the port is taken in between, node
0's rendezvous (:mod:`.torch_rendezvous`) says so in one line too.
"""

from __future__ import annotations

import contextlib
import errno
import socket

_WILDCARDS = ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::"))


def in_use_message(given: str, host: str, port: int) -> str | None:
    """None if ``port`` can be listened on here; else the line that says so (``given``: ``--master``'s text)."""
    if not any(_in_use(family, address, port) for family, address in _WILDCARDS):
        return None
    shown_host = f"[{host}]" if ":" in host else host
    return (f"--master {given}: the port is in use on this machine; pick a free port, "
            f"e.g. --master {shown_host}:{_free_port()}")


def _in_use(family: int, address: str, port: int) -> bool:
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:  # no IPv6 here
        return False
    with sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE  # anything else (no such address family...) is torch's to report
        return False


def _free_port() -> int:
    """A port nothing listens on now, chosen by the OS (not reserved: say it, do not promise it)."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("0.0.0.0", 0))
        return sock.getsockname()[1]
