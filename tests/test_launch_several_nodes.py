"""``dpmigrate launch --nnodes > 1``: which address and interface the ranks use, what the log says, and the
supervisor's start-timeout backstop (fast).

The real thing across two network namespaces is in test_multinode.py; these use this machine's loopback.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

import dpmigrate.launch
from dpmigrate.launch import network, supervise
from dpmigrate.launch import torch as torch_backend
from dpmigrate.launch.backend import Job, Plan, Process

RUN_ID = "0123456789abcdef0123456789abcdef"
LOOPBACK = "lo0" if sys.platform == "darwin" else "lo"
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="interface names are read on Linux")


def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("import torch\n")
    return path


@linux_only
def test_the_interface_holding_the_route_to_the_master_is_chosen_for_gloo_and_nccl():
    chosen = network.choose("127.0.0.1", 29500, environ={})
    assert (chosen.master_ip, chosen.local_ip, chosen.iface) == ("127.0.0.1", "127.0.0.1", LOOPBACK)
    assert chosen.env == {"GLOO_SOCKET_IFNAME": LOOPBACK, "NCCL_SOCKET_IFNAME": LOOPBACK}
    assert chosen.reason == "the route to the master"


@linux_only
def test_a_loopback_route_with_several_nodes_is_said_plainly():
    line = network.choose("localhost", 29500, environ={}).describe("localhost:29500")
    assert line.startswith(f"dpmigrate launch: network: 127.0.0.1 on {LOOPBACK}, from the route to the master "
                           "(master localhost:29500 = 127.0.0.1); the ranks get GLOO_SOCKET_IFNAME=")
    assert ("WARNING: 127.0.0.1 is a loopback address: nodes on other machines cannot reach it (fine only if every "
            "node runs on this machine); give --master node 0's network address") in line


@linux_only
def test_the_users_own_ifname_is_kept_and_said():
    chosen = network.choose("127.0.0.1", 29500, environ={"GLOO_SOCKET_IFNAME": "eth7"})
    assert chosen.env == {"NCCL_SOCKET_IFNAME": LOOPBACK}
    assert chosen.kept == {"GLOO_SOCKET_IFNAME": "eth7"}
    assert "; kept from your environment: GLOO_SOCKET_IFNAME=eth7" in chosen.describe("127.0.0.1:29500")


@linux_only
def test_iface_overrides_the_route_and_the_users_variables():
    chosen = network.choose("127.0.0.1", 29500, iface=LOOPBACK, environ={"GLOO_SOCKET_IFNAME": "eth7"})
    assert (chosen.iface, chosen.reason, chosen.kept) == (LOOPBACK, "--iface", {})
    assert chosen.env == {"GLOO_SOCKET_IFNAME": LOOPBACK, "NCCL_SOCKET_IFNAME": LOOPBACK}


@linux_only
def test_an_unknown_iface_is_refused_naming_the_interfaces(tmp_path, capsys):
    code = dpmigrate.launch.main(["-n", "1", "--nnodes", "2", "--master", "127.0.0.1:29500", "--run-id", RUN_ID,
                                  "--iface", "nosuch0", str(script(tmp_path))])
    assert code == 2
    err = capsys.readouterr().err
    assert "dpmigrate launch: error: --iface nosuch0: no interface of that name with an address here (interfaces: " \
           in err and LOOPBACK in err


def test_an_unresolvable_master_is_refused_before_anything_starts(tmp_path, capsys):
    code = dpmigrate.launch.main(["-n", "1", "--nnodes", "2", "--node-rank", "1", "--master", "no-such-host.invalid:29500",
                                  "--run-id", RUN_ID, "--log-dir", str(tmp_path / "logs"), str(script(tmp_path))])
    assert code == 2
    assert "--master no-such-host.invalid: cannot resolve it" in capsys.readouterr().err
    assert not (tmp_path / "logs").exists()


@linux_only
def test_the_plan_passes_the_choice_to_torchrun_and_the_ranks(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    assert dpmigrate.launch.main(["--dry-run", "-n", "2", "--nnodes", "2", "--master", "127.0.0.1:29500",
                                  "--run-id", RUN_ID, "--start-timeout", "30", str(script(tmp_path))]) == 0
    out, err = capsys.readouterr()
    line = next(line for line in out.splitlines() if "torch_rendezvous" in line)
    assert f"GLOO_SOCKET_IFNAME={LOOPBACK} NCCL_SOCKET_IFNAME={LOOPBACK}" in line
    assert "--local-addr 127.0.0.1" in line
    assert "--rdzv-conf rank=0,bind=127.0.0.1,start_timeout=30,nproc=2" in line
    assert err.count("dpmigrate launch: network: ") == 1


def test_help_names_start_timeout_and_its_default(capsys):
    assert dpmigrate.launch.main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--start-timeout S" in text and "(default 60)" in text and "--iface NAME" in text


def test_a_launcher_that_starts_no_rank_within_the_start_timeout_is_stopped_saying_so(tmp_path, capfd):
    """The backstop behind the rendezvous's own deadline: a launcher stuck before starting any rank."""
    job = Job(nproc_per_node=1, nnodes=2, node_rank=1, master=("127.0.0.1", 1), script=tmp_path / "train.py",
              script_args=(), log_dir=tmp_path / "logs", timeout_s=None, run_id=RUN_ID, start_timeout_s=1)
    (tmp_path / "logs").mkdir(mode=0o700)
    stuck = Process("torchrun", (sys.executable, "-c", "import time; time.sleep(60)"), {}, "launcher")
    plan = Plan(processes=(stuck,), grace_s=5, status_dir=tmp_path / "logs" / "rank-status", start_timeout_s=1)
    started = time.monotonic()
    outcome = supervise.run(plan, job, torch_backend)
    took = time.monotonic() - started
    assert outcome.launcher_returncode == -signal.SIGKILL
    assert 1 + supervise.START_MARGIN_S <= took < 1 + supervise.START_MARGIN_S + 2, took
    assert ("dpmigrate launch: no rank of this node started within --start-timeout 1 s (+3 s): the nodes never all "
            "met; stopping torchrun") in capfd.readouterr().err
