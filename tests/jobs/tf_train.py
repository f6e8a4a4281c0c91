"""A small regression trained with plain SGD, written as a converted script would be (dp.*), for the TF tests.

    python tf_train.py --mode tape|fit|loop --batch-size B --steps S --out weights.npz [--save PATH] [--hold FILE]

The same file runs as the single-process original (not launched: dp.* is plain TensorFlow) and as
each worker of a ``dpmigrate launch -n 2`` job (``--batch-size`` is the GLOBAL batch: the ``--batch
global`` policy, ``dp.per_rank_batch_size``). Weights start from fixed NumPy values so Keras 3 and
tf-keras start alike; the data is a fixed NumPy draw. Writes the final weights (rank 0) as .npz.
"""

import argparse
import json
import os
import time

import numpy as np
import tensorflow as tf
from tensorflow import keras

import dpmigrate.runtime.tensorflow as dp

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=("tape", "fit", "loop"), required=True)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--steps", type=int, default=12)
parser.add_argument("--out", required=True)
parser.add_argument("--save")
parser.add_argument("--report")
parser.add_argument("--initial")
parser.add_argument("--hold", help="after training: write HOLD.rank<i>, wait for HOLD to go")
args = parser.parse_args()

dp.init()
rng = np.random.RandomState(0)
n = args.batch_size * args.steps
x = rng.normal(size=(n, 8)).astype("float32")
y = (x @ rng.normal(size=(8, 1)) + 0.1 * rng.normal(size=(n, 1))).astype("float32")
w1 = rng.normal(size=(8, 16)).astype("float32") * 0.3
w2 = rng.normal(size=(16, 1)).astype("float32") * 0.3


def build():
    model = keras.Sequential([keras.Input(shape=(8,)), keras.layers.Dense(16, activation="tanh"),
                              keras.layers.Dense(1)])
    model.set_weights([w1, np.zeros(16, "float32"), w2, np.zeros(1, "float32")])
    return model


if args.initial:
    np.savez(args.initial, *build().get_weights())
local_batch = dp.per_rank_batch_size(args.batch_size)
if args.mode == "fit":
    with dp.scope():
        model = build()
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model = dp.distributed_model(model)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch_size)  # the global batch: Keras shards it
    model.fit(data, epochs=1, verbose=0)
elif args.mode == "tape":
    model = build()
    if dp.rank() > 0:  # a worker whose (random) initialisation differs: the optimizer starts it from worker 0's
        model.set_weights([w + 1.0 for w in model.get_weights()])
    optimizer = dp.distributed_optimizer(keras.optimizers.SGD(0.1))
    data = dp.distributed_loader(tf.data.Dataset.from_tensor_slices((x, y)).batch(local_batch))

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb) - yb))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    for xb, yb in data:
        loss = train_step(xb, yb)
    dp.print(f"last loss {float(dp.all_reduce(loss)):.6f}")
else:  # the tf.distribute way: strategy.run with the loss scaled by the global batch
    with dp.scope():
        model = build()
        optimizer = keras.optimizers.SGD(0.1)
    data = dp.loop.distribute(tf.data.Dataset.from_tensor_slices((x, y)).batch(args.batch_size))

    @tf.function
    def train_step(xb, yb):
        def step(xb, yb):
            with tf.GradientTape() as tape:
                per_example = tf.reduce_mean(tf.square(model(xb) - yb), axis=1)
                loss = dp.loop.compute_average_loss(per_example, global_batch_size=args.batch_size)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss
        return dp.loop.reduce(dp.loop.run(step, args=(xb, yb)), op="sum")

    for xb, yb in data:
        train_step(xb, yb)

if args.hold:  # the job's servers still run: a test reads what listens meanwhile
    with open(f"{args.hold}.rank{dp.rank()}", "w") as f:
        f.write(str(os.getpid()))
    while os.path.exists(args.hold):
        time.sleep(0.1)
dp.print(f"trained {args.steps} steps on {dp.world_size()} worker(s), model class from {type(model).__module__.split('.')[0]}")
if dp.is_main_process():
    np.savez(args.out, *[np.asarray(w) for w in model.get_weights()])
if args.save:
    dp.save(model, args.save)
if args.report:
    with open(f"{args.report}.rank{dp.rank()}", "w") as f:
        json.dump({"keras": keras.__name__, "legacy": os.environ.get("TF_USE_LEGACY_KERAS"),
                   "world": dp.world_size()}, f)
