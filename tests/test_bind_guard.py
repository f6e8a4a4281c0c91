"""The bind guard (dpmigrate/launch/bind_guard.c): built with the real C compiler, preloaded into a real
Python process, and what each kind of bind ends up on, read back with ``getsockname``.

The frameworks' own servers under the guard, across two network namespaces, are in test_multinode_paddle.py
and test_tf_multinode.py; this file checks the library itself and how ``dpmigrate launch`` asks for it.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import dpmigrate.launch
from dpmigrate.launch import bind_guard
from dpmigrate.launch.backend import Plan, Process

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the bind guard is for Linux")
RUN_ID = "0123456789abcdef0123456789abcdef"

PROBE = """
import json, os, socket, sys
found = {}
def listen(name, family, address):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.bind((address, 0))
    s.listen()
    found[name] = s.getsockname()[0]
listen("tcp4 wildcard", socket.AF_INET, "0.0.0.0")
listen("tcp4 empty", socket.AF_INET, "")
listen("tcp4 specific", socket.AF_INET, "127.0.0.1")
if socket.has_ipv6:
    listen("tcp6 wildcard", socket.AF_INET6, "::")
    only6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)  # IPv6-only, then its IPv4 twin at the same port
    only6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    only6.bind(("::", 0))
    twin = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    twin.bind(("0.0.0.0", only6.getsockname()[1]))
    found["tcp6 v6only wildcard"], found["tcp4 twin"] = only6.getsockname()[0], twin.getsockname()[0]
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind(("0.0.0.0", 0))
found["udp4 wildcard"] = u.getsockname()[0]
x = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
x.bind(sys.argv[1])
found["unix"] = x.getsockname()
print(json.dumps(found))
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    if not sys.platform.startswith("linux"):
        pytest.skip("the bind guard is for Linux")
    return bind_guard.build(tmp_path_factory.mktemp("guard"))


def probe(tmp_path: Path, env: dict[str, str]) -> dict:
    unix = tmp_path / "probe.sock"
    unix.unlink(missing_ok=True)
    done = subprocess.run([sys.executable, "-c", PROBE, str(unix)], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_wildcard_tcp_bind_gets_the_chosen_address_and_nothing_else_changes(library, tmp_path):
    found = probe(tmp_path, {"LD_PRELOAD": str(library), bind_guard.ADDRESS_VARIABLE: "127.0.0.2"})
    assert found["tcp4 wildcard"] == found["tcp4 empty"] == "127.0.0.2"
    assert found["tcp4 specific"] == "127.0.0.1"  # an address asked for is kept
    if "tcp6 wildcard" in found:
        assert found["tcp6 wildcard"] == "::ffff:127.0.0.2"  # a dual-stack socket: the IPv4-mapped form
        assert (found["tcp6 v6only wildcard"], found["tcp4 twin"]) == ("::1", "127.0.0.2")  # both bound, none wide
    assert found["udp4 wildcard"] == "0.0.0.0"  # only TCP listeners are the frameworks' servers
    assert found["unix"] == str(tmp_path / "probe.sock")


def test_without_the_address_the_guard_changes_nothing(library, tmp_path):
    found = probe(tmp_path, {"LD_PRELOAD": str(library)})
    assert found["tcp4 wildcard"] == found["tcp4 empty"] == "0.0.0.0"
    assert found.get("tcp6 wildcard", "::") == found.get("tcp6 v6only wildcard", "::") == "::"


def test_an_ipv6_address_is_given_to_ipv6_wildcard_sockets(library, tmp_path):
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError as e:
        pytest.skip(f"this machine has no IPv6 loopback: {e}")
    found = probe(tmp_path, {"LD_PRELOAD": str(library), bind_guard.ADDRESS_VARIABLE: "::1"})
    assert found["tcp6 wildcard"] == "::1"
    assert found["tcp4 wildcard"] == "0.0.0.0"  # an IPv4 socket cannot take an IPv6 address: left as asked


@linux_only
def test_prepared_builds_the_library_privately_and_removes_it_after_the_job():
    plan = bind_guard.requested(Plan(processes=(Process("rank0", ("true",), {}, "rank", rank=0),), grace_s=1),
                                "10.0.0.5", environ={"LD_PRELOAD": "/opt/user.so"})
    assert plan.processes[0].env == {"LD_PRELOAD": f"{bind_guard.LIBRARY} /opt/user.so",
                                     bind_guard.ADDRESS_VARIABLE: "10.0.0.5"}
    with bind_guard.prepared(plan) as built:
        library = Path(built.processes[0].env["LD_PRELOAD"].split()[0])
        assert library.is_file() and built.processes[0].env["LD_PRELOAD"].endswith(" /opt/user.so")
        assert stat.S_IMODE(library.parent.stat().st_mode) == 0o700
        assert not bind_guard.wanted(built)
    assert not library.parent.exists()


def dry_run(tmp_path: Path, capsys, *flags: str) -> str:
    script = tmp_path / "train.py"
    script.write_text("import torch\n")
    code = dpmigrate.launch.main(["--dry-run", "-n", "1", *flags, str(script)])
    assert code == 0
    return capsys.readouterr().out


@linux_only
def test_several_nodes_ask_for_the_guard_one_node_and_no_bind_guard_do_not(tmp_path, capsys):
    several = ("--nnodes", "2", "--master", "127.0.0.1:29500", "--run-id", RUN_ID)
    out = dry_run(tmp_path, capsys, *several)
    assert f"'LD_PRELOAD={bind_guard.LIBRARY}'" in out and f"{bind_guard.ADDRESS_VARIABLE}=127.0.0.1" in out
    assert "LD_PRELOAD" not in dry_run(tmp_path, capsys)
    assert "LD_PRELOAD" not in dry_run(tmp_path, capsys, *several, "--no-bind-guard")


@linux_only
def test_a_multi_node_launch_without_a_compiler_stops_before_anything_starts(tmp_path, capsys, monkeypatch):
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"import torch\nopen({str(marker)!r}, 'w').close()\n")
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    code = dpmigrate.launch.main(["-n", "1", "--nnodes", "2", "--node-rank", "1", "--master", "127.0.0.1:29500",
                                  "--run-id", RUN_ID, "--log-dir", str(tmp_path / "logs"), str(script)])
    err = capsys.readouterr().err
    assert code == 2
    assert "dpmigrate launch: error: cannot run the C compiler" in err and "to build the bind guard" in err
    assert "or pass --no-bind-guard to let those servers listen on every interface" in err
    assert not marker.exists()


@linux_only
def test_the_guard_is_built_for_other_launchers_only_into_a_private_folder(tmp_path):
    def build(folder: Path) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "dpmigrate.launch.bind_guard", str(folder)],
                              capture_output=True, text=True, timeout=120)

    done = build(tmp_path / "guard")
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == tmp_path / "guard" / "bind_guard.so" and Path(done.stdout.strip()).is_file()
    assert stat.S_IMODE((tmp_path / "guard").stat().st_mode) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    os.chmod(shared, 0o777)
    (tmp_path / "link").symlink_to(tmp_path / "guard")
    for refused in (shared, tmp_path / "link"):
        done = build(refused)
        assert done.returncode == 2 and "not a private folder of yours" in done.stderr, done.stderr
