"""A TF worker job that goes wrong on purpose, for tests/test_tf_distributed.py.

    python tf_fault.py FOLDER kill     rank 1 kills itself (SIGKILL) after 3 barriers; rank 0 keeps meeting
    python tf_fault.py FOLDER never    rank 1 never joins (it sleeps before dp.init()); rank 0 waits in init
    python tf_fault.py FOLDER join     every rank just joins (a test starts only some of the nodes)

Each rank writes FOLDER/<event>.rank<i> = time.time() at the moment that matters, so the test measures
how long the job took to end from there.
"""

import os
import signal
import sys
import time

import dpmigrate.runtime.tensorflow as dp
from dpmigrate.runtime import read_role


def mark(folder, event, rank):
    with open(os.path.join(folder, f"{event}.rank{rank}"), "w") as f:
        f.write(repr(time.time()))


folder, mode = sys.argv[1], sys.argv[2]
rank = read_role().rank  # from TF_CONFIG, before joining anything
if mode in ("never", "join"):
    if mode == "never" and rank == 1:
        mark(folder, "asleep", rank)
        time.sleep(3600)
    mark(folder, "init", rank)
    dp.init()
    raise SystemExit("init returned although worker 1 never joined")
for step in range(100000):
    if rank == 1 and step == 3:
        mark(folder, "killed", rank)
        os.kill(os.getpid(), signal.SIGKILL)
    dp.barrier()
