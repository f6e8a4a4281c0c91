"""``dpmigrate launch --nnodes > 1``: which address and interface the ranks use, and what the log says (fast).

The real thing across two network namespaces is in test_multinode.py; these use this machine's loopback.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import dpmigrate.launch
from dpmigrate.launch import network

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
