"""Two "machines" on one: two network namespaces joined by a veth pair, for the multi-node tests.

Each namespace has its own loopback (up) and one address on a private /24 (10.77.0.1 and 10.77.0.2), and
sees the machine's usual /etc/hosts, where the host name may resolve to a loopback address: the case
that breaks gloo's default. Names are unique per test (a leftover never clashes); :meth:`TwoNodes.close`
kills what still runs inside them and deletes them, even after a failed test. Needs root and iproute2.

Also what the three frameworks' multinode tests share: the ``nodes`` fixture (tests/conftest.py, skipped
with the reason where namespaces cannot be created), :func:`user_env`, :func:`start_launch` (one node's
``dpmigrate launch --nnodes 2``, in its namespace and folder) and :func:`finish`.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

SUBNET = "10.77.0"
ADDRESSES = (f"{SUBNET}.1", f"{SUBNET}.2")


class NamespacesUnavailable(Exception):
    """Network namespaces cannot be created here (not root, no iproute2, a sandbox without them)."""


def _ip(*args: str) -> None:
    try:
        done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        raise NamespacesUnavailable("the `ip` command (iproute2) is not installed") from None
    if done.returncode != 0:
        raise NamespacesUnavailable(f"`ip {' '.join(args)}` failed: {done.stderr.strip()}")


class TwoNodes:
    """``names[i]``: node i's namespace; ``ifaces[i]``: its veth end; ``addresses[i]``: its address."""

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.names = (f"dpm{tag}n0", f"dpm{tag}n1")
        self.ifaces = (f"dpm{tag}v0", f"dpm{tag}v1")
        self.addresses = ADDRESSES
        self._created: list[str] = []
        try:
            for name in self.names:
                _ip("netns", "add", name)
                self._created.append(name)
            _ip("link", "add", self.ifaces[0], "type", "veth", "peer", "name", self.ifaces[1])
            for name, iface, address in zip(self.names, self.ifaces, self.addresses):
                _ip("link", "set", iface, "netns", name)
                _ip("-n", name, "addr", "add", f"{address}/24", "dev", iface)
                _ip("-n", name, "link", "set", iface, "up")
                _ip("-n", name, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    def command(self, node: int, argv: list[str]) -> list[str]:
        """``argv`` run inside node ``node``'s namespace."""
        return ["ip", "netns", "exec", self.names[node], *argv]

    def pids(self, node: int) -> list[int]:
        """The processes running in node ``node``'s namespace (all started by the test)."""
        out = subprocess.run(["ip", "netns", "pids", self.names[node]], capture_output=True, text=True).stdout
        return [int(pid) for pid in out.split()]

    def listening(self, node: int) -> list[str]:
        """``ip:port`` of every TCP socket listening in node ``node``'s namespace (its /proc/net/tcp*)."""
        found = []
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            out = subprocess.run(self.command(node, ["cat", table]), capture_output=True, text=True).stdout
            for line in out.splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":  # TCP_LISTEN
                    found.append(_address(fields[1]))
        return found

    def close(self) -> None:
        """Kill what still runs inside the namespaces, then delete them (the veth pair goes with them)."""
        for node, name in enumerate(self.names):
            if name not in self._created:
                continue
            for _ in range(50):
                pids = self.pids(node)
                if not pids:
                    break
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                time.sleep(0.1)
        for name in self._created:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self._created.clear()


def user_env() -> dict[str, str]:
    """The environment of a user who set nothing for the job (no launcher, interface, rank or framework
    variables), with TensorFlow's C++ log kept quiet."""
    set_by_launchers = ("RANK", "WORLD_SIZE", "LOCAL_", "MASTER_", "TORCHELASTIC", "GROUP_", "GLOO_", "NCCL_",
                        "SLURM_", "OMPI_", "PADDLE_", "POD_IP", "FLAGS_", "TF_CONFIG", "TF_USE_LEGACY_KERAS",
                        "OMP_NUM_THREADS", "DPMIGRATE_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(set_by_launchers)}
    return {**env, "TF_CPP_MIN_LOG_LEVEL": "2"}


def start_launch(nodes: TwoNodes, node: int, tmp_path: Path, args: list[str]) -> subprocess.Popen:
    """``dpmigrate launch --nnodes 2 --node-rank NODE ARGS`` in node ``node``'s namespace, run from its own
    folder ``tmp_path/node<i>`` with its logs in ``logs/`` there."""
    folder = tmp_path / f"node{node}"
    folder.mkdir(exist_ok=True)
    argv = [sys.executable, "-m", "dpmigrate.launch", "--nnodes", "2", "--node-rank", str(node),
            "--log-dir", str(folder / "logs"), *args]
    return subprocess.Popen(nodes.command(node, argv), cwd=folder, env=user_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def finish(procs: list[subprocess.Popen], timeout_s: float = 300) -> list[tuple[int, str, str]]:
    """Each process's (exit code, stdout, stderr); one still running after ``timeout_s`` fails the test."""
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=timeout_s)
        finally:
            proc.kill()
        results.append((proc.returncode, out, err))
    return results


def _address(hex_address: str) -> str:
    """``0100007F:1F90`` -> ``127.0.0.1:8080`` (IPv6: 32 hex digits in host-endian 32-bit words)."""
    import socket

    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return f"{socket.inet_ntop(family, words)}:{int(port, 16)}"
