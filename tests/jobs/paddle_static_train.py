"""A small static-graph MLP (paddle.enable_static, Executor, minimize) trained with plain SGD through the
dpmigrate Paddle runtime; the subject of the static-graph equivalence test.

Unlaunched it is the single-process original; under `dpmigrate launch -n 2` each rank feeds its half of
every global batch (dp.shard) and dp.distributed_optimizer's minimize averages the gradients (on this
CPU build: one all_reduce op per gradient in the program). Rank 0 writes the parameters as .npz.
"""

import argparse

import numpy as np
import paddle

import dpmigrate.runtime.paddle as dp

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=32, help="the global batch")
parser.add_argument("--steps", type=int, default=20)
parser.add_argument("--out", required=True)
parser.add_argument("--checkpoint", default=None, help="dp.save(main_program.state_dict(), this)")
args = parser.parse_args()

paddle.enable_static()
dp.init()
paddle.seed(0)
x = paddle.static.data("x", [None, 8], "float32")
y = paddle.static.data("y", [None, 1], "float32")
prediction = paddle.static.nn.fc(paddle.static.nn.fc(x, 16, activation="tanh"), 1)
loss = paddle.mean((prediction - y) ** 2)
optimizer = dp.distributed_optimizer(paddle.optimizer.SGD(learning_rate=0.1))
_, params_grads = optimizer.minimize(loss)

exe = paddle.static.Executor(dp.device())
exe.run(paddle.static.default_startup_program())
data = np.random.RandomState(0)
inputs = data.randn(640, 8).astype("float32")
targets = np.sin(inputs @ data.randn(8, 1)).astype("float32")
for step in range(args.steps):
    window = slice(step * args.batch_size, (step + 1) * args.batch_size)
    exe.run(paddle.static.default_main_program(), feed={"x": dp.shard(inputs[window]), "y": dp.shard(targets[window])},
            fetch_list=[loss])
dp.print(f"trained {args.steps} static-graph steps on {dp.world_size()} process(es)")
dp.print(f"sum of rank + 1 over the ranks: {dp.all_reduce(dp.rank() + 1, op='sum')}")  # runs now, not in the program
if args.checkpoint:
    dp.save(paddle.static.default_main_program().state_dict(), args.checkpoint)
if dp.is_main_process():
    scope = paddle.static.global_scope()
    np.savez(args.out, **{p.name: np.array(scope.find_var(p.name).get_tensor()) for p, _ in params_grads})
