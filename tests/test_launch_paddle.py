"""`dpmigrate launch` for Paddle scripts: the plan (fast, --dry-run) and what a real one-node job binds (slow).

The test process never imports paddle (one framework per process): the jobs' processes do.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_launch import _address, alive, launcher_process, wait_for_files

import dpmigrate.launch
from dpmigrate.launch import cli
from dpmigrate.launch import paddle as paddle_backend
from dpmigrate.launch.processes import descendants

pytestmark = pytest.mark.alone  # its slow jobs time how fast a failure or a signal ends them: run one at a time

TRAIN = Path(__file__).parent / "jobs" / "paddle_train.py"


def dry_run_command(capsys, *argv: str) -> tuple[str, list[str]]:
    assert dpmigrate.launch.main(["--dry-run", *argv]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3, out  # the header, then one process: Paddle's launcher (through our relay)
    words = shlex.split(out[2])
    return out[0], words[words.index(sys.executable):]


def after(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


@pytest.mark.parametrize("source", ["import paddle\n", "import dpmigrate.runtime.paddle as dp\nimport numpy\n",
                                    "from paddle.distributed import fleet\n"])
def test_paddle_scripts_run_under_paddles_launcher_with_nproc_per_node_and_a_private_log_dir(tmp_path, capsys,
                                                                                            source):
    script = tmp_path / "train.py"
    script.write_text(source)
    header, command = dry_run_command(capsys, "-n", "2", "--log-dir", str(tmp_path / "logs"), str(script), "--lr", "1")
    assert header.startswith("# dpmigrate launch: paddle, ranks 0-1 of 2 on node 0 of 1")
    relay = command[:command.index("--")]
    paddle = command[command.index("--") + 1:]
    assert relay == [sys.executable, "-m", "dpmigrate.launch.paddle_launcher", "--isolate", str(tmp_path / "logs" / "paddle")]
    assert paddle[:3] == [sys.executable, "-m", "paddle.distributed.launch"]
    assert after(paddle, "--nproc_per_node") == "2" and "--devices" not in paddle and "--gpus" not in paddle
    assert after(paddle, "--log_dir") == str(tmp_path / "logs" / "paddle")
    assert "--master" not in paddle and "--nnodes" not in paddle
    rank = paddle[paddle.index("dpmigrate.launch.paddle_rank") - 2:]
    assert rank == [sys.executable, "-m", "dpmigrate.launch.paddle_rank", str(tmp_path / "logs" / "rank-status"),
                    str(script), "--lr", "1"]
    assert not (tmp_path / "logs").exists()  # --dry-run creates nothing


def test_several_nodes_meet_at_the_master_with_the_shared_run_id_and_no_namespace(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("import paddle\n")
    run_id = "a" * 32
    _, command = dry_run_command(capsys, "-n", "4", "--nnodes", "2", "--node-rank", "1", "--master", "node0:6170",
                                 "--run-id", run_id, str(script))
    assert "--isolate" not in command
    assert (after(command, "--nnodes"), after(command, "--rank"), after(command, "--master")) == ("2", "1", "node0:6170")
    assert after(command, "--job_id") == run_id and after(command, "--nproc_per_node") == "4"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="interface names are read on Linux")
@pytest.mark.parametrize("iface", [None, "lo"], ids=["routed", "--iface"])
def test_several_nodes_advertise_the_address_that_routes_to_the_master_and_gloo_uses_its_interface(tmp_path, capsys,
                                                                                                  iface):
    """Paddle's launcher gets --host (the address its ranks advertise: by default the host name's, often a
    loopback address) and the ranks GLOO_SOCKET_IFNAME; node 0's relay serves the rendezvous at the master."""
    script = tmp_path / "train.py"
    script.write_text("import paddle\n")
    run_id = "b" * 32
    argv = ["-n", "2", "--nnodes", "2", "--node-rank", "1", "--master", "127.0.0.1:6170", "--run-id", run_id,
            "--start-timeout", "25", *(["--iface", iface] if iface else []), str(script)]
    assert dpmigrate.launch.main(["--dry-run", *argv]) == 0
    out = capsys.readouterr()
    words = shlex.split(out.out.splitlines()[2])
    assert "GLOO_SOCKET_IFNAME=lo" in words and any(w.startswith("NO_PROXY=") and "127.0.0.1" in w for w in words)
    paddle = words[words.index("paddle.distributed.launch") - 2:]
    relay = words[words.index("dpmigrate.launch.paddle_launcher") + 1:words.index("--")]
    assert after(paddle, "--host") == "127.0.0.1" and after(paddle, "--master") == "127.0.0.1:6170"
    assert relay[:-2] == ["--node", "1", "--nnodes", "2", "--nproc", "2", "--master", "127.0.0.1:6170", "--run-id",
                          run_id, "--start-timeout", "25", "--status-dir"]  # no --serve: node 1
    assert relay[-2].endswith("rank-status") and relay[-1].endswith("paddle")  # the worker log dir last
    assert "dpmigrate launch: network: 127.0.0.1 on lo" in out.err


def test_the_paddle_backend_has_every_member_the_supervisor_uses():
    assert cli.BACKENDS["paddle"] is paddle_backend
    assert "paddle" not in cli.NOT_YET_SUPPORTED
    assert paddle_backend.unavailable() is None  # paddle is installed here
    assert paddle_backend.split_rank("[rank1] loss 0.3\n") == (1, "loss 0.3\n")
    assert paddle_backend.split_rank("LAUNCH INFO 2026 Pod completed\n") == (None, "LAUNCH INFO 2026 Pod completed\n")


def test_the_relay_shows_each_ranks_line_once_stderr_on_stderr_and_drops_paddles_echo(tmp_path):
    """paddle_launcher on a stand-in for Paddle's launcher: it writes two ranks' logs as Paddle does
    (workerlog.<i>, marked by paddle_rank) and echoes rank 0's to its stdout, as Paddle's launcher does."""
    folder = tmp_path / "paddle"
    folder.mkdir()
    (folder / "workerlog.0").write_bytes(b"[rank0] from an earlier run in this log dir\n")
    fake = tmp_path / "fake_launcher.py"
    fake.write_text(
        "import sys, time\n"
        f"folder = {str(folder)!r}\n"
        "logs = [open(f'{folder}/workerlog.{i}', 'a') for i in (0, 1)]\n"
        "logs[0].write('[rank0] step 1\\n'); logs[0].flush()\n"
        "logs[1].write('[rank1]! a warning\\n[rank1] step 1\\n'); logs[1].flush()\n"
        "print('[rank0] step 1', flush=True)\n"  # Paddle's echo of rank 0's log: a copy
        "print('LAUNCH INFO Pod completed', flush=True)\n"
        "time.sleep(0.3)\n"
        "logs[1].write('[rank1] last line without newline'); logs[1].flush()\n"
        "sys.exit(3)\n")
    proc = subprocess.run([sys.executable, "-m", "dpmigrate.launch.paddle_launcher", str(folder), "--",
                           sys.executable, str(fake)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3  # exits as Paddle's launcher did
    assert sorted(proc.stdout.splitlines()) == ["LAUNCH INFO Pod completed", "[rank0] step 1",
                                                "[rank1] last line without newline", "[rank1] step 1"]
    assert proc.stderr.splitlines() == ["[rank1] a warning"]


def test_a_progress_line_of_carriage_returns_is_shown_once_tagged(tmp_path):
    """Paddle's launcher echoes rank 0's log read in text mode (``Container.logs``: ``open(path)``, readline), so
    a progress bar's ``\\r`` splits a line: each piece must still be recognised as a copy. The rank runs under the
    real paddle_rank wrapper; the stand-in launcher echoes its log as Paddle 3.3.1 does."""
    folder = tmp_path / "paddle"
    folder.mkdir()
    script = tmp_path / "progress.py"
    script.write_text("import sys\n"
                      "sys.stdout.write('\\rstep 1/2 - loss: 0.5\\rstep 2/2 - loss: 0.25\\n')\n"
                      "sys.stdout.write('windows line\\r\\n')\n"
                      "print('done')\n")
    fake = tmp_path / "fake_launcher.py"
    fake.write_text(
        "import os, subprocess, sys\n"
        f"folder, script, status = {str(folder)!r}, {str(script)!r}, {str(tmp_path / 'status')!r}\n"
        "with open(f'{folder}/workerlog.0', 'w') as log:\n"
        "    subprocess.run([sys.executable, '-m', 'dpmigrate.launch.paddle_rank', status, script],\n"
        "                   stdout=log, stderr=log, env={**os.environ, 'PADDLE_TRAINER_ID': '0'}, check=True)\n"
        "with open(f'{folder}/workerlog.0') as echo:\n"  # Paddle's Container.logs
        "    for line in iter(echo.readline, ''):\n"
        "        sys.stdout.write(line)\n")
    (tmp_path / "status").mkdir()
    proc = subprocess.run([sys.executable, "-m", "dpmigrate.launch.paddle_launcher", str(folder), "--",
                           sys.executable, str(fake)], capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split(b"\n") == [b"[rank0] \r[rank0] step 1/2 - loss: 0.5\r[rank0] step 2/2 - loss: 0.25",
                                        b"[rank0] windows line\r", b"[rank0] done", b""], proc.stdout


# ------------------------------------------------------------------- what a real one-node job binds (slow)


def _listening(table: Path, inodes: set[str]) -> list[str]:
    found = []
    for line in table.read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and (not inodes or fields[9] in inodes):  # 0A: TCP_LISTEN
            found.append(_address(fields[1]))
    return found


def _socket_inodes(pids: list[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return inodes


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc/net/tcp")
def test_a_one_node_job_listens_only_inside_a_private_loopback_only_network_namespace(tmp_path):
    """Paddle's rank 0 serves its TCPStore on 0.0.0.0 (no bind option): seen inside the job's namespace.
    From this machine's own network namespace no socket of the job listens at all, and the job's
    namespace has no interface but loopback."""
    proc = launcher_process("-n", "2", "--log-dir", str(tmp_path / "logs"), str(TRAIN), "--steps", "2",
                            "--hold", str(tmp_path / "hold"), cwd=tmp_path)
    (tmp_path / "hold").write_text("")
    try:
        wait_for_files([tmp_path / "hold.rank0", tmp_path / "hold.rank1"], timeout_s=120)
        pids = descendants(proc.pid)
        ranks = [int((tmp_path / f"hold.rank{r}").read_text()) for r in (0, 1)]
        inodes = _socket_inodes([proc.pid, *pids])
        outside = [a for t in ("/proc/net/tcp", "/proc/net/tcp6") for a in _listening(Path(t), inodes)]
        namespaces = {os.readlink(f"/proc/{p}/ns/net") for p in ranks}
        inside = [a for t in ("tcp", "tcp6") for a in _listening(Path(f"/proc/{ranks[0]}/net/{t}"), inodes)]
        interfaces = [line.split(":")[0].strip() for line in
                      Path(f"/proc/{ranks[0]}/net/dev").read_text().splitlines()[2:]]
    finally:
        (tmp_path / "hold").unlink()
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert set(ranks) <= set(pids), (ranks, pids)
    assert namespaces != {os.readlink("/proc/self/ns/net")} and len(namespaces) == 1
    assert interfaces == ["lo"]
    assert outside == []
    assert any(a.startswith("0.0.0.0:") for a in inside), inside  # Paddle's TCPStore: why the namespace


@pytest.mark.slow
def test_a_rank_killed_mid_training_ends_the_job_naming_it(tmp_path):
    """A lost rank: Paddle's launcher stops the other (blocked in a gloo all-reduce), no hang; the final
    line names the killed rank first and the exit code is 128 + SIGKILL."""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "dpmigrate.launch", "-n", "2", "--log-dir", str(tmp_path / "logs"), str(TRAIN),
         "--steps", "100000", "--die-rank", "1", "--die-at", "3"],
        cwd=tmp_path, capture_output=True, text=True, timeout=180)
    elapsed = time.monotonic() - started
    final = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 137, proc.stdout + proc.stderr
    assert re.match(r"dpmigrate launch: rank 1 failed \(killed by SIGKILL\)", final), final
    assert elapsed < 90, f"the job took {elapsed:.0f} s to end after a rank died"


@pytest.mark.slow
def test_two_nodes_meet_at_the_master_and_train_like_one_process(tmp_path):
    """--nnodes 2 --master 127.0.0.1:PORT --run-id: two `dpmigrate launch` on this machine, one rank each,
    through Paddle's launcher (node 0's serves the rendezvous at the master); the result equals 1 process."""
    import numpy as np

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_id = secrets.token_hex(16)
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "dpmigrate.launch", "-n", "1", "--nnodes", "2", "--node-rank", str(r), "--master",
         f"127.0.0.1:{port}", "--run-id", run_id, "--log-dir", str(tmp_path / f"logs{r}"), str(TRAIN),
         "--out", "dist.npz"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for r in (0, 1)]
    outputs = [node.communicate(timeout=240) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert outputs[0][1].strip().splitlines()[-1].startswith("dpmigrate launch: rank 0 on this node finished.")
    assert outputs[1][1].strip().splitlines()[-1].startswith("dpmigrate launch: rank 1 on this node finished.")
    single = subprocess.run([sys.executable, str(TRAIN), "--out", "single.npz"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert single.returncode == 0, single.stderr
    with np.load(tmp_path / "single.npz") as a, np.load(tmp_path / "dist.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        assert max(float(np.abs(a[k] - b[k]).max()) for k in a.files) < 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_launcher_stops_every_process_of_the_job(tmp_path, signum):
    proc = launcher_process("-n", "2", "--log-dir", str(tmp_path / "logs"), str(TRAIN), "--steps", "2",
                            "--hold", str(tmp_path / "hold"), cwd=tmp_path)
    (tmp_path / "hold").write_text("")  # never removed: the ranks wait until they are stopped
    try:
        wait_for_files([tmp_path / "hold.rank0", tmp_path / "hold.rank1"], timeout_s=120)
        pids = descendants(proc.pid)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, err
    assert err.strip().splitlines()[-1].startswith(f"dpmigrate launch: {signal.Signals(signum).name} received; "
                                                   "all ranks were stopped.")
    assert [pid for pid in pids if alive(pid)] == []


@pytest.mark.slow
def test_a_frozen_rank_does_not_hang_the_job(tmp_path):
    """Rank 1 stops itself (SIGSTOP) mid-training: rank 0's gloo all-reduce times out (gloo's 30 s in Paddle
    3.3.1) and aborts, Paddle's launcher stops the job, dpmigrate kills what is left: the job ends, no hang.
    (The final line names rank 0, whose collective failed: Paddle has no heartbeat to name the frozen one.)"""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "dpmigrate.launch", "-n", "2", "--log-dir", str(tmp_path / "logs"), str(TRAIN),
         "--steps", "100000", "--die-rank", "1", "--die-signal", "SIGSTOP"],
        cwd=tmp_path, capture_output=True, text=True, timeout=240)
    elapsed = time.monotonic() - started
    final = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and "failed" in final, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "gloo::TimeoutException" in proc.stdout + proc.stderr
    assert elapsed < 150, f"the job took {elapsed:.0f} s to end after a rank froze"
