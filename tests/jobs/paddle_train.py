"""A small dygraph MLP trained with plain SGD through the dpmigrate Paddle runtime; the subject of the
Paddle equivalence, checkpoint, lost-rank and loopback tests.

Run unlaunched it is the single-process original; under `dpmigrate launch -n 2` each rank takes half of
every batch (the --batch global policy). No randomness: data and initial weights come from fixed seeds
and the loader does not shuffle. Parameters are written as .npz by rank 0, so the tests read them with
NumPy and never import Paddle themselves.
"""

import argparse
import os
import signal
import time

import numpy as np
import paddle

import dpmigrate.runtime.paddle as dp

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=32, help="the global batch")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--lr", type=float, default=0.1)
parser.add_argument("--out", default=None, help="rank 0 writes the final parameters here (.npz)")
parser.add_argument("--checkpoint", default=None, help="dp.save(model.state_dict(), this)")
parser.add_argument("--count-saves", default=None, help="write how many times this rank called paddle.save here")
parser.add_argument("--die-rank", type=int, default=None, help="this rank sends itself --die-signal ...")
parser.add_argument("--die-signal", default="SIGKILL", help="SIGKILL, or SIGSTOP to freeze")
parser.add_argument("--die-at", type=int, default=3, help="... before this step")
parser.add_argument("--hold", default=None, help="write pid to HOLD.rank<i>, wait for HOLD to go")
args = parser.parse_args()

saves = 0
real_save = paddle.save


def counting_save(*a, **k):
    global saves
    saves += 1
    return real_save(*a, **k)


paddle.save = counting_save

dp.init()
data = np.random.RandomState(0)
inputs = data.randn(640, 8).astype("float32")
targets = np.sin(inputs @ data.randn(8, 1)).astype("float32")
paddle.seed(0)
model = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.Tanh(), paddle.nn.Linear(16, 1))
model = dp.distributed_model(model)
optimizer = dp.distributed_optimizer(paddle.optimizer.SGD(learning_rate=args.lr, parameters=model.parameters()))
dataset = paddle.io.TensorDataset([paddle.to_tensor(inputs), paddle.to_tensor(targets)])
loader = dp.distributed_loader(
    paddle.io.DataLoader(dataset, batch_size=dp.per_rank_batch_size(args.batch_size), shuffle=False))

step, loss = 0, paddle.to_tensor(float("nan"))
while step < args.steps:
    for x, y in loader:
        if dp.rank() == args.die_rank and step == args.die_at:
            os.kill(os.getpid(), getattr(signal, args.die_signal))
        loss = paddle.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        step += 1
        if step == args.steps:
            break
dp.print(f"trained {step} steps on {dp.world_size()} process(es), loss {float(loss):.6f}")

if args.out and dp.is_main_process():
    np.savez(args.out, **{k: v.numpy() for k, v in dp.unwrap(model).state_dict().items()})
if args.checkpoint:
    dp.save(model.state_dict(), args.checkpoint)
if args.count_saves:
    with open(f"{args.count_saves}.rank{dp.rank()}", "w") as f:
        f.write(str(saves))
if args.hold:
    with open(f"{args.hold}.rank{dp.rank()}", "w") as f:
        f.write(f"{os.getpid()}\n")
    while os.path.exists(args.hold):
        time.sleep(0.1)
dp.barrier()
