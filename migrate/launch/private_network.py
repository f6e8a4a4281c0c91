"""A one-node job's private network: a new user + network namespace whose only interface is loopback.

Why: Paddle's rank 0 serves its TCPStore on ``0.0.0.0`` and TensorFlow's gRPC servers bind ``[::]``, with
no option to bind elsewhere (Paddle 3.3.1, TF 2.21), so a one-node job would be reachable from the network
while it runs. Entered before anything is started (``unshare(CLONE_NEWUSER | CLONE_NEWNET)``, the same uid
and gid mapped, no privilege needed where unprivileged user namespaces are enabled), the job's sockets,
whatever address they bind, exist only there, unreachable from the host's interfaces and from other jobs.
Where the kernel refuses, one line says so and the job runs without that isolation. Standard library only.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import sys
from pathlib import Path

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


class NamespaceBroken(Exception):
    """The new namespace was entered but could not be set up: the job cannot run in it, nor leave it."""


def isolate_network() -> str | None:
    """Enter a new user + network namespace with only loopback, up; None on success, else why not.

    Raises NamespaceBroken when the namespace was entered but its loopback could not be brought up."""
    uid, gid = os.getuid(), os.getgid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
            return f"unshare: {os.strerror(ctypes.get_errno())}"
    except (OSError, AttributeError) as e:
        return str(e)
    try:
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
        with socket.socket() as s:
            flags = struct.unpack("16sh", fcntl.ioctl(s, _SIOCGIFFLAGS, struct.pack("16sh", b"lo", 0))[:18])[1]
            fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | _IFF_UP))
    except OSError as e:
        raise NamespaceBroken(str(e)) from None
    return None


def enter_private_network(exposed_otherwise: str) -> bool | None:
    """Move this process into a private loopback-only network; say what is exposed when the kernel refuses.

    True: isolated. None: the kernel refused (said on stderr, with ``exposed_otherwise``), the job runs
    as it would anyway. False: the namespace was entered but is unusable (said): start nothing."""
    try:
        problem = isolate_network()
    except NamespaceBroken as e:
        print(f"dpmigrate launch: the job's private network namespace could not be set up ({e}); nothing "
              "was started", file=sys.stderr, flush=True)
        return False
    if problem:
        print(f"dpmigrate launch: could not give the job a private network namespace ({problem}); "
              f"{exposed_otherwise}", file=sys.stderr, flush=True)
        return None
    return True
