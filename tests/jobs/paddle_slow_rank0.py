"""Rank 0 works alone for longer than gloo's fixed 30 s collective timeout (a download inside
main_process_first), then every rank trains one step and meets in dp.save."""

import sys
import time

import paddle

import dpmigrate.runtime.paddle as dp

dp.init()
with dp.main_process_first():
    if dp.is_main_process():
        time.sleep(float(sys.argv[1]))  # e.g. a dataset download the other ranks must wait for
model = dp.distributed_model(paddle.nn.Linear(2, 1))
optimizer = dp.distributed_optimizer(paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters()))
model(paddle.ones([4, 2])).mean().backward()
optimizer.step()
dp.save(model.state_dict(), sys.argv[2])
dp.print("rank 0 waited for, job done")
