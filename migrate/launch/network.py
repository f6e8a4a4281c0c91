"""Which local address and network interface a multi-node job uses: the ones that route to the master.

Why: gloo (and NCCL) pick the address they advertise to the other nodes from the host name unless
``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` name an interface. On many hosts ``/etc/hosts`` maps the
host name to a loopback address (127.0.1.1), so every rank advertises an address no other machine can
reach, and the job times out in gloo's ``connectFullMesh`` ("Connection refused, remote=[127.0.0.1]").
The kernel already knows the right answer: the source address of its route to the master. A UDP
socket ``connect`` asks the routing table without sending a packet; ``getsockname`` gives the address,
and the interface is the one holding that address (``ip -o addr``, else ``SIOCGIFADDR``; IPv6 from
``/proc/net/if_inet6``). ``--iface NAME`` overrides the choice; a ``GLOO_SOCKET_IFNAME`` the user set is
kept. Linux only for the interface name (elsewhere the address is still found and the log says so).
Standard library only: importing it loads no framework.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import Mapping

IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


class NetworkError(Exception):
    """The master cannot be resolved or routed to, or ``--iface`` names no usable interface."""


@dataclasses.dataclass(frozen=True)
class Network:
    """What a multi-node job uses on this node."""

    master_ip: str  # the --master host, resolved: where node 0 serves the rendezvous and the others connect
    local_ip: str  # this node's address towards the master (node 0: its own master address)
    iface: str | None  # the interface holding local_ip (or --iface); None if it could not be found
    reason: str  # why that interface: "--iface", "the route to the master", ...
    env: Mapping[str, str]  # the *_SOCKET_IFNAME variables to set for the ranks (none the user set)
    kept: Mapping[str, str]  # those the user had set, kept as they are

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.local_ip).is_loopback

    def describe(self, master: str) -> str:
        """The launcher's one log line: what it chose and why."""
        where = f"{self.local_ip} on {self.iface}" if self.iface else f"{self.local_ip} (interface not found)"
        line = f"dpmigrate launch: network: {where}, from {self.reason} (master {master} = {self.master_ip})"
        chosen = " ".join(f"{k}={v}" for k, v in self.env.items())
        kept = " ".join(f"{k}={v}" for k, v in self.kept.items())
        line += f"; the ranks get {chosen}" if chosen else ""
        line += f"; kept from your environment: {kept}" if kept else ""
        if not self.iface and not self.kept:
            line += "; gloo will use the host name's address: pass --iface NAME if the job cannot connect"
        if self.loopback:
            line += (f". WARNING: {self.local_ip} is a loopback address: nodes on other machines cannot reach "
                     "it (fine only if every node runs on this machine); give --master node 0's network address")
        return line


def choose(host: str, port: int, iface: str | None = None, environ: Mapping[str, str] | None = None) -> Network:
    """The address and interface this node uses to reach the master ``host:port``."""
    environ = dict(environ if environ is not None else {})
    master_ip = resolve(host, port)
    addresses = local_addresses()
    if iface is not None:
        named = [ip for ip, name in addresses.items() if name == iface]
        if not named:
            have = ", ".join(sorted(set(addresses.values()))) or "none found"
            raise NetworkError(f"--iface {iface}: no interface of that name with an address here (interfaces: {have})")
        family = ipaddress.ip_address(master_ip).version
        local_ip = next((ip for ip in named if ipaddress.ip_address(ip).version == family), named[0])
        env = {k: iface for k in IFNAME_VARIABLES}
        return Network(master_ip, local_ip, iface, "--iface", env, {})
    local_ip = route_source(master_ip, port)
    found = addresses.get(local_ip)
    kept = {k: environ[k] for k in IFNAME_VARIABLES if environ.get(k)}
    env = {k: found for k in IFNAME_VARIABLES if found and k not in kept}
    reason = "the route to the master" if found else "the route to the master; no interface holds that address"
    return Network(master_ip, local_ip, found, reason, env, kept)


def resolve(host: str, port: int) -> str:
    """``host`` as an IP address (the first the resolver gives, as the frameworks would connect to)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise NetworkError(f"--master {host}: cannot resolve it ({e.strerror}); give node 0's address or a "
                           "host name every node resolves") from None
    return infos[0][4][0]


def route_source(ip: str, port: int) -> str:
    """The local address the kernel would send from to reach ``ip`` (a UDP connect: no packet is sent)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((ip, port))
        except OSError as e:
            raise NetworkError(f"--master {ip}:{port}: this machine has no route to it ({e.strerror or e}); "
                               "check the address and this node's network") from None
        return sock.getsockname()[0]


def local_addresses() -> dict[str, str]:
    """This machine's addresses -> the interface holding each (Linux; empty elsewhere)."""
    found: dict[str, str] = {}
    if not sys.platform.startswith("linux"):
        return found
    found.update(_ipv4_from_ip_command())
    for ip, name in _ipv4_from_ioctl().items():
        found.setdefault(ip, name)
    found.update(_ipv6_from_proc())
    return found


def _ipv4_from_ip_command() -> dict[str, str]:
    """Every IPv4 address, secondary ones too (``ip -o -4 addr show``), if iproute2 is installed."""
    ip = shutil.which("ip")
    if ip is None:
        return {}
    try:
        out = subprocess.run([ip, "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    found = {}
    for line in out.splitlines():  # "2: eth0    inet 10.0.0.5/24 brd ... scope global eth0\ ..."
        words = line.split()
        if len(words) >= 4 and words[2] == "inet":
            found[words[3].split("/")[0]] = words[1].split("@")[0]
    return found


def _ipv4_from_ioctl() -> dict[str, str]:
    """Each interface's primary IPv4 address (``SIOCGIFADDR``), without iproute2."""
    import fcntl

    siocgifaddr = 0x8915
    found = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            with contextlib.suppress(OSError):
                request = struct.pack("256s", name.encode()[:15])
                found[socket.inet_ntoa(fcntl.ioctl(sock.fileno(), siocgifaddr, request)[20:24])] = name
    return found


def _ipv6_from_proc() -> dict[str, str]:
    """Every IPv6 address (``/proc/net/if_inet6``: 32 hex digits, index, prefix, scope, flags, name)."""
    found = {}
    with contextlib.suppress(OSError):
        with open("/proc/net/if_inet6") as f:
            for line in f:
                words = line.split()
                if len(words) == 6:
                    found[str(ipaddress.IPv6Address(bytes.fromhex(words[0])))] = words[5]
    return found
