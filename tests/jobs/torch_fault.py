"""Trains with all-reduces; the rank given by --victim dies (SIGKILL) or freezes (SIGSTOP) at step 5.

With ``--froze-at DIR`` the victim first writes ``DIR/froze`` (its pid and time.time()), so a test can
measure from the moment the rank was lost.
"""

import argparse
import os
import signal
import time

import torch
from torch import nn

import dpmigrate.runtime.torch as dp

parser = argparse.ArgumentParser()
parser.add_argument("--victim", type=int, default=1)
parser.add_argument("--how", choices=["kill", "stop"], default="kill")
parser.add_argument("--froze-at", help="folder where the victim records its pid and the time it was lost")
args = parser.parse_args()

dp.init()
model = dp.distributed_model(nn.Linear(4, 1))
optimizer = dp.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
for step in range(1000):
    if step == 5 and dp.rank() == args.victim:
        if args.froze_at:
            with open(os.path.join(args.froze_at, "froze.tmp"), "w") as f:
                f.write(f"{os.getpid()} {time.time()!r}\n")
            os.replace(os.path.join(args.froze_at, "froze.tmp"), os.path.join(args.froze_at, "froze"))
        os.kill(os.getpid(), signal.SIGKILL if args.how == "kill" else signal.SIGSTOP)
    optimizer.zero_grad()
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    time.sleep(0.05)
dp.print("finished without noticing the lost rank")
