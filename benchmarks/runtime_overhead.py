"""What the runtime adds: a converted script (dp.* calls) against the same training written by hand.

    python benchmarks/runtime_overhead.py [--pairs 3] [--steps 300] [--frameworks torch,paddle,tensorflow]
                                          [--import-repeat 10]

For each framework, two scripts this benchmark writes to a temporary folder train the same MLP on the
same synthetic data with plain SGD, 2 processes on one node, both started by ``dpmigrate launch -n 2``
(the same launcher, so only the training code differs):
- "converted": ``import dpmigrate.runtime.<fw> as dp``; ``dp.init``, ``dp.distributed_model``,
  ``dp.distributed_optimizer``, ``dp.distributed_loader`` (what dpmigrate writes);
- "by hand": the framework's own API: torch ``init_process_group`` + ``DistributedDataParallel`` +
  ``DistributedSampler`` (``set_epoch`` each epoch); Paddle ``init_parallel_env`` + ``paddle.DataParallel``
  + ``DistributedBatchSampler``; TensorFlow ``MultiWorkerMirroredStrategy`` (custom loop, ``strategy.run``).
Runs alternate A B A B in one invocation (``--pairs`` of them). Each rank times every step from the end of
the previous one (data loading included) after a warm-up; rank 0 reports its median. The table shows the
median over runs of each variant and their ratio (target <= 1.02), and the extra time of
``import dpmigrate.runtime.<fw>`` after importing the framework, median of fresh processes (target < 20 ms).
Each framework runs in processes of its own (TensorFlow and Paddle cannot share one). A framework whose
runtime or launcher backend is missing is listed as such. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WARMUP = 30

COMMON = """\
import json, sys, time
import numpy as np
STEPS, WARMUP, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
data = np.random.RandomState(0)
INPUTS = data.randn(8192, 64).astype("float32")
TARGETS = np.tanh(INPUTS @ data.randn(64, 8)).astype("float32")
BATCH = 64  # per rank
marks = []
def report(rank):
    if rank == 0:
        steps = np.diff(np.array(marks))[WARMUP:]
        with open(OUT, "w") as f:
            json.dump({"median_s": float(np.median(steps)), "steps": len(steps)}, f)
"""

SCRIPTS = {
    ("torch", "converted"): """\
import torch
import dpmigrate.runtime.torch as dp
dp.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256), torch.nn.Tanh(),
                            torch.nn.Linear(256, 8))
model = dp.distributed_model(model)
optimizer = dp.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
dataset = torch.utils.data.TensorDataset(torch.from_numpy(INPUTS), torch.from_numpy(TARGETS))
loader = dp.distributed_loader(torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True))
while len(marks) <= STEPS + WARMUP:
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        marks.append(time.perf_counter())
report(dp.rank())
""",
    ("torch", "by hand"): """\
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256), torch.nn.Tanh(),
                            torch.nn.Linear(256, 8))
model = torch.nn.parallel.DistributedDataParallel(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
dataset = torch.utils.data.TensorDataset(torch.from_numpy(INPUTS), torch.from_numpy(TARGETS))
sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=True)
loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)
epoch = 0
while len(marks) <= STEPS + WARMUP:
    sampler.set_epoch(epoch)
    epoch += 1
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        marks.append(time.perf_counter())
report(dist.get_rank())
dist.destroy_process_group()
""",
    ("paddle", "converted"): """\
import paddle
import dpmigrate.runtime.paddle as dp
dp.init()
paddle.seed(0)
model = paddle.nn.Sequential(paddle.nn.Linear(64, 256), paddle.nn.Tanh(), paddle.nn.Linear(256, 256),
                             paddle.nn.Tanh(), paddle.nn.Linear(256, 8))
model = dp.distributed_model(model)
optimizer = dp.distributed_optimizer(paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters()))
dataset = paddle.io.TensorDataset([paddle.to_tensor(INPUTS), paddle.to_tensor(TARGETS)])
loader = dp.distributed_loader(paddle.io.DataLoader(dataset, batch_size=BATCH, shuffle=True))
while len(marks) <= STEPS + WARMUP:
    for x, y in loader:
        loss = paddle.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        marks.append(time.perf_counter())
report(dp.rank())
""",
    ("paddle", "by hand"): """\
import paddle
import paddle.distributed as dist
dist.init_parallel_env()
paddle.seed(0)
model = paddle.nn.Sequential(paddle.nn.Linear(64, 256), paddle.nn.Tanh(), paddle.nn.Linear(256, 256),
                             paddle.nn.Tanh(), paddle.nn.Linear(256, 8))
model = paddle.DataParallel(model)
optimizer = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
dataset = paddle.io.TensorDataset([paddle.to_tensor(INPUTS), paddle.to_tensor(TARGETS)])
sampler = paddle.io.DistributedBatchSampler(dataset, batch_size=BATCH, shuffle=True)
loader = paddle.io.DataLoader(dataset, batch_sampler=sampler)
epoch = 0
while len(marks) <= STEPS + WARMUP:
    sampler.set_epoch(epoch)
    epoch += 1
    for x, y in loader:
        loss = paddle.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        marks.append(time.perf_counter())
report(dist.get_rank())
""",
    ("tensorflow", "by hand"): """\
import tensorflow as tf
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((64,)), tf.keras.layers.Dense(256, activation="tanh"),
                                 tf.keras.layers.Dense(256, activation="tanh"), tf.keras.layers.Dense(8)])
    optimizer = tf.keras.optimizers.SGD(0.01)
GLOBAL = BATCH * strategy.num_replicas_in_sync
dataset = strategy.experimental_distribute_dataset(
    tf.data.Dataset.from_tensor_slices((INPUTS, TARGETS)).shuffle(8192, seed=0).batch(GLOBAL).repeat())

@tf.function
def step(x, y):
    def replica(x, y):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(tf.reduce_mean(tf.square(model(x) - y), axis=1), global_batch_size=GLOBAL)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    strategy.run(replica, args=(x, y))

for x, y in dataset:
    step(x, y)
    marks.append(time.perf_counter())
    if len(marks) > STEPS + WARMUP:
        break
report(strategy.cluster_resolver.task_id)
""",
}


def available(framework: str) -> str | None:
    """Why this framework's pair cannot run here, or None."""
    if importlib.util.find_spec(framework) is None:
        return f"{framework} is not installed"
    if importlib.util.find_spec(f"dpmigrate.runtime.{framework}") is None:
        return f"dpmigrate.runtime.{framework} does not exist yet"
    from dpmigrate.launch import cli

    if framework not in cli.BACKENDS:
        return f"dpmigrate launch has no {framework} backend yet"
    if (framework, "converted") not in SCRIPTS:
        return f"the {framework} pair's converted script is not written yet"
    return None


def run_once(framework: str, variant: str, folder: Path, steps: int, run: int) -> float:
    script = folder / f"{framework}_{variant.replace(' ', '_')}.py"
    script.write_text(COMMON + SCRIPTS[framework, variant])
    out = folder / f"{framework}_{variant.replace(' ', '_')}_{run}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "dpmigrate.launch", "-n", "2", "--framework", framework, "--log-dir",
         str(folder / f"logs-{framework}-{run}-{variant.replace(' ', '_')}"), str(script), str(steps), str(WARMUP),
         str(out)], cwd=folder, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"{framework} {variant} failed:\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())["median_s"]


IMPORT_PROBE = """
import json, time
t0 = time.perf_counter(); import {fw}
t1 = time.perf_counter(); import dpmigrate.runtime.{fw}
t2 = time.perf_counter()
print(json.dumps([t1 - t0, t2 - t1]))
"""


def import_cost(framework: str, repeat: int) -> tuple[float, float]:
    """Median ms of importing the framework, then of importing its runtime module on top."""
    samples = []
    for _ in range(repeat):
        done = subprocess.run([sys.executable, "-c", IMPORT_PROBE.format(fw=framework)], capture_output=True,
                              text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        samples.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return (statistics.median(s[0] for s in samples) * 1000, statistics.median(s[1] for s in samples) * 1000)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3, help="A B runs per framework, alternated")
    parser.add_argument("--steps", type=int, default=300, help="timed steps per run (after a warm-up)")
    parser.add_argument("--frameworks", default="torch,paddle,tensorflow")
    parser.add_argument("--import-repeat", type=int, default=10)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="dpmigrate-overhead-") as tmp:
        folder = Path(tmp)
        for framework in args.frameworks.split(","):
            why = available(framework)
            if why:
                rows.append((framework, why))
                continue
            times: dict[str, list[float]] = {"converted": [], "by hand": []}
            for run in range(args.pairs):
                for variant in ("converted", "by hand"):
                    times[variant].append(run_once(framework, variant, folder, args.steps, run))
                    print(f"  {framework} {variant} run {run + 1}: median step {times[variant][-1] * 1000:.3f} ms",
                          file=sys.stderr, flush=True)
            fw_ms, extra_ms = import_cost(framework, args.import_repeat)
            rows.append((framework, times, fw_ms, extra_ms))
    print(textwrap.dedent(f"""
        2 processes on one node (dpmigrate launch -n 2), {args.steps} timed steps per run, {args.pairs} runs per
        variant alternated A B; step = median over a run of rank 0's step times; {os.cpu_count()} CPUs
    """).strip())
    print(f"{'framework':<11} {'converted ms':>12} {'by hand ms':>10} {'ratio':>6}  {'import fw ms':>12} "
          f"{'+ runtime ms':>12}")
    for row in rows:
        if len(row) == 2:
            print(f"{row[0]:<11} {row[1]}")
            continue
        framework, times, fw_ms, extra_ms = row
        a, b = statistics.median(times["converted"]), statistics.median(times["by hand"])
        print(f"{framework:<11} {a * 1000:12.3f} {b * 1000:10.3f} {a / b:6.3f}  {fw_ms:12.0f} {extra_ms:12.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
