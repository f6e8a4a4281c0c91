"""What a Keras script does around fit, on every worker, written with dp.* by hand (tests/test_tf_distributed.py).

    python tf_keras_after.py FOLDER

- shuffles: fit on NumPy arrays (Keras shuffles them itself, by default) and on a tf.data pipeline with an
  unseeded ``shuffle``: the sample ids each worker's train_step received, per epoch; the seed an unseeded
  ``ImageDataGenerator`` iterator gets;
- predict: 300 one-sample predictions of a convolution + BatchNormalization model built under the strategy, and
  100 of a model never compiled, with the process's thread count before and after; one more on a batch of 7;
- variables made before the model: a sub-model and an optimizer built first, a GAN-like wrapper compiled later
  (dp.enter_scope() makes every one of them the strategy's);
- save_weights in TensorFlow's checkpoint format (no .h5 suffix) through dp.save, loaded back into a model
  rebuilt under the scope; a ModelCheckpoint(save_weights_only=True) .weights.h5 loaded the same way;
- dp.chief_path: the real path on the chief, a private temporary one elsewhere.

Each rank writes FOLDER/result.rank<i> (JSON).
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf
from tensorflow import keras

import dpmigrate.runtime.tensorflow as dp

folder = sys.argv[1]
dp.init()
dp.enter_scope()
keras.utils.set_random_seed(1)
result = {"rank": dp.rank()}

# --- variables made outside any `with dp.scope():` block ------------------------------------------------
inner = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
outer_opt = keras.optimizers.SGD(0.01)


class Wrapper(keras.Model):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def call(self, x):
        return self.net(x)


seen = []


class Recorder(keras.Model):
    """Sample ids (column 0) of every batch its train_step receives."""

    def train_step(self, data):
        x, _ = data
        first = tf.reshape(x, [tf.shape(x)[0], -1])[:, 0]
        tf.numpy_function(lambda ids: seen.extend(ids.astype(int).tolist()) or np.float32(0), [first], tf.float32)
        return super().train_step(data)


with dp.scope():
    wrapped = Wrapper(inner)
    wrapped.compile(optimizer=outer_opt, loss="mse")
wrapped = dp.distributed_model(wrapped)  # raises if a variable is not the strategy's
wrapped.fit(np.ones((32, 3), "float32"), np.zeros((32, 1), "float32"), batch_size=16, verbose=0)
result["made_before_the_model"] = "trained"

# --- shuffles ---------------------------------------------------------------------------------------------
ids = np.stack([np.arange(256), np.ones(256)], axis=1).astype("float32")
targets = np.zeros((256, 1), "float32")
with dp.scope():
    inputs = keras.Input((2,))
    recorder = Recorder(inputs, keras.layers.Dense(1)(inputs))
    recorder.compile(optimizer="sgd", loss="mse")
recorder = dp.distributed_model(recorder)
recorder.fit(ids, targets, batch_size=32, epochs=2, verbose=0)
result["numpy_epochs"] = [seen[:128], seen[128:]]
seen.clear()
recorder.fit(tf.data.Dataset.from_tensor_slices((ids, targets)).shuffle(256).batch(32), epochs=1, verbose=0)
result["dataset_epoch"] = list(seen)
# an ImageDataGenerator iterator left unseeded (its shuffle and augmentation draw from NumPy's generator): the job's
# seed, the same on every worker (its transforms need scipy, not installed here: the iterator itself is read)
result["image_iterator_seed"] = keras.preprocessing.image.Iterator(256, 32, True, None).seed

# --- predict ----------------------------------------------------------------------------------------------
with dp.scope():
    conv = keras.Sequential([keras.Input((6, 6, 1)), keras.layers.Conv2D(2, 3), keras.layers.BatchNormalization(),
                             keras.layers.Flatten(), keras.layers.Dense(3)])
    conv.compile(optimizer="sgd", loss="mse")
conv = dp.distributed_model(conv)
images = np.random.default_rng(2).normal(size=(16, 6, 6, 1)).astype("float32")
conv.fit(images, np.zeros((16, 3), "float32"), batch_size=8, verbose=0)
conv.predict(images[:1], verbose=0)
result["threads_before"] = len(os.listdir("/proc/self/task"))
for i in range(300):
    one = conv.predict(images[i % 16:i % 16 + 1], verbose=0)
decoder = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4), keras.layers.BatchNormalization()])
for i in range(100):  # never compiled: the strategy current since dp.enter_scope() is its own
    decoder.predict(np.full((1, 2), i, "float32"), verbose=0)
result["threads_after"] = len(os.listdir("/proc/self/task"))
result["one_shape"] = list(one.shape)
result["seven_shape"] = list(conv.predict(images[:7], batch_size=4, verbose=0).shape)
result["dataset_shape"] = list(conv.predict(tf.data.Dataset.from_tensor_slices(images).batch(5), verbose=0).shape)

# --- weights in TensorFlow's checkpoint format, and a ModelCheckpoint's .weights.h5 ---------------------------
os.makedirs(os.path.join(folder, "weights"), exist_ok=True)
dp.save(conv, os.path.join(folder, "weights", "conv"), weights_only=True)
with dp.scope():
    again = keras.Sequential([keras.Input((6, 6, 1)), keras.layers.Conv2D(2, 3), keras.layers.BatchNormalization(),
                              keras.layers.Flatten(), keras.layers.Dense(3)])
    again.compile(optimizer="sgd", loss="mse")
again = dp.distributed_model(again)
again.load_weights(os.path.join(folder, "weights", "conv"))
result["tf_format_reloaded"] = max(float(np.abs(a - b).max()) for a, b in zip(again.get_weights(), conv.get_weights()))
every_epoch = keras.callbacks.ModelCheckpoint(os.path.join(folder, "best.weights.h5"), save_weights_only=True)
conv.fit(images, np.zeros((16, 3), "float32"), batch_size=8, epochs=1, verbose=0, callbacks=[every_epoch])
dp.barrier()  # the chief has written it
again.load_weights(os.path.join(folder, "best.weights.h5"))
result["checkpoint_reloaded"] = max(float(np.abs(a - b).max()) for a, b in zip(again.get_weights(), conv.get_weights()))
result["evaluate_after_reload"] = float(np.asarray(again.evaluate(images, np.zeros((16, 3), "float32"), verbose=0)))

# --- chief_path ---------------------------------------------------------------------------------------------
result["chief_path"] = dp.chief_path(os.path.join(folder, "export"))
with open(os.path.join(folder, f"result.rank{dp.rank()}"), "w") as f:
    json.dump(result, f)
