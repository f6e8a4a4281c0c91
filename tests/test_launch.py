"""``dpmigrate launch``: the torchrun command it builds, its refusals, and real 2-process jobs (slow)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from dpmigrate import launch, launch_torch
from dpmigrate.launch_job import Job, Outcome, RankFailure

TORCH_HEADER = """\
import datetime, os, signal, sys, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
rank = dist.get_rank()
"""


def write_script(tmp_path: Path, body: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(TORCH_HEADER + textwrap.dedent(body))
    return path


def dry_run(capsys, *argv: str) -> tuple[dict[str, str], list[str]]:
    """The environment and command ``--dry-run`` prints, parsed back from its shell line."""
    assert launch.main(["--dry-run", *argv]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# dpmigrate launch: torch")
    words = shlex.split(out[1])
    assert words[0] == "env"
    start = words.index(sys.executable)
    env = dict(word.split("=", 1) for word in words[1:start])
    return env, words[start:]


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


# ---------------------------------------------------------------- the command (fast)


def test_one_node_uses_standalone_rendezvous_advertised_on_loopback(tmp_path, capsys):
    script = write_script(tmp_path, "")
    _, command = dry_run(capsys, "-n", "2", str(script))
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--standalone" in command  # store port chosen by the OS: two jobs at once cannot clash
    assert flag(command, "--local-addr") == "127.0.0.1"
    assert flag(command, "--nproc-per-node") == "2"
    assert flag(command, "--max-restarts") == "0"
    assert float(flag(command, "--monitor-interval")) <= 0.5
    assert "--master-port" not in command and "--nnodes" not in command


def test_several_nodes_use_static_rendezvous_at_the_master(tmp_path, capsys):
    script = write_script(tmp_path, "")
    _, command = dry_run(capsys, "-n", "4", "--nnodes", "3", "--node-rank", "2", "--master", "node0:29511",
                         str(script))
    assert "--standalone" not in command
    assert [flag(command, f) for f in ("--rdzv-backend", "--nnodes", "--node-rank", "--master-addr",
                                       "--master-port", "--nproc-per-node")] == \
        ["static", "3", "2", "node0", "29511", "4"]


def test_ipv6_master_is_given_without_brackets(tmp_path, capsys):
    script = write_script(tmp_path, "")
    _, command = dry_run(capsys, "-n", "1", "--nnodes", "2", "--master", "[::1]:29500", str(script))
    assert (flag(command, "--master-addr"), flag(command, "--master-port")) == ("::1", "29500")


def test_script_and_its_arguments_come_last_unchanged(tmp_path, capsys):
    script = write_script(tmp_path, "")
    _, command = dry_run(capsys, "-n", "2", str(script), "--lr", "0.1", "-n", "5", "--dry-run")
    assert command[-6:] == [str(script), "--lr", "0.1", "-n", "5", "--dry-run"]


def test_ranks_get_one_omp_thread_unbuffered_output_and_the_timeout(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    script = write_script(tmp_path, "")
    env, _ = dry_run(capsys, "-n", "2", "--timeout", "20", str(script))
    assert env["OMP_NUM_THREADS"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["DPMIGRATE_TIMEOUT"] == "20"
    assert env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == launch_torch.PREFIX_TEMPLATE


def test_users_omp_num_threads_is_kept_and_no_timeout_is_invented(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    script = write_script(tmp_path, "")
    env, _ = dry_run(capsys, "-n", "2", str(script))
    assert "OMP_NUM_THREADS" not in env  # inherited as the user set it
    assert "DPMIGRATE_TIMEOUT" not in env


def test_log_dir_defaults_to_a_timestamped_dir_and_dry_run_creates_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = write_script(tmp_path, "")
    _, command = dry_run(capsys, "-n", "2", "train.py")
    torchrun_logs = Path(flag(command, "--log-dir"))
    assert re.fullmatch(r"\d{8}-\d{6}", torchrun_logs.parent.name)
    assert torchrun_logs.parent.parent == tmp_path / "dpmigrate-logs"
    assert not (tmp_path / "dpmigrate-logs").exists()
    _, command = dry_run(capsys, "-n", "2", "--log-dir", str(tmp_path / "mine"), str(script))
    assert Path(flag(command, "--log-dir")) == tmp_path / "mine" / "torchrun"


def test_two_jobs_started_in_the_same_second_get_two_log_dirs(tmp_path):
    first = launch._create_log_dir(tmp_path / "20260101-120000", unique=True)
    second = launch._create_log_dir(tmp_path / "20260101-120000", unique=True)
    assert (first.name, second.name) == ("20260101-120000", "20260101-120000-2")
    assert second.is_dir()


@pytest.mark.parametrize("argv, message", [
    (["-n", "0"], "-n 0: give the number of processes per node, 1 or more"),
    (["-n", "2", "--nnodes", "2", "--node-rank", "2", "--master", "h:1"], "node ranks run from 0 to 1"),
    (["-n", "2", "--nnodes", "2", "--node-rank", "-1", "--master", "h:1"], "node ranks run from 0 to 1"),
    (["-n", "2", "--nnodes", "2"], "--nnodes 2 needs --master HOST:PORT"),
    (["-n", "2", "--nnodes", "2", "--master", "node0"], "--master 'node0': give node 0's address and a port"),
    (["-n", "2", "--master", "node0:"], "--master 'node0:': give node 0's address and a port"),
    (["-n", "2", "--master", "node0:http"], "port 'http' is not a number"),
    (["-n", "2", "--master", "node0:70000"], "port '70000' is not a number from 1 to 65535"),
    (["-n", "2", "--timeout", "0"], "--timeout 0: give the collective timeout in seconds"),
])
def test_bad_arguments_exit_2_naming_the_fix(tmp_path, capsys, argv, message):
    script = write_script(tmp_path, "")
    assert launch.main([*argv, str(script)]) == 2
    assert message in capsys.readouterr().err


def test_missing_script_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert launch.main(["-n", "2", "nope.py"]) == 2
    assert f"nope.py: no such script (looked in {tmp_path})" in capsys.readouterr().err


def test_missing_nproc_is_an_argparse_error(tmp_path, capsys):
    assert launch.main([str(write_script(tmp_path, ""))]) == 2
    assert "-n/--nproc-per-node" in capsys.readouterr().err


@pytest.mark.parametrize("source, framework, alternative", [
    ("import tensorflow as tf\n", "tensorflow", "TF_CONFIG"),
    ("from keras import layers\n", "tensorflow", "TF_CONFIG"),
    ("import paddle\nimport paddle.distributed as dist\n", "paddle", "python -m paddle.distributed.launch"),
    ("import dpmigrate.runtime.paddle as dp\n", "paddle", "python -m paddle.distributed.launch"),
])
def test_tensorflow_and_paddle_scripts_are_refused_naming_what_to_use(tmp_path, capsys, monkeypatch, source,
                                                                      framework, alternative):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "train.py"
    script.write_text(source)
    assert launch.main(["-n", "2", str(script)]) == 2
    err = capsys.readouterr().err
    assert f"uses {framework}, which is not yet supported by dpmigrate launch; use: " in err
    assert alternative in err
    assert not (tmp_path / "dpmigrate-logs").exists()  # refused before anything was created


@pytest.mark.parametrize("source, expected", [
    ("import torch\n", "torch"),
    ("from torch import nn\n", "torch"),
    ("import torchvision.models as m\n", "torch"),
    ("def main():\n    import torch.distributed as dist\n", "torch"),
    # a converted script names its runtime; that wins over whatever else it imports
    ("import dpmigrate.runtime.torch as dp\nimport tensorflow as tf\n", "torch"),
    ("from dpmigrate.runtime import tensorflow as dp\nimport torch\n", "tensorflow"),
])
def test_framework_is_read_from_the_imports(tmp_path, source, expected):
    script = tmp_path / "train.py"
    script.write_text(source)
    assert launch.detect_framework(script) == expected


@pytest.mark.parametrize("source, message", [
    ("import numpy\n", "imports none of torch, tensorflow, paddle"),
    ("import torch\nimport tensorflow\n", "imports tensorflow and torch; pass --framework"),
    ("from . import torch\n", "imports none of"),  # a local module named torch is not the framework
    ("import torch\ndef f(:\n", "train.py:2: cannot read the script's imports"),
])
def test_undecidable_framework_asks_for_framework_flag(tmp_path, capsys, source, message):
    script = tmp_path / "train.py"
    script.write_text(source)
    assert launch.main(["-n", "2", str(script)]) == 2
    err = capsys.readouterr().err
    assert message in err and "--framework" in err


def test_framework_flag_skips_detection(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("import mylib  # trains with torch inside\n")
    assert launch.main(["-n", "2", "--framework", "torch", "--dry-run", str(script)]) == 0
    assert "torch.distributed.run" in capsys.readouterr().out


def test_importing_the_launcher_imports_no_framework():
    code = ("import sys, dpmigrate.launch; "
            "print([m for m in ('torch', 'tensorflow', 'paddle') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------- reading torchrun (fast)


def test_rank_prefix_is_split_off_and_launcher_lines_are_kept_whole():
    assert launch_torch.split_rank("[rank12] loss 0.3\n") == (12, "loss 0.3\n")
    assert launch_torch.split_rank("[rank0] [rank0]: Traceback\n") == (0, "[rank0]: Traceback\n")
    line = "W1122 06:18:50.218000 4266 torch/distributed/elastic/multiprocessing/api.py:1028] Sending\n"
    assert launch_torch.split_rank(line) == (None, line)


def test_failures_are_parsed_from_the_pinned_torchs_own_summary():
    pytest.importorskip("torch")
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    failures = {1: ProcessFailure(local_rank=1, pid=11, exitcode=-9, error_file="<N/A>"),
                0: ProcessFailure(local_rank=0, pid=10, exitcode=-15, error_file="<N/A>"),
                3: ProcessFailure(local_rank=3, pid=13, exitcode=3, error_file="<N/A>")}
    summary = ChildFailedError("train.py", failures).format_msg().splitlines()
    assert sorted(launch_torch.parse_failures(summary), key=lambda f: f.rank) == [
        RankFailure(0, -15), RankFailure(1, -9, root_cause=True), RankFailure(3, 3)]


def test_torchruns_own_frames_are_hidden_but_its_failure_summary_is_shown():
    held = ["Traceback (most recent call last):\n", '  File "run.py", line 1\n',
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n",
            "=====\n", "train.py FAILED\n"]
    assert launch_torch.trim_traceback(held) == ["=====\n", "train.py FAILED\n"]
    signalled = ["Traceback (most recent call last):\n",
                 "torch.distributed.elastic.multiprocessing.api.SignalException: Process 1 got signal: 2\n"]
    assert launch_torch.trim_traceback(signalled) == []
    other = ["Traceback (most recent call last):\n", "RuntimeError: rendezvous timed out\n"]
    assert launch_torch.trim_traceback(other) == other


def test_ranks_stopped_by_the_launcher_are_not_blamed_and_signal_deaths_come_first():
    failures = [RankFailure(0, 1, root_cause=True), RankFailure(1, -9), RankFailure(2, -15)]
    assert launch.failed_ranks(failures) == [RankFailure(1, -9), RankFailure(0, 1, root_cause=True)]
    assert launch.failed_ranks([RankFailure(3, -15, root_cause=True)]) == [RankFailure(3, -15, root_cause=True)]


def _job(tmp_path: Path, nproc: int = 2, nnodes: int = 1) -> Job:
    return Job(nproc_per_node=nproc, nnodes=nnodes, node_rank=0, master=None, script=tmp_path / "t.py",
               script_args=(), log_dir=tmp_path, timeout_s=None)


def test_final_line_names_the_failed_rank_and_returns_its_exit_code(tmp_path):
    code, line = launch.final_line(Outcome(1, None, []), _job(tmp_path, 4),
                                   [RankFailure(2, -9, root_cause=True), RankFailure(0, -15)], "torchrun")
    assert code == 128 + 9
    assert line == ("dpmigrate launch: rank 2 failed (killed by SIGKILL); the other ranks were stopped. "
                    f"Logs: {tmp_path}")


def test_final_line_when_interrupted_succeeded_or_unexplained(tmp_path):
    assert launch.final_line(Outcome(1, signal.SIGINT, []), _job(tmp_path), [], "torchrun")[0] == 130
    assert launch.final_line(Outcome(0, None, []), _job(tmp_path), [], "torchrun") == (
        0, f"dpmigrate launch: all 2 ranks finished. Logs: {tmp_path}")
    code, line = launch.final_line(Outcome(1, None, []), _job(tmp_path), [], "torchrun")
    assert code == 1 and "torchrun failed (exit code 1) without naming a failed rank" in line


# ---------------------------------------------------------------- real jobs (slow)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie nobody reaped yet is dead too
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def wait_for_files(paths: list[Path], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() and p.read_text().endswith("\n") for p in paths):
        assert time.monotonic() < deadline, f"the ranks did not start: {[str(p) for p in paths if not p.exists()]}"
        time.sleep(0.1)


def launcher_process(*argv: str, cwd: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return subprocess.Popen([sys.executable, "-m", "dpmigrate.launch", *argv], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_two_ranks_stream_prefixed_output_and_keep_per_rank_logs(tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the launcher must set it to 1 itself
    script = write_script(tmp_path, """\
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        print(f"rank={rank} sum={t.item():g} omp={os.environ.get('OMP_NUM_THREADS')} "
              f"master={os.environ['MASTER_ADDR']} timeout={os.environ.get('DPMIGRATE_TIMEOUT')}")
        print(f"warning from rank {rank}", file=sys.stderr)
        dist.destroy_process_group()
    """)
    assert launch.main(["-n", "2", "--timeout", "25", str(script)]) == 0
    out, err = capfd.readouterr()
    for rank in (0, 1):
        assert f"[rank{rank}] rank={rank} sum=3 omp=1 master=127.0.0.1 timeout=25\n" in out
        assert f"[rank{rank}] warning from rank {rank}\n" in err
    (log_dir,) = (tmp_path / "dpmigrate-logs").iterdir()
    for rank in (0, 1):
        lines = (log_dir / f"rank{rank}.log").read_text().splitlines()
        assert f"rank={rank} sum=3 omp=1 master=127.0.0.1 timeout=25" in lines
        assert f"warning from rank {rank}" in lines
        assert not any(line.startswith("[rank") for line in lines)
    assert err.rstrip().splitlines()[-1] == f"dpmigrate launch: all 2 ranks finished. Logs: {log_dir}"


@pytest.mark.slow
def test_rank_exiting_with_code_3_fails_the_job_naming_rank_1(tmp_path, capfd):
    script = write_script(tmp_path, """\
        print(f"started {rank}")
        if rank == 1:
            sys.exit(3)
        time.sleep(25)
        dist.destroy_process_group()
    """)
    log_dir = tmp_path / "logs"
    started = time.monotonic()
    assert launch.main(["-n", "2", "--log-dir", str(log_dir), str(script)]) == 3
    assert time.monotonic() - started < 20  # rank 0 was stopped, not waited for
    err = capfd.readouterr().err
    assert err.rstrip().splitlines()[-1] == \
        f"dpmigrate launch: rank 1 failed (exit code 3); the other ranks were stopped. Logs: {log_dir}"
    assert "started 1" in (log_dir / "rank1.log").read_text().splitlines()
    assert "rank      : 1 (local_rank: 1)" in (log_dir / "launcher.log").read_text()


@pytest.mark.slow
def test_rank_killed_by_sigkill_ends_the_job_while_its_peer_waits_in_all_reduce(tmp_path, capfd):
    script = write_script(tmp_path, """\
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        t = torch.ones(1)
        dist.all_reduce(t)  # rank 0 waits here for a peer that is gone (20 s timeout)
        dist.destroy_process_group()
    """)
    started = time.monotonic()
    code = launch.main(["-n", "2", "--log-dir", str(tmp_path / "logs"), str(script)])
    assert time.monotonic() - started < 20
    assert code == 128 + signal.SIGKILL
    final = capfd.readouterr().err.rstrip().splitlines()[-1]
    assert final.startswith("dpmigrate launch: rank 1 failed (killed by SIGKILL)")


PID_SCRIPT = """\
    Path = __import__("pathlib").Path
    Path(sys.argv[1], f"pids{rank}").write_text(f"{os.getpid()} {os.getppid()}\\n")
    if len(sys.argv) > 2:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(60)
    dist.destroy_process_group()
"""


def stop_and_collect(proc: subprocess.Popen, tmp_path: Path, *signals: int) -> tuple[int, str, list[int]]:
    pid_files = [tmp_path / f"pids{r}" for r in (0, 1)]
    wait_for_files(pid_files)
    for signum in signals:
        proc.send_signal(signum)
        time.sleep(1)
    try:
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    pids = sorted({int(p) for f in pid_files for p in f.read_text().split()})  # both ranks and torchrun
    return proc.returncode, err, pids


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_launcher_stops_every_rank(tmp_path, signum):
    script = write_script(tmp_path, PID_SCRIPT)
    proc = launcher_process("-n", "2", "--log-dir", str(tmp_path / "logs"), str(script), str(tmp_path),
                            cwd=tmp_path)
    code, err, pids = stop_and_collect(proc, tmp_path, signum)
    assert code == 128 + signum
    assert f"dpmigrate launch: {signal.Signals(signum).name} received; all ranks were stopped." in err
    assert [pid for pid in pids if alive(pid)] == []


@pytest.mark.slow
def test_a_second_ctrl_c_kills_ranks_that_ignore_the_first(tmp_path):
    script = write_script(tmp_path, PID_SCRIPT)
    proc = launcher_process("-n", "2", "--log-dir", str(tmp_path / "logs"), str(script), str(tmp_path),
                            "ignore-signals", cwd=tmp_path)
    started = time.monotonic()
    code, _, pids = stop_and_collect(proc, tmp_path, signal.SIGINT, signal.SIGINT)
    assert code == 130
    assert time.monotonic() - started < 25  # not torchrun's 10 s shutdown timeout plus our grace
    assert [pid for pid in pids if alive(pid)] == []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_meet_at_the_master_with_static_rendezvous(tmp_path):
    script = write_script(tmp_path, """\
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        print(f"rank={rank} of {dist.get_world_size()} sum={t.item():g}")
        dist.destroy_process_group()
    """)
    master = f"127.0.0.1:{free_port()}"
    nodes = [launcher_process("-n", "1", "--nnodes", "2", "--node-rank", str(node), "--master", master,
                              "--log-dir", str(tmp_path / f"node{node}"), str(script), cwd=tmp_path)
             for node in (0, 1)]
    try:
        results = [node.communicate(timeout=30) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    for node, (proc, (out, err)) in enumerate(zip(nodes, results)):
        assert proc.returncode == 0, err
        assert f"[rank{node}] rank={node} of 2 sum=3\n" in out
        assert f"rank={node} of 2 sum=3" in (tmp_path / f"node{node}" / f"rank{node}.log").read_text().splitlines()
        assert f"dpmigrate launch: rank {node} on this node finished." in err
