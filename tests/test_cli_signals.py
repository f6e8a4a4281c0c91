"""Ctrl-C and ``kill`` stop a run at once: one line, exit 130/143, no traceback, no worker left, no torn file.

A real ``dpmigrate`` process converts a folder of a few hundred real scripts; the test signals it
while it works, the way a terminal (Ctrl-C: SIGINT to the whole process group) or ``kill`` does.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_samples import CONVERTED_SCRIPT, TORCH_SCRIPT

pytestmark = pytest.mark.alone  # its slow jobs time how fast a failure or a signal ends them: run one at a time

FILES = 300
STOPPED_WITHIN = 2.5  # seconds from the signal to the exit, on a loaded 2-core machine


def children_of(pid: int) -> dict[int, str]:
    """Live processes whose parent is ``pid``, with their start time (a reused pid is another process)."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found[int(entry)] = fields[19]  # starttime
    return found


def alive(pid: int, started: str) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[19] == started and fields[0] != "Z"


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.mark.slow
@pytest.mark.parametrize(("jobs", "how", "signum", "code"), [
    (2, "ctrl-c", signal.SIGINT, 130),
    (2, "kill-main", signal.SIGINT, 130),
    (2, "kill-main", signal.SIGTERM, 143),
    (1, "ctrl-c", signal.SIGINT, 130),
], ids=["j2-ctrl-c", "j2-sigint", "j2-sigterm", "serial-ctrl-c"])
def test_a_signal_stops_the_run_at_once_leaving_no_worker_and_no_torn_file(tmp_path, jobs, how, signum, code):
    tree = tmp_path / "scripts"
    tree.mkdir()
    for n in range(FILES):
        (tree / f"train_{n:03}.py").write_bytes(TORCH_SCRIPT)
    proc = subprocess.Popen([sys.executable, "-m", "dpmigrate", "-j", str(jobs), str(tree)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        if jobs > 1:
            workers = wait_for(lambda: len(children_of(proc.pid)) >= jobs and children_of(proc.pid), 60, "the workers")
        else:
            workers = {}
        wait_for(lambda: any(p.read_bytes() == CONVERTED_SCRIPT for p in tree.glob("train_*.py")), 60,
                 "a first file written")  # a hidden temporary, fully written but not yet renamed, is not one
        assert proc.poll() is None, "the run finished before it could be interrupted: give it more files"
        workers = {**workers, **children_of(proc.pid)}
        signalled = time.monotonic()
        if how == "ctrl-c":
            os.killpg(proc.pid, signum)
        else:
            os.kill(proc.pid, signum)
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == code
    assert took < STOPPED_WITHIN, f"took {took:.1f} s to stop"
    lines = [line for line in err.decode().splitlines() if not line.startswith("Rewriting ")]
    written = [p for p in tree.iterdir() if p.read_bytes() == CONVERTED_SCRIPT]
    assert len(lines) == 1, err.decode()[-3000:]
    assert re.fullmatch(f"dpmigrate: stopped by {signal.Signals(signum).name} after [0-9]+ files?; every file "
                        "written is complete, the others were left as they were", lines[0]), lines[0]
    assert [pid for pid, started in workers.items() if alive(pid, started)] == []
    assert children_of(proc.pid) == {}
    assert sorted(p.name for p in tree.iterdir() if p.read_bytes() not in (TORCH_SCRIPT, CONVERTED_SCRIPT)) == []
    assert 0 < len(written) < FILES
    assert sorted(p.name for p in tree.iterdir() if not p.name.startswith("train_")) == []  # no temporary left
