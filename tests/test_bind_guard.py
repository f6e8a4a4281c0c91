"""The bind guard (dpmigrate/launch/bind_guard.c): the library compiled when dpmigrate was installed (setup.py)
and one compiled at run time with the real C compiler, each preloaded into a real Python process, and what
each kind of bind ends up on, read back with ``getsockname``; a node with no C compiler runs a multi-node job
with the installed library.

The frameworks' own servers under the guard, across two network namespaces, are in test_multinode_paddle.py
and test_tf_multinode.py; this file checks the library itself and how ``dpmigrate launch`` asks for it.
"""

from __future__ import annotations

import json
import os
import shutil
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


@pytest.fixture(scope="module", params=["installed", "built at run time"])
def library(request, tmp_path_factory):
    if not sys.platform.startswith("linux"):
        pytest.skip("the bind guard is for Linux")
    if request.param == "installed":
        return bind_guard.installed()  # fails if the install did not compile it: .ci/setup installs gcc first
    return bind_guard.build(tmp_path_factory.mktemp("guard"))


@pytest.fixture
def no_compiler(tmp_path, monkeypatch) -> dict[str, str]:
    """This process's environment as on a node without a C compiler: ``CC`` names none, ``PATH`` has no cc,
    gcc or clang (only ``ip``, which network.py reads routes with, and this Python's folder)."""
    tools = tmp_path / "no-compiler-bin"
    tools.mkdir()
    if shutil.which("ip"):
        (tools / "ip").symlink_to(shutil.which("ip"))
    path = os.pathsep.join([str(tools), str(Path(sys.executable).parent)])
    monkeypatch.setenv("PATH", path)
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    assert not any(shutil.which(c, path=path) for c in ("cc", "gcc", "clang"))
    with pytest.raises(bind_guard.Unavailable, match="cannot run the C compiler"):
        bind_guard.build(tmp_path)
    return {"PATH": path, "CC": os.environ["CC"]}


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


def one_rank_plan(address: str = "10.0.0.5") -> Plan:
    return bind_guard.requested(Plan(processes=(Process("rank0", ("true",), {}, "rank", rank=0),), grace_s=1),
                                address, environ={"LD_PRELOAD": "/opt/user.so"})


@linux_only
def test_the_library_compiled_at_install_time_sits_in_the_package_folder_writable_by_its_owner_only():
    library = bind_guard.installed()
    assert library == Path(bind_guard.__file__).with_name("_bind_guard.so")
    found = os.lstat(library)
    assert stat.S_ISREG(found.st_mode) and not found.st_mode & 0o022
    assert not os.stat(library.parent).st_mode & 0o022


@linux_only
def test_on_a_node_without_a_compiler_prepared_preloads_the_installed_library(no_compiler, tmp_path, monkeypatch):
    made = []
    monkeypatch.setattr(bind_guard.tempfile, "mkdtemp", lambda **kw: made.append(kw) or pytest.fail("a temp folder"))
    plan = one_rank_plan("127.0.0.2")
    assert plan.processes[0].env == {"LD_PRELOAD": f"{bind_guard.LIBRARY} /opt/user.so",
                                     bind_guard.ADDRESS_VARIABLE: "127.0.0.2"}
    with bind_guard.prepared(plan) as ready:
        env = ready.processes[0].env
        assert env["LD_PRELOAD"] == f"{bind_guard.INSTALLED} /opt/user.so"
        found = probe(tmp_path, {**no_compiler, "LD_PRELOAD": str(bind_guard.INSTALLED),
                                 bind_guard.ADDRESS_VARIABLE: env[bind_guard.ADDRESS_VARIABLE]})
    assert found["tcp4 wildcard"] == found["tcp4 empty"] == "127.0.0.2"
    assert bind_guard.INSTALLED.is_file() and not made  # loaded from the package folder, nothing built or removed


REFUSED = {
    "writable by others": "it is writable by others (mode 666; install with umask 022)",
    "writable by its group": "it is writable by its group (mode 775; install with umask 022)",
    "in a folder others can write to": "its folder is writable by others (mode 777; install with umask 022)",
    "another user's": "it belongs to uid 54321, neither root nor the owner of dpmigrate's code",
    "a symlink": "not a regular file",
    "missing": "is missing: no C compiler at install time",
}


@linux_only
@pytest.mark.parametrize("problem", REFUSED)
def test_an_installed_library_that_others_could_replace_is_not_loaded(problem, tmp_path, monkeypatch):
    folder = tmp_path / "launch"
    folder.mkdir()
    os.chmod(folder, 0o777 if problem == "in a folder others can write to" else 0o755)
    planted = folder / "_bind_guard.so"
    if problem == "a symlink":
        planted.symlink_to(bind_guard.INSTALLED)
    elif problem != "missing":
        shutil.copyfile(bind_guard.INSTALLED, planted)
        os.chmod(planted, {"writable by others": 0o666, "writable by its group": 0o775}.get(problem, 0o755))
    if problem == "another user's":
        if os.geteuid() != 0:
            pytest.skip("giving a file to another user needs root")
        os.chown(planted, 54321, 54321)
    monkeypatch.setattr(bind_guard, "INSTALLED", planted)
    with pytest.raises(bind_guard.NotInstalled) as refused:
        bind_guard.installed()
    assert str(planted) in str(refused.value) and REFUSED[problem] in str(refused.value)
    with bind_guard.prepared(one_rank_plan()) as built:  # built for the job instead, this machine has a compiler
        assert built.processes[0].env["LD_PRELOAD"].split()[0] != str(planted)


@linux_only
def test_without_an_installed_library_prepared_builds_one_privately_and_removes_it_after_the_job(tmp_path,
                                                                                                 monkeypatch):
    monkeypatch.setattr(bind_guard, "INSTALLED", tmp_path / "_bind_guard.so")  # as if installed with no compiler
    plan = one_rank_plan()
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
def test_a_multi_node_launch_without_a_compiler_or_an_installed_guard_stops_before_anything_starts(
        no_compiler, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bind_guard, "INSTALLED", tmp_path / "_bind_guard.so")  # installed with no compiler either
    marker = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"import torch\nopen({str(marker)!r}, 'w').close()\n")
    code = dpmigrate.launch.main(["-n", "1", "--nnodes", "2", "--node-rank", "1", "--master", "127.0.0.1:29500",
                                  "--run-id", RUN_ID, "--log-dir", str(tmp_path / "logs"), str(script)])
    err = capsys.readouterr().err
    assert code == 2
    assert (f"dpmigrate launch: error: dpmigrate was installed without its compiled bind guard ({tmp_path}/"
            "_bind_guard.so is missing: no C compiler at install time), and cannot run the C compiler") in err
    assert "to build the bind guard" in err
    assert "or pass --no-bind-guard to let those servers listen on every interface" in err
    assert not marker.exists()


JOB = """import torch  # a torch script, launched by torchrun
import json, os, socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.bind(("0.0.0.0", 0))
s.listen()
found = {"address": s.getsockname()[0], "preload": os.environ.get("LD_PRELOAD", "")}
with open(os.path.join(sys.argv[1], "rank" + os.environ["RANK"] + ".json"), "w") as f:
    json.dump(found, f)
"""


@linux_only
@pytest.mark.slow
def test_a_two_node_job_runs_guarded_on_nodes_without_a_compiler(no_compiler, tmp_path):
    """Two real nodes on this machine's loopback (node 0 and node 1, one rank each), neither with a compiler:
    every rank runs with the installed library preloaded, its wildcard listener on the chosen address."""
    script = tmp_path / "train.py"
    script.write_text(JOB)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "dpmigrate.launch", "-n", "1", "--nnodes", "2", "--node-rank", str(rank), "--master",
         f"127.0.0.1:{port}", "--run-id", RUN_ID, "--start-timeout", "60", "--log-dir", str(tmp_path / f"logs{rank}"),
         str(script), str(tmp_path)],
        env={**os.environ, **no_compiler}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rank in (0, 1)]
    outputs = [node.communicate(timeout=240) for node in nodes]
    for node, (_, err) in zip(nodes, outputs):
        assert node.returncode == 0, err
        assert "dpmigrate launch: bind guard: " in err and "listens on 127.0.0.1 only" in err
    for rank in (0, 1):
        found = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert found == {"address": "127.0.0.1", "preload": str(bind_guard.INSTALLED)}


@linux_only
def test_other_launchers_are_given_the_installed_guard(no_compiler):
    done = subprocess.run([sys.executable, "-m", "dpmigrate.launch.bind_guard"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, **no_compiler})
    assert (done.returncode, done.stdout) == (0, f"{bind_guard.INSTALLED}\n"), done.stderr


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
