"""``dpmigrate launch``: the processes it plans, its refusals, its report, and real 2-process jobs (slow)."""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shlex
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import dpmigrate.launch
from dpmigrate.launch import backend as launch_backend
from dpmigrate.launch import cli, report
from dpmigrate.launch import torch as torch_backend
from dpmigrate.launch.backend import Job, Outcome, RankExit
from dpmigrate.launch.processes import descendants

pytestmark = pytest.mark.alone  # its slow jobs time how fast a failure or a signal ends them: run one at a time

LAUNCH_PACKAGE = Path(dpmigrate.launch.__file__).parent

TORCH_HEADER = """\
import datetime, os, signal, sys, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
rank = dist.get_rank()
"""


def write_script(tmp_path: Path, body: str, name: str = "train.py", header: str = TORCH_HEADER) -> Path:
    path = tmp_path / name
    path.write_text(header + textwrap.dedent(body))
    return path


def dry_run(capsys, *argv: str) -> tuple[str, dict[str, tuple[dict[str, str], list[str]]]]:
    """The header ``--dry-run`` prints and, by process name, the environment and command of each
    process, parsed back from its shell line."""
    assert dpmigrate.launch.main(["--dry-run", *argv]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# dpmigrate launch: torch")
    processes = {}
    for comment, line in zip(out[1::2], out[2::2]):
        name = re.fullmatch(r"# (\S+) \(.*\)", comment).group(1)
        words = shlex.split(line)
        assert words[0] == "env"
        start = words.index(sys.executable)
        processes[name] = dict(word.split("=", 1) for word in words[1:start]), words[start:]
    return out[0], processes


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# ---------------------------------------------------------------- one node: the plan (fast)


def test_one_node_starts_each_rank_itself_with_torchruns_variables_and_no_torchrun(tmp_path, capsys):
    script = write_script(tmp_path, "")
    _, processes = dry_run(capsys, "-n", "2", str(script), "--lr", "0.1")
    assert sorted(processes) == ["rank0", "rank1", "store"]
    for rank in (0, 1):
        env, command = processes[f"rank{rank}"]
        assert command == [sys.executable, str(script), "--lr", "0.1"]
        assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                    "GROUP_WORLD_SIZE")} == {
            "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1"}
    assert "torch.distributed.run" not in str(processes)


def test_one_node_meets_in_a_private_file_and_on_loopback_only(tmp_path, capsys):
    script = write_script(tmp_path, "")
    header, processes = dry_run(capsys, "-n", "2", "--log-dir", str(tmp_path / "logs"), str(script))
    env, _ = processes["rank0"]
    rendezvous = Path(env["DPMIGRATE_RENDEZVOUS"])
    assert rendezvous.parent == tmp_path / "logs" and rendezvous.is_absolute()
    assert env["GLOO_SOCKET_IFNAME"] == "lo"  # gloo listens on 127.0.0.1
    # scripts that call init_process_group() themselves: a client of the store on 127.0.0.1, none of their own
    assert (env["MASTER_ADDR"], env["TORCHELASTIC_USE_AGENT_STORE"]) == ("127.0.0.1", "True")
    assert processes["store"][1] == [sys.executable, "-m", "dpmigrate.launch.torch_store"]
    assert processes["rank1"][0]["DPMIGRATE_RENDEZVOUS"] == str(rendezvous)


def test_each_one_node_job_gets_an_unguessable_rendezvous_name(tmp_path, capsys):
    script = write_script(tmp_path, "")
    names = {Path(dry_run(capsys, "-n", "2", str(script))[1]["rank0"][0]["DPMIGRATE_RENDEZVOUS"]).name
             for _ in range(3)}
    assert len(names) == 3
    for name in names:
        assert re.fullmatch(r"rendezvous-[0-9a-f]{32}", name)  # 128 random bits


def test_ranks_get_one_omp_thread_unbuffered_output_and_the_timeout(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    script = write_script(tmp_path, "")
    _, processes = dry_run(capsys, "-n", "2", "--timeout", "20", str(script))
    for name in ("rank0", "rank1"):
        env = processes[name][0]
        assert (env["OMP_NUM_THREADS"], env["PYTHONUNBUFFERED"], env["DPMIGRATE_TIMEOUT"]) == ("1", "1", "20")


def test_users_omp_num_threads_is_kept_and_no_timeout_is_invented(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    script = write_script(tmp_path, "")
    env = dry_run(capsys, "-n", "2", str(script))[1]["rank0"][0]
    assert "OMP_NUM_THREADS" not in env  # inherited as the user set it
    assert "DPMIGRATE_TIMEOUT" not in env


def test_log_dir_defaults_to_a_timestamped_dir_and_dry_run_creates_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_script(tmp_path, "")
    header, processes = dry_run(capsys, "-n", "2", "train.py")
    log_dir = Path(processes["rank0"][0]["DPMIGRATE_RENDEZVOUS"]).parent
    assert header.endswith(f"logs in {log_dir}")
    assert re.fullmatch(r"\d{8}-\d{6}", log_dir.name)
    assert log_dir.parent == tmp_path / "dpmigrate-logs"
    assert not (tmp_path / "dpmigrate-logs").exists()


def test_two_jobs_started_in_the_same_second_get_two_log_dirs(tmp_path):
    first = cli._create_log_dir(tmp_path / "20260101-120000", unique=True)
    second = cli._create_log_dir(tmp_path / "20260101-120000", unique=True)
    assert (first.name, second.name) == ("20260101-120000", "20260101-120000-2")
    assert second.is_dir()


def test_log_dirs_dpmigrate_creates_are_private_whatever_the_umask(tmp_path):
    (tmp_path / "mine").mkdir(mode=0o755)
    old = os.umask(0o022)
    try:
        default = cli._create_log_dir(tmp_path / "dpmigrate-logs" / "20260101-120000", unique=True)
        given = cli._create_log_dir(tmp_path / "mine" / "a" / "b", unique=False)
    finally:
        os.umask(old)
    for created in (default, default.parent, given, given.parent):
        assert mode(created) == 0o700, created
    assert mode(tmp_path / "mine") == 0o755  # the user's own folder is left alone


# ---------------------------------------------------------------- several nodes: the plan (fast)

RUN_ID = "0123456789abcdef0123456789abcdef"


def test_several_nodes_use_static_rendezvous_at_the_master_with_the_shared_run_id(tmp_path, capsys):
    script = write_script(tmp_path, "")
    _, processes = dry_run(capsys, "-n", "4", "--nnodes", "3", "--node-rank", "2", "--master", "node0:29511",
                           "--run-id", RUN_ID, "--log-dir", str(tmp_path / "logs"), str(script), "--lr", "1")
    assert list(processes) == ["torchrun"]
    env, command = processes["torchrun"]
    # torchrun, with dpmigrate's static rendezvous registered (node 0's store on one address, a start timeout)
    assert command[:3] == [sys.executable, "-m", "dpmigrate.launch.torch_rendezvous"]
    assert "--standalone" not in command
    assert [flag(command, f) for f in ("--rdzv-backend", "--rdzv-id", "--nnodes", "--rdzv-endpoint",
                                       "--nproc-per-node", "--max-restarts")] == \
        ["dpmigrate-static", RUN_ID, "3", "node0:29511", "4", "0"]
    conf = dict(item.split("=") for item in flag(command, "--rdzv-conf").split(","))
    assert (conf["rank"], conf["start_timeout"], conf["nproc"]) == ("2", "60", "4")
    assert float(flag(command, "--monitor-interval")) <= 0.5
    # each rank runs under the wrapper that records its exit status; the script and its arguments last
    assert command[command.index("--module"):] == [
        "--module", "dpmigrate.launch.rank_status", str(tmp_path / "logs" / "rank-status"), str(script), "--lr", "1"]
    assert env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == torch_backend.PREFIX_TEMPLATE


def test_ipv6_master_is_given_without_brackets(tmp_path, capsys):
    script = write_script(tmp_path, "")
    command = dry_run(capsys, "-n", "1", "--nnodes", "2", "--master", "[::1]:29500", "--run-id", RUN_ID,
                      str(script))[1]["torchrun"][1]
    assert flag(command, "--rdzv-endpoint") == "[::1]:29500"


def test_one_node_with_a_master_gets_a_fresh_random_run_id(tmp_path, capsys):
    script = write_script(tmp_path, "")
    ids = {flag(dry_run(capsys, "-n", "2", "--master", "127.0.0.1:29500", str(script))[1]["torchrun"][1],
                "--rdzv-id") for _ in range(2)}
    assert len(ids) == 2 and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)


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
    (["-n", "2", "--start-timeout", "-1"], "--start-timeout -1: give the seconds the nodes have to meet"),
    (["-n", "2", "--nnodes", "2", "--master", "h:1"], "--nnodes 2 needs --run-id ID, the same secret on every node"),
    (["-n", "2", "--nnodes", "2", "--master", "h:1", "--run-id", "none"], "--run-id 'none': give 16 to 128"),
])
def test_bad_arguments_exit_2_naming_the_fix(tmp_path, capsys, argv, message):
    script = write_script(tmp_path, "")
    assert dpmigrate.launch.main([*argv, str(script)]) == 2
    assert message in capsys.readouterr().err


def test_missing_script_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert dpmigrate.launch.main(["-n", "2", "nope.py"]) == 2
    assert f"nope.py: no such script (looked in {tmp_path})" in capsys.readouterr().err


def test_missing_nproc_is_an_argparse_error(tmp_path, capsys):
    assert dpmigrate.launch.main([str(write_script(tmp_path, ""))]) == 2
    assert "-n/--nproc-per-node" in capsys.readouterr().err


# ---------------------------------------------------------------- frameworks (fast)


@pytest.mark.parametrize("source, expected", [
    ("import torch\n", "torch"),
    ("from torch import nn\n", "torch"),
    ("import torchvision.models as m\n", "torch"),
    ("def main():\n    import torch.distributed as dist\n", "torch"),
    ("import lightning as L\n", "torch"),
    # a converted script names its runtime; that wins over whatever else it imports
    ("import dpmigrate.runtime.torch as dp\nimport tensorflow as tf\n", "torch"),
    ("from dpmigrate.runtime import tensorflow as dp\nimport torch\n", "tensorflow"),
])
def test_framework_is_read_from_the_imports(tmp_path, source, expected):
    script = tmp_path / "train.py"
    script.write_text(source)
    assert cli.detect_framework(script) == expected


@pytest.mark.parametrize("source, message", [
    ("import numpy\n", "imports none of torch, tensorflow, paddle"),
    ("import torch\nimport tensorflow\n", "imports tensorflow and torch; pass --framework"),
    ("from . import torch\n", "imports none of"),  # a local module named torch is not the framework
    ("import torch\ndef f(:\n", "train.py:2: cannot read the script's imports"),
])
def test_undecidable_framework_asks_for_framework_flag(tmp_path, capsys, source, message):
    script = tmp_path / "train.py"
    script.write_text(source)
    assert dpmigrate.launch.main(["-n", "2", str(script)]) == 2
    err = capsys.readouterr().err
    assert message in err and "--framework" in err


def test_framework_flag_skips_detection(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("import mylib  # trains with torch inside\n")
    header, processes = dry_run(capsys, "-n", "2", "--framework", "torch", str(script))
    assert header.startswith("# dpmigrate launch: torch, ranks 0-1 of 2")
    assert processes["rank1"][1] == [sys.executable, str(script)]


@pytest.mark.parametrize("module", ["dpmigrate.launch", "dpmigrate.launch.cli", "dpmigrate.launch.supervise",
                                    "dpmigrate.launch.torch", "dpmigrate.launch.rank_status",
                                    "dpmigrate.launch.paddle", "dpmigrate.launch.paddle_rank",
                                    "dpmigrate.launch.paddle_launcher", "dpmigrate.launch.network",
                                    "dpmigrate.launch.torch_rendezvous", "dpmigrate.launch.tensorflow",
                                    "dpmigrate.launch.tensorflow_worker", "dpmigrate.launch.private_network",
                                    "dpmigrate.launch.paddle_nodes"])
def test_importing_the_launcher_imports_no_framework(module):
    code = f"import sys, {module}; print([m for m in ('torch', 'tensorflow', 'paddle') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _backend_members_used(path: Path) -> set[str]:
    """``backend.X`` and ``self.backend.X`` in a module's source."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "backend") or (
                    isinstance(owner, ast.Attribute) and owner.attr == "backend"):
                used.add(node.attr)
    return used


def test_the_backend_protocol_declares_every_member_the_launcher_uses_and_torch_has_them():
    declared = {name for name in vars(launch_backend.Backend) if not name.startswith("_")}
    used = set().union(*(_backend_members_used(p) for p in LAUNCH_PACKAGE.glob("*.py")))
    assert used, "found no use of a backend: the scan is broken"
    assert used <= declared, f"used but not declared in Backend: {sorted(used - declared)}"
    for backend in cli.BACKENDS.values():
        assert all(callable(getattr(backend, name, None)) for name in declared), backend.__name__


# ---------------------------------------------------------------- torchrun's output and the report (fast)


def test_rank_prefix_is_split_off_and_launcher_lines_are_kept_whole():
    assert torch_backend.split_rank("[rank12] loss 0.3\n") == (12, "loss 0.3\n")
    assert torch_backend.split_rank("[rank0] [rank0]: Traceback\n") == (0, "[rank0]: Traceback\n")
    line = "W1122 06:18:50.218000 4266 torch/distributed/elastic/multiprocessing/api.py:1028] Sending\n"
    assert torch_backend.split_rank(line) == (None, line)


def test_torchruns_own_frames_are_hidden_and_an_unknown_format_is_shown_whole():
    held = ["Traceback (most recent call last):\n", '  File "run.py", line 1\n',
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n",
            "=====\n", "train.py FAILED\n"]
    assert torch_backend.trim_traceback(held) == ["=====\n", "train.py FAILED\n"]
    signalled = ["Traceback (most recent call last):\n",
                 "torch.distributed.elastic.multiprocessing.api.SignalException: Process 1 got signal: 2\n"]
    assert torch_backend.trim_traceback(signalled) == []
    other = ["Traceback (most recent call last):\n", "torch.SomeFutureError: workers 1 and 3 died\n"]
    assert torch_backend.trim_traceback(other) == other


def test_torchruns_busy_master_port_traceback_becomes_one_line():
    held = ["Traceback (most recent call last):\n", '  File "static_tcp_rendezvous.py", line 67, in next_rendezvous\n',
            # torch 2.13's own text, from a real run with the port taken
            "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
            "address. port: 59755, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use\n"]
    assert torch_backend.trim_traceback(held) == [
        "dpmigrate launch: the --master port 59755 is in use on this machine (torchrun's store could not listen "
        "on it); pick a free port\n"]


def test_a_busy_master_port_is_refused_on_node_0_only(tmp_path, capsys):
    script = write_script(tmp_path, "")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert dpmigrate.launch.main(["-n", "2", "--master", f"localhost:{port}", str(script)]) == 2
        assert f"--master localhost:{port}: the port is in use on this machine; pick a free port, e.g. --master " \
               "localhost:" in capsys.readouterr().err
        # another node's launcher does not serve the store (node 0 does, on this port): it accepts the request
        args = cli._parser().parse_args(["-n", "2", "--nnodes", "2", "--node-rank", "1", "--master",
                                         f"127.0.0.1:{port}", "--run-id", RUN_ID, str(script)])
        assert cli._job(args).master == ("127.0.0.1", port)


def test_ranks_that_were_stopped_are_never_blamed_and_signal_deaths_come_first():
    exits = [RankExit(0, 1, stopped=False, ended=10.0), RankExit(1, -9, stopped=False, ended=10.2),
             RankExit(2, -15, stopped=True, ended=10.3), RankExit(3, 1, stopped=True, ended=10.3),
             RankExit(4, 0, stopped=False, ended=9.0), RankExit(5, 2, stopped=False, ended=9.5)]
    assert [e.rank for e in report.failed_ranks(exits)] == [1, 5, 0]


def _job(tmp_path: Path, nproc: int = 2, nnodes: int = 1) -> Job:
    return Job(nproc_per_node=nproc, nnodes=nnodes, node_rank=0, master=None, script=tmp_path / "t.py",
               script_args=(), log_dir=tmp_path, timeout_s=None, run_id=RUN_ID)


def _outcome(*exits: RankExit, launcher: int | None = None, interrupted: int | None = None) -> Outcome:
    return Outcome({e.rank: e for e in exits}, launcher, interrupted, [])


def test_final_line_names_the_failed_rank_and_returns_its_exit_code(tmp_path):
    code, line = report.final_line(
        _outcome(RankExit(2, -9, False, 1.0), RankExit(0, -15, True, 1.1), RankExit(1, 0, False, 0.5),
                 RankExit(3, -15, True, 1.1)), _job(tmp_path, 4), None)
    assert code == 128 + 9
    assert line == ("dpmigrate launch: rank 2 failed (killed by SIGKILL); the other ranks were stopped. "
                    f"Logs: {tmp_path}")


def test_final_line_names_a_frozen_rank_first_as_killed_with_sigkill(tmp_path):
    outcome = _outcome(RankExit(0, 1, False, 2.0), RankExit(1, -9, True, 1.0), RankExit(2, -15, True, 2.1))
    outcome.lost = {1: 0}
    assert report.final_line(outcome, _job(tmp_path, 3), None) == (128 + signal.SIGKILL, (
        "dpmigrate launch: rank 1 stopped responding (rank 0 lost it: no heartbeat), so it was killed; rank 0 "
        f"failed (exit code 1); the other ranks were stopped. Logs: {tmp_path}"))


def test_final_line_when_interrupted_or_succeeded(tmp_path):
    assert report.final_line(_outcome(RankExit(0, -2, True, 1.0), interrupted=signal.SIGINT), _job(tmp_path),
                             None)[0] == 130
    assert report.final_line(_outcome(RankExit(0, 0, False, 1.0), RankExit(1, 0, False, 1.0)), _job(tmp_path),
                             None) == (0, f"dpmigrate launch: all 2 ranks finished. Logs: {tmp_path}")


def test_final_line_when_the_launcher_failed_but_no_rank_did_names_the_silent_ranks(tmp_path):
    code, line = report.final_line(_outcome(RankExit(0, 0, False, 1.0), launcher=-6), _job(tmp_path), "torchrun")
    assert code == 128 + 6
    assert line == ("dpmigrate launch: torchrun failed (killed by SIGABRT) and no rank failed by itself; no exit "
                    f"status from rank(s) 1; see its messages above. Logs: {tmp_path}")


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


def wait_for_files(paths: list[Path], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.exists() and p.read_text().endswith("\n") for p in paths):
        assert time.monotonic() < deadline, f"the ranks did not start: {[str(p) for p in paths if not p.exists()]}"
        time.sleep(0.1)


def launcher_process(*argv: str, cwd: Path) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    return subprocess.Popen([sys.executable, "-m", "dpmigrate.launch", *argv], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_ranks_stream_prefixed_output_and_keep_private_per_rank_logs(tmp_path, capfd, monkeypatch):
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
    assert dpmigrate.launch.main(["-n", "2", "--timeout", "25", str(script)]) == 0
    out, err = capfd.readouterr()
    for rank in (0, 1):
        assert f"[rank{rank}] rank={rank} sum=3 omp=1 master=127.0.0.1 timeout=25\n" in out
        assert f"[rank{rank}] warning from rank {rank}\n" in err
    (log_dir,) = (tmp_path / "dpmigrate-logs").iterdir()
    assert mode(log_dir) == mode(log_dir.parent) == 0o700
    for rank in (0, 1):
        lines = (log_dir / f"rank{rank}.log").read_text().splitlines()
        assert f"rank={rank} sum=3 omp=1 master=127.0.0.1 timeout=25" in lines
        assert f"warning from rank {rank}" in lines
        assert not any(line.startswith("[rank") for line in lines)
    assert {p.name: mode(p) for p in log_dir.iterdir()} == {  # the rendezvous file is gone
        "rank0.log": 0o600, "rank1.log": 0o600, "launcher.log": 0o600}
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
    assert dpmigrate.launch.main(["-n", "2", "--log-dir", str(log_dir), str(script)]) == 3
    assert time.monotonic() - started < 20  # rank 0 was stopped, not waited for
    err = capfd.readouterr().err
    assert err.rstrip().splitlines()[-1] == \
        f"dpmigrate launch: rank 1 failed (exit code 3); the other ranks were stopped. Logs: {log_dir}"
    assert "started 1" in (log_dir / "rank1.log").read_text().splitlines()


@pytest.mark.slow
def test_rank_killed_by_sigkill_is_named_not_its_peer_waiting_in_all_reduce(tmp_path, capfd):
    script = write_script(tmp_path, """\
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        t = torch.ones(1)
        dist.all_reduce(t)  # rank 0 waits here for a peer that is gone: its connection breaks (exit 1)
        dist.destroy_process_group()
    """)
    started = time.monotonic()
    code = dpmigrate.launch.main(["-n", "2", "--log-dir", str(tmp_path / "logs"), str(script)])
    assert time.monotonic() - started < 20
    assert code == 128 + signal.SIGKILL
    final = capfd.readouterr().err.rstrip().splitlines()[-1]
    assert final.startswith("dpmigrate launch: rank 1 failed (killed by SIGKILL)")


PID_SCRIPT = """\
    Path = __import__("pathlib").Path
    worker = __import__("subprocess").Popen(["sleep", "60"])  # like a DataLoader worker: in the rank's group
    if len(sys.argv) > 2:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    Path(sys.argv[1], f"pids{rank}").write_text(f"{os.getpid()} {worker.pid} {os.getppid()}\\n")
    time.sleep(60)
    dist.destroy_process_group()
"""


def job_pids(tmp_path: Path) -> list[int]:
    pid_files = [tmp_path / f"pids{r}" for r in (0, 1)]
    wait_for_files(pid_files)
    return sorted({int(p) for f in pid_files for p in f.read_text().split()})  # ranks, workers, parents


def stop_and_collect(proc: subprocess.Popen, tmp_path: Path, *signals: int) -> tuple[int, str, list[int]]:
    pids = job_pids(tmp_path)
    for signum in signals:
        proc.send_signal(signum)
        time.sleep(1)
    try:
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    return proc.returncode, err, pids


@pytest.mark.slow
@pytest.mark.parametrize("signum, torchrun", [(signal.SIGINT, False), (signal.SIGTERM, False), (signal.SIGINT, True)],
                         ids=["SIGINT", "SIGTERM", "SIGINT-torchrun"])
def test_a_signal_to_the_launcher_stops_every_rank_and_its_workers(tmp_path, signum, torchrun):
    script = write_script(tmp_path, PID_SCRIPT)
    master = ["--master", f"127.0.0.1:{free_port()}"] if torchrun else []
    proc = launcher_process("-n", "2", *master, "--log-dir", str(tmp_path / "logs"), str(script), str(tmp_path),
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
    pids = job_pids(tmp_path)
    proc.send_signal(signal.SIGINT)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    second = time.monotonic()
    try:
        proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert time.monotonic() - second < 3  # killed at once, not after the rest of the grace (4 s more)
    assert [pid for pid in pids if alive(pid)] == []


@pytest.mark.slow
def test_ranks_die_with_a_launcher_that_is_killed(tmp_path):
    script = write_script(tmp_path, PID_SCRIPT)
    proc = launcher_process("-n", "2", "--log-dir", str(tmp_path / "logs"), str(script), str(tmp_path),
                            cwd=tmp_path)
    job_pids(tmp_path)
    ranks = [int((tmp_path / f"pids{r}").read_text().split()[0]) for r in (0, 1)]
    proc.kill()  # SIGKILL: no handler runs; the kernel's PR_SET_PDEATHSIG must end the ranks
    proc.communicate()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [pid for pid in ranks if alive(pid)] == []


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
                              "--run-id", RUN_ID, "--log-dir", str(tmp_path / f"node{node}"), str(script),
                              cwd=tmp_path)
             for node in (0, 1)]
    try:
        results = [node.communicate(timeout=60) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    for node, (proc, (out, err)) in enumerate(zip(nodes, results)):
        assert proc.returncode == 0, err
        assert f"[rank{node}] rank={node} of 2 sum=3\n" in out
        assert f"rank={node} of 2 sum=3" in (tmp_path / f"node{node}" / f"rank{node}.log").read_text().splitlines()
        assert f"dpmigrate launch: rank {node} on this node finished." in err


@pytest.mark.slow
def test_under_torchrun_the_failed_rank_comes_from_its_recorded_exit_not_from_torchruns_text(tmp_path, capfd):
    script = write_script(tmp_path, """\
        if rank == 1:
            sys.exit(3)
        time.sleep(25)
        dist.destroy_process_group()
    """)
    log_dir = tmp_path / "logs"
    started = time.monotonic()
    code = dpmigrate.launch.main(["-n", "2", "--master", f"127.0.0.1:{free_port()}", "--log-dir", str(log_dir),
                                  str(script)])
    assert time.monotonic() - started < 30  # rank 0 was stopped by torchrun, not waited for
    assert code == 3
    assert capfd.readouterr().err.rstrip().splitlines()[-1] == \
        f"dpmigrate launch: rank 1 failed (exit code 3); the other ranks were stopped. Logs: {log_dir}"
    statuses = log_dir / "rank-status"
    assert mode(statuses) == mode(log_dir / "torchrun") == 0o700
    recorded = {r: json.loads((statuses / f"rank{r}.json").read_text()) for r in (0, 1)}
    assert (recorded[1]["returncode"], recorded[1]["stopped"]) == (3, False)
    assert (recorded[0]["returncode"], recorded[0]["stopped"]) == (-signal.SIGTERM, True)


# ------------------------------------------------- every listening socket of a one-node job on loopback (slow)

LISTENER_SCRIPTS = {
    "init_process_group": TORCH_HEADER + "t = torch.ones(1)\ndist.all_reduce(t)\n",
    "dpmigrate_runtime": "import os, sys, time, torch\nimport dpmigrate.runtime.torch as dp\ndp.init()\n"
                         "t = dp.all_reduce(torch.ones(1))\nrank = dp.rank()\n",
}
WAIT_UNTIL_TOLD = """
Path = __import__("pathlib").Path
Path(sys.argv[1], f"ready{rank}").write_text(f"{os.getpid()}\\n")
while not Path(sys.argv[1], "done").exists():
    time.sleep(0.1)
"""


def listening_sockets(pids: list[int]) -> dict[int, list[str]]:
    """By process: the local addresses (``ip:port``) of its TCP sockets in state LISTEN (/proc/net/tcp*)."""
    owner = {}
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except FileNotFoundError:  # exited meanwhile
            continue
        for fd in fds:
            with contextlib.suppress(FileNotFoundError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    owner[target[8:-1]] = pid
    found: dict[int, list[str]] = {pid: [] for pid in pids}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in owner:  # 0A: TCP_LISTEN
                found[owner[inode]].append(_address(local))
    return found


def _address(hex_address: str) -> str:
    """``0100007F:1F90`` -> ``127.0.0.1:8080``; IPv6 (32 hex digits, 4-byte words) -> its compressed form."""
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # each 32-bit word is host-endian
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return f"{socket.inet_ntop(family, words)}:{int(port, 16)}"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's /proc/net/tcp")
@pytest.mark.parametrize("kind", sorted(LISTENER_SCRIPTS))
def test_every_listening_socket_of_a_one_node_job_is_on_loopback(tmp_path, kind):
    script = write_script(tmp_path, WAIT_UNTIL_TOLD, header=LISTENER_SCRIPTS[kind])
    proc = launcher_process("-n", "2", "--log-dir", str(tmp_path / "logs"), str(script), str(tmp_path),
                            cwd=tmp_path)
    try:
        wait_for_files([tmp_path / "ready0", tmp_path / "ready1"], timeout_s=60)
        ranks = [int((tmp_path / f"ready{r}").read_text()) for r in (0, 1)]
        pids = [proc.pid, *descendants(proc.pid)]
        found = listening_sockets(pids)
        stores = [pid for pid in pids if b"dpmigrate.launch.torch_store" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    finally:
        (tmp_path / "done").write_text("")
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    everything = [address for addresses in found.values() for address in addresses]
    assert all(found[rank] for rank in ranks), f"a rank listens nowhere? {found}"  # gloo's socket: seen
    assert len(everything) >= 3, found  # each rank's gloo, and the store (or the socket waiting for it)
    assert [a for a in everything if not a.startswith("127.0.0.1:")] == []
    # the store starts only for scripts that connect to it; the runtime's ranks meet in the file
    assert len(stores) == (1 if kind == "init_process_group" else 0)


# ------------------------------------------------- a frozen rank, a busy master port (slow)

FAULT_JOB = Path(__file__).parent / "jobs" / "torch_fault.py"
COLLECTIVE_TIMEOUT_S = 5
DIAGNOSIS_S = 2  # the runtime's wait for a stopped heartbeat (_torch_faults.DIAGNOSIS_WAIT)
END_AFTER_DIAGNOSIS_S = 5  # what the issue allows between the diagnosis and the end of the whole job


@pytest.mark.slow
@pytest.mark.parametrize("torchrun", [False, True], ids=["one-node", "torchrun"])
def test_a_frozen_rank_ends_the_whole_job_within_5_s_of_its_diagnosis(tmp_path, torchrun):
    """Rank 1 SIGSTOPs itself while rank 0 waits in an all-reduce with --timeout 5: rank 0 diagnoses it at
    timeout + 2 s; every process of the job must be gone 5 s later, and the final line names rank 1."""
    master = ["--master", f"127.0.0.1:{free_port()}"] if torchrun else []
    log_dir = tmp_path / "logs"
    proc = launcher_process("-n", "2", *master, "--timeout", str(COLLECTIVE_TIMEOUT_S), "--log-dir", str(log_dir),
                            str(FAULT_JOB), "--victim", "1", "--how", "stop", "--froze-at", str(tmp_path),
                            cwd=tmp_path)
    frozen = None
    try:
        wait_for_files([tmp_path / "froze"], timeout_s=120)  # the job starting is not what is measured
        frozen, froze_at = (tmp_path / "froze").read_text().split()
        frozen, froze_at = int(frozen), float(froze_at)
        pids = [proc.pid, *descendants(proc.pid)]
        _, err = proc.communicate(timeout=120)
        ended = time.time()
        left = [pid for pid in pids if alive(pid)]
    finally:
        proc.kill()
        if frozen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(frozen, signal.SIGKILL)
    took = ended - froze_at
    print(f"{'torchrun' if torchrun else 'one node'}: the job ended {took:.1f} s after rank 1 froze")
    assert proc.returncode == 128 + signal.SIGKILL  # the frozen rank's: killed by dpmigrate
    assert left == [], "processes of the job still running after dpmigrate launch exited"
    assert took <= COLLECTIVE_TIMEOUT_S + DIAGNOSIS_S + END_AFTER_DIAGNOSIS_S, f"took {took:.1f} s\n{err[-3000:]}"
    assert frozen in pids
    final = err.rstrip().splitlines()[-1]
    # rank 0 then failed by itself (one node), or was stopped by torchrun first, as rank 1's death made it
    assert final.startswith("dpmigrate launch: rank 1 stopped responding (rank 0 lost it: no heartbeat), "
                            "so it was killed; "), final


@pytest.mark.slow
def test_master_on_a_busy_port_is_one_line_naming_the_address_and_the_fix(tmp_path):
    script = write_script(tmp_path, "dist.destroy_process_group()\n")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = launcher_process("-n", "2", "--master", f"127.0.0.1:{port}", "--log-dir", str(tmp_path / "logs"),
                                str(script), cwd=tmp_path)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert out == ""
    line, = err.splitlines()
    suggested = re.fullmatch(rf"dpmigrate launch: error: --master 127\.0\.0\.1:{port}: the port is in use on this machine; "
                             r"pick a free port, e\.g\. --master 127\.0\.0\.1:(\d+)", line)
    assert suggested, line
    assert int(suggested.group(1)) != port
    with socket.socket() as s:  # the suggested port was free
        s.bind(("127.0.0.1", int(suggested.group(1))))


@pytest.mark.slow
def test_under_torchrun_peers_that_ignore_sigterm_are_killed_soon_after_a_rank_failed(tmp_path, capfd):
    """torchrun gives them a fixed 30 s; dpmigrate kills their process groups after PEER_GRACE_S."""
    script = write_script(tmp_path, """\
        if rank == 1:
            time.sleep(1)
            sys.exit(3)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(60)
    """)
    log_dir = tmp_path / "logs"
    code = dpmigrate.launch.main(["-n", "2", "--master", f"127.0.0.1:{free_port()}", "--log-dir", str(log_dir),
                                  str(script)])
    ended = time.time()
    failed_at = json.loads((log_dir / "rank-status" / "rank1.json").read_text())["ended"]
    assert code == 3
    assert ended - failed_at < torch_backend.PEER_GRACE_S + 4, f"took {ended - failed_at:.1f} s"
    assert capfd.readouterr().err.rstrip().splitlines()[-1].startswith("dpmigrate launch: rank 1 failed (exit code 3)")
