"""Run one rank under Paddle's launcher: record how it ended, and mark each of its output lines with its rank.

    python -m dpmigrate.launch.paddle_rank STATUS_DIR SCRIPT ARGS...

``python -m paddle.distributed.launch`` starts this wrapper as each rank's "training script" (its
``PADDLE_TRAINER_ID`` is the rank) and writes what the wrapper prints to ``workerlog.<local rank>``,
stdout and stderr mixed; of all ranks it echoes only local rank 0's log to its own stdout. So:

- exit status: as :mod:`.rank_status` does for torchrun (its helpers, its file format): ``rank<i>.pid``
  at the start (this wrapper leads the process group Paddle's launcher gave the rank), ``rank<i>.json``
  at the end, and the wrapper exits the way the rank did;
- output: the real rank runs with pipes; every line is written as ``[rank<i>] <line>`` (``[rank<i>]! ``
  for its stderr), flushed per line, so :mod:`.paddle_launcher` can relay every rank's log live and tell
  Paddle's echo of rank 0 apart from the launcher's own messages.
Signals: the rank shares this wrapper's process group, which Paddle's launcher signals as a whole.
Standard library only: importing it loads no framework.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

from .backend import RankExit
from .processes import die_with_parent_hook
from .rank_status import STOP_SIGNALS, _exit_like, _write_atomically, write_status

STDERR_MARK = "!"


def _relay(pipe: IO[bytes], out: IO[bytes], prefix: bytes, lock: threading.Lock) -> None:
    for raw in iter(pipe.readline, b""):
        with lock:
            out.write(marked(raw, prefix))
            out.flush()


def marked(raw: bytes, prefix: bytes) -> bytes:
    """``prefix`` before the line and after each carriage return in it: Paddle's launcher reads rank 0's log in
    text mode, where a progress bar's ``\r`` ends a line, and its echo of every piece must still be recognised
    as a copy (zwmnist: each ``Model.fit`` progress line was shown twice, once untagged)."""
    body = raw[:-1] if raw.endswith(b"\n") else raw
    end = b"\r" if body.endswith(b"\r") else b""  # "\r\n" is one line ending
    body = body[:len(body) - len(end)].replace(b"\r", b"\r" + prefix)
    return prefix + body + end + b"\n"


def main(argv: list[str]) -> int:
    if len(argv) < 2 or "PADDLE_TRAINER_ID" not in os.environ:
        print("usage: PADDLE_TRAINER_ID=<rank> python -m dpmigrate.launch.paddle_rank STATUS_DIR SCRIPT ARGS... "
              "(run by dpmigrate launch under python -m paddle.distributed.launch)", file=sys.stderr)
        return 2
    status_dir, command = Path(argv[0]), [sys.executable, *argv[1:]]
    rank = int(os.environ["PADDLE_TRAINER_ID"])
    stop_requested: list[int] = []
    for signum in STOP_SIGNALS:
        signal.signal(signum, lambda s, _frame: stop_requested.append(s))
    try:
        _write_atomically(status_dir, f"rank{rank}.pid", f"{os.getpid()}\n")
    except OSError as e:
        print(f"dpmigrate launch: cannot record rank {rank}'s pid in {status_dir} ({e})", file=sys.stderr)
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             preexec_fn=die_with_parent_hook())
    lock = threading.Lock()
    out = sys.stdout.buffer
    relays = [threading.Thread(target=_relay, args=(pipe, out, f"[rank{rank}]{mark} ".encode(), lock), daemon=True)
              for pipe, mark in ((child.stdout, ""), (child.stderr, STDERR_MARK))]
    for relay in relays:
        relay.start()
    returncode = child.wait()  # retried after each signal handler (PEP 475)
    ended = time.time()  # now, not after the relays: other nodes order failures by it (.paddle_nodes)
    for relay in relays:
        relay.join(timeout=5)  # the rank's own stray children may hold the pipes open: do not wait for them
    exit_ = RankExit(rank, returncode, stopped=bool(stop_requested), ended=ended)
    try:
        write_status(status_dir, exit_)
    except OSError as e:
        print(f"dpmigrate launch: cannot record rank {rank}'s exit status in {status_dir} ({e})", file=sys.stderr)
    _exit_like(returncode)
    return returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
