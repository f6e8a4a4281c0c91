"""What the runtime adds: a converted script (dp.* calls) against the same training written by hand.

    python benchmarks/runtime_overhead.py [--jobs 2] [--blocks 2000] [--steps 1] [--frameworks torch,paddle,tensorflow]
                                          [--import-repeat 15] [--nodes]

For each framework, one job of 2 processes on one node (``dpmigrate launch -n 2``) trains the same MLP on
the same synthetic data with plain SGD two ways, side by side in each process, on the process group
``dp.init()`` started (the call a hand-written script makes itself; not part of a step):
- "converted": ``dp.distributed_model``, ``dp.distributed_optimizer``, ``dp.distributed_loader`` (what
  dpmigrate writes);
- "by hand": the framework's own API: torch ``DistributedDataParallel`` + ``DistributedSampler``
  (``set_epoch`` each epoch); Paddle ``paddle.DataParallel`` + ``DistributedBatchSampler``, and
  "by hand, Fleet": ``fleet.distributed_model`` + ``fleet.distributed_optimizer`` + the same sampler;
  TensorFlow ``MultiWorkerMirroredStrategy`` with ``strategy.run`` and the loss scaled by the global batch,
  against the converted custom loop (``dp.distributed_optimizer`` + ``dp.distributed_loader``). TensorFlow
  runs one strategy per process, so there each job trains one variant, the jobs alternated A B A B.
The two run in alternated blocks of steps (by default blocks of one step: A B B A A B ...), so the load
of a shared machine falls on both alike; each step is timed from its start, data loading included (in
blocks longer than 10 steps, the first 3 are not counted). The table shows, per variant, the median over
its blocks of rank 0's median step time and the ratio (target <= 1.02), and what ``import
dpmigrate.runtime.<fw>`` adds after importing the framework (median and minimum of fresh processes,
bytecode cached as an installed package has it; target < 20 ms). Each framework runs in processes of its
own (TensorFlow and Paddle cannot share one); one whose runtime, launcher backend or pair is missing is
listed as such. Prints a table; asserts nothing.

``--nodes``: the same pairs as 2 nodes x 1 process, each node a network namespace of its own joined by a
veth pair (tests/netns.py; needs root and iproute2), started as ``dpmigrate launch --nnodes 2`` on each
(bind guard included), for information: what crossing a (virtual) network costs next to one node.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # netns.py: the two-namespace "machines" the multinode tests use
NODES_PORT = 29500  # fresh namespaces: nothing else listens in them

COMMON = """\
import json, sys, time
import numpy as np
BLOCKS, STEPS, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
data = np.random.RandomState(0)
INPUTS = data.randn(8192, 64).astype("float32")
TARGETS = np.tanh(INPUTS @ data.randn(64, 8)).astype("float32")
BATCH = 64  # per rank
WARM = 3 if STEPS > 10 else 0  # steps of each long block not counted (the other variant's caches are warm)

def forever(loader, before_epoch=lambda epoch: None):
    epoch = 0
    while True:
        before_epoch(epoch)
        epoch += 1
        yield from loader

def measure(variants, rank):
    \"\"\"Blocks of STEPS steps, the variants in turn, each round starting one later (A B, B A, A B ... or
    A B C, B C A, C A B ...): each step timed from its start, data loading included.\"\"\"
    times = {name: [] for name in variants}
    blocks = []
    for block in range(BLOCKS):
        names = list(variants)
        name = names[(block + block // len(names)) % len(names)]  # no variant always goes first
        step = variants[name]
        spent = []
        for _ in range(STEPS):
            t0 = time.perf_counter()
            step()
            spent.append(time.perf_counter() - t0)
        times[name] += spent[WARM:]
        blocks.append((name, float(np.median(spent[WARM:]))))
    if rank == 0:
        with open(OUT, "w") as f:
            json.dump({"median_s": {k: float(np.median(v)) for k, v in times.items()}, "blocks": blocks}, f)
"""

SCRIPTS = {
    "torch": """\
import torch
import torch.distributed as dist
import dpmigrate.runtime.torch as dp

dp.init()  # the process group both variants use (a hand-written script's init_process_group("gloo"))
dataset = torch.utils.data.TensorDataset(torch.from_numpy(INPUTS), torch.from_numpy(TARGETS))

def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256),
                               torch.nn.Tanh(), torch.nn.Linear(256, 8))

def trainer(model, optimizer, batches):
    def step():
        x, y = next(batches)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return step

# converted: what dpmigrate writes
model_a = dp.distributed_model(make_model())
optimizer_a = dp.distributed_optimizer(torch.optim.SGD(model_a.parameters(), lr=0.01))
loader_a = dp.distributed_loader(torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True))
# by hand: DDP + DistributedSampler, set_epoch each epoch
model_b = torch.nn.parallel.DistributedDataParallel(make_model())
optimizer_b = torch.optim.SGD(model_b.parameters(), lr=0.01)
sampler_b = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=True)
loader_b = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler_b)
measure({"converted": trainer(model_a, optimizer_a, forever(loader_a)),
         "by hand": trainer(model_b, optimizer_b, forever(loader_b, sampler_b.set_epoch))}, dist.get_rank())
""",
    "paddle": """\
import paddle
import paddle.distributed as dist
import dpmigrate.runtime.paddle as dp

dp.init()  # fleet.init: the process group both variants use (a hand-written script's init_parallel_env())
dataset = paddle.io.TensorDataset([paddle.to_tensor(INPUTS), paddle.to_tensor(TARGETS)])

def make_model():
    paddle.seed(0)
    return paddle.nn.Sequential(paddle.nn.Linear(64, 256), paddle.nn.Tanh(), paddle.nn.Linear(256, 256),
                                paddle.nn.Tanh(), paddle.nn.Linear(256, 8))

def trainer(model, optimizer, batches):
    def step():
        x, y = next(batches)
        loss = paddle.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
    return step

# converted: what dpmigrate writes
model_a = dp.distributed_model(make_model())
optimizer_a = dp.distributed_optimizer(paddle.optimizer.SGD(learning_rate=0.01, parameters=model_a.parameters()))
loader_a = dp.distributed_loader(paddle.io.DataLoader(dataset, batch_size=BATCH, shuffle=True))
# by hand: paddle.DataParallel + DistributedBatchSampler, set_epoch each epoch
model_b = paddle.DataParallel(make_model())
optimizer_b = paddle.optimizer.SGD(learning_rate=0.01, parameters=model_b.parameters())
sampler_b = paddle.io.DistributedBatchSampler(dataset, batch_size=BATCH, shuffle=True)
loader_b = paddle.io.DataLoader(dataset, batch_sampler=sampler_b)
# by hand with Fleet: fleet.distributed_model / fleet.distributed_optimizer, the same sampler
from paddle.distributed import fleet
model_c = fleet.distributed_model(make_model())
optimizer_c = fleet.distributed_optimizer(paddle.optimizer.SGD(learning_rate=0.01, parameters=model_c.parameters()))
sampler_c = paddle.io.DistributedBatchSampler(dataset, batch_size=BATCH, shuffle=True)
loader_c = paddle.io.DataLoader(dataset, batch_sampler=sampler_c)
measure({"converted": trainer(model_a, optimizer_a, forever(loader_a)),
         "by hand": trainer(model_b, optimizer_b, forever(loader_b, sampler_b.set_epoch)),
         "by hand, Fleet": trainer(model_c, optimizer_c, forever(loader_c, sampler_c.set_epoch))}, dist.get_rank())
""",
}


TF_COMMON = """\
import tensorflow as tf
from tensorflow import keras

def make_model():
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="tanh"),
                             keras.layers.Dense(256, activation="tanh"), keras.layers.Dense(8)])

def examples():
    return tf.data.Dataset.from_tensor_slices((INPUTS, TARGETS)).shuffle(8192, seed=0)
"""

# TensorFlow runs one MultiWorkerMirroredStrategy per process: one job per variant, jobs alternated.
SEPARATE = {
    "tensorflow": {
        "converted": TF_COMMON + """\
import dpmigrate.runtime.tensorflow as dp
dp.init()
model = make_model()
optimizer = dp.distributed_optimizer(keras.optimizers.SGD(0.01))
batches = forever(dp.distributed_loader(examples().batch(BATCH, drop_remainder=True)))

@tf.function
def train_step(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
    optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

def step():
    train_step(*next(batches))

measure({"converted": step}, dp.rank())
""",
        "by hand": TF_COMMON + """\
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    model = make_model()
    optimizer = keras.optimizers.SGD(0.01)
GLOBAL = BATCH * strategy.num_replicas_in_sync
batches = forever(strategy.experimental_distribute_dataset(examples().batch(GLOBAL, drop_remainder=True)))

@tf.function
def train_step(x, y):
    def replica(x, y):
        with tf.GradientTape() as tape:
            per_example = tf.reduce_mean(tf.square(model(x) - y), axis=1)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=GLOBAL)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
    strategy.run(replica, args=(x, y))

def step():
    train_step(*next(batches))

measure({"by hand": step}, strategy.cluster_resolver.task_id)
""",
    },
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
    if framework not in SCRIPTS and framework not in SEPARATE:
        return f"no {framework} pair written yet"
    return None


def with_bytecode(cache: Path) -> dict[str, str]:
    """The environment of an installed package: bytecode cached (in ``cache``, not in the source tree)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": str(cache), "OMP_NUM_THREADS": "1"}


def run_job(framework: str, folder: Path, blocks: int, steps: int, invocation: int, variant: str | None = None,
            nodes=None) -> dict:
    """One ``dpmigrate launch -n 2`` job (or, with ``nodes``, 2 nodes x 1 process, one launcher in each
    namespace): both variants alternated, or (``variant``) that one alone."""
    source = SCRIPTS[framework] if variant is None else SEPARATE[framework][variant]
    name = f"{framework}_pair" if variant is None else f"{framework}_{variant.replace(' ', '_')}"  # never "torch.py"
    script = folder / f"{name}.py"
    script.write_text(COMMON + source)
    out = folder / f"{name}_{invocation}.json"
    job_args = [str(script), str(blocks), str(steps), str(out)]
    env = with_bytecode(folder / "pycache")
    if nodes is None:
        argvs = [[sys.executable, "-m", "dpmigrate.launch", "-n", "2", "--framework", framework, "--log-dir",
                  str(folder / f"logs-{name}-{invocation}"), *job_args]]
    else:
        run_id, master = secrets.token_hex(16), f"{nodes.addresses[0]}:{NODES_PORT}"
        argvs = [nodes.command(node, [
            sys.executable, "-m", "dpmigrate.launch", "-n", "1", "--nnodes", "2", "--node-rank", str(node),
            "--master", master, "--hosts", ",".join(nodes.addresses), "--run-id", run_id, "--framework", framework,
            "--log-dir", str(folder / f"logs-{name}-{invocation}-node{node}"), *job_args]) for node in (0, 1)]
    procs = [subprocess.Popen(argv, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for argv in argvs]
    try:
        results = [proc.communicate(timeout=900) for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    for proc, (_, err) in zip(procs, results):
        if proc.returncode != 0:
            raise RuntimeError(f"{name} failed:\n{err[-3000:]}")
    return json.loads(out.read_text())


def jobs_of(framework: str, count: int) -> list[tuple[int, str | None]]:
    """The jobs to run: ``count`` jobs with both variants, or, one variant per job, ``count`` of each, A B A B."""
    if framework in SCRIPTS:
        return [(job, None) for job in range(count)]
    return [(job, variant) for job in range(count) for variant in SEPARATE[framework]]


IMPORT_PROBE = """
import json, time
t0 = time.perf_counter(); import {fw}
t1 = time.perf_counter(); import dpmigrate.runtime.{fw}
t2 = time.perf_counter()
print(json.dumps([t1 - t0, t2 - t1]))
"""


def import_cost(framework: str, repeat: int, cache: Path) -> tuple[float, float, float]:
    """Median ms of importing the framework, then median and minimum ms of importing its runtime module on
    top (after one untimed run that writes the bytecode cache, as installing a package does)."""
    samples = []
    for i in range(repeat + 1):
        done = subprocess.run([sys.executable, "-c", IMPORT_PROBE.format(fw=framework)], capture_output=True,
                              text=True, check=True, env=with_bytecode(cache))
        if i:
            samples.append(json.loads(done.stdout.strip().splitlines()[-1]))
    extra = [s[1] * 1000 for s in samples]
    return statistics.median(s[0] for s in samples) * 1000, statistics.median(extra), min(extra)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=2000, help="alternated blocks per job (shared by the variants)")
    parser.add_argument("--steps", type=int, default=1, help="steps per block (1: the variants alternate step by step)")
    parser.add_argument("--jobs", type=int, default=2, help="jobs per framework")
    parser.add_argument("--frameworks", default="torch,paddle,tensorflow")
    parser.add_argument("--import-repeat", type=int, default=15)
    parser.add_argument("--nodes", action="store_true", help="2 nodes x 1 process, across two network namespaces")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="dpmigrate-overhead-") as tmp, two_nodes(args.nodes) as nodes:
        folder = Path(tmp)
        os.chmod(folder, 0o755)  # the namespaces' processes run as this user: only the path must be reachable
        for framework in args.frameworks.split(","):
            why = available(framework)
            if why:
                rows.append((framework, why))
                continue
            blocks: dict[str, list[float]] = {}
            for job, variant in jobs_of(framework, args.jobs):
                result = run_job(framework, folder, args.blocks, args.steps, job, variant, nodes)
                for name, median in result["blocks"]:
                    blocks.setdefault(name, []).append(median)
                medians = ", ".join(f"{k} {v * 1000:.3f} ms" for k, v in result["median_s"].items())
                print(f"  {framework} job {job + 1}: median step {medians}", file=sys.stderr, flush=True)
            rows.append((framework, blocks, *import_cost(framework, args.import_repeat, folder / "pycache")))
    where = ("2 nodes x 1 process, two network namespaces joined by a veth pair (dpmigrate launch --nnodes 2)"
             if args.nodes else "2 processes on one node (dpmigrate launch -n 2)")
    print(f"{where}, {args.jobs} job(s) per framework, each {args.blocks} "
          f"alternated blocks (each round starting one variant later) of {args.steps} steps; a variant's step time = "
          f"median over its blocks of rank 0's median step; {os.cpu_count()} CPUs, load average "
          f"{os.getloadavg()[0]:.1f} at the end; import: {args.import_repeat} fresh processes")
    print(f"{'framework':<11} {'against':<15} {'converted ms':>12} {'by hand ms':>10} {'ratio':>6}  "
          f"{'import fw ms':>12} {'+ runtime ms':>12} {'(min)':>6}")
    for row in rows:
        if len(row) == 2:
            print(f"{row[0]:<11} not measured: {row[1]}")
            continue
        framework, blocks, fw_ms, extra_ms, extra_min = row
        a = statistics.median(blocks["converted"])
        for name, times in blocks.items():
            if name == "converted":
                continue
            b = statistics.median(times)
            print(f"{framework:<11} {name:<15} {a * 1000:12.3f} {b * 1000:10.3f} {a / b:6.3f}  {fw_ms:12.0f} "
                  f"{extra_ms:12.1f} {extra_min:6.1f}")
    return 0


@contextlib.contextmanager
def two_nodes(wanted: bool):
    """The two namespaces for ``--nodes`` (deleted after, even on failure), or None."""
    if not wanted:
        yield None
        return
    from netns import TwoNodes

    nodes = TwoNodes()
    try:
        yield nodes
    finally:
        nodes.close()


if __name__ == "__main__":
    sys.exit(main())
