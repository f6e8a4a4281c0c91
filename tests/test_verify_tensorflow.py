"""``dpmigrate verify`` on TensorFlow scripts: the original on one real process, the conversion on two workers
of ``dpmigrate launch`` (MultiWorkerMirroredStrategy, tf-keras), under ``dpmigrate/verify/harness/tensorflow.py``.

- correct ``--batch global`` conversions are equivalent, with the split of the data proven at every step: a
  Keras ``fit`` fixture (the batches each ``train_step`` received, read inside the graph) and a custom-loop
  fixture (a ``@tf.function`` step over a ``tf.data`` pipeline; 13 steps, so the evaluation pass between its
  epochs is read between two training steps);
- conversions broken by hand are caught with their cause: a ``train_step`` override whose loss is a plain mean
  over the worker's batch (the strategy sums the replicas' gradients: ``scaled-update``, 2x), a custom loop
  whose dataset is left whole with the full batch (``not-sharded``, although the weights match), and a custom
  loop whose optimizer is not wrapped (each worker trains its own copy: ``unsynchronised``).

``verify`` runs in this process (its runs are subprocesses); this process never imports tensorflow, paddle or
torch. Five verify runs, 8-17 s each on a loaded 2-core machine (TensorFlow's start dominates).
"""

from __future__ import annotations

import sys

import pytest
from fixture_cases import FIXTURES
from verify_cases import causes, explain, verify

pytestmark = pytest.mark.slow

TF = FIXTURES / "tensorflow"
BATCH = ("--batch-size", "32")
FRAMEWORKS = ("paddle", "tensorflow", "torch")

LOOP = '''\
"""Fit a plane with a GradientTape step in a tf.function over a tf.data pipeline; plain SGD, seeded."""
import argparse

import numpy as np
import tensorflow as tf

ap = argparse.ArgumentParser()
ap.add_argument("--batch-size", type=int, default=32)
cfg = ap.parse_args()

tf.keras.utils.set_random_seed(1)
points = np.random.default_rng(4).uniform(-1.0, 1.0, size=(128, 3)).astype("float32")
heights = points @ np.array([[0.7], [-1.3], [2.1]], dtype="float32")
batches = tf.data.Dataset.from_tensor_slices((points, heights)).batch(cfg.batch_size)
model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(4, activation="tanh"),
                             tf.keras.layers.Dense(1)])
sgd = tf.keras.optimizers.SGD(0.1)


@tf.function
def learn(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
    grads = tape.gradient(loss, model.trainable_variables)
    sgd.apply_gradients(zip(grads, model.trainable_variables))


for x, y in batches:
    learn(x, y)
'''

STEP_OVERRIDE = '''\
"""A subclassed Keras model with its own train_step: the loss is a plain mean over the batch it receives."""
import argparse

import numpy as np
import tensorflow as tf


class Line(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = tf.keras.layers.Dense(8, activation="tanh")
        self.drop = tf.keras.layers.Dropout(0.5)
        self.out = tf.keras.layers.Dense(1)

    def call(self, x, training=False):
        return self.out(self.drop(self.hidden(x), training=training))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self(x, training=True) - y))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}


ap = argparse.ArgumentParser()
ap.add_argument("--batch-size", type=int, default=32)
cfg = ap.parse_args()

tf.keras.utils.set_random_seed(7)
rng = np.random.default_rng(7)
x = rng.normal(size=(256, 4)).astype("float32")
y = (x @ rng.normal(size=(4, 1)) + 0.5).astype("float32")
model = Line()
model.compile(optimizer=tf.keras.optimizers.SGD(0.1))
model.fit(x, y, batch_size=cfg.batch_size, epochs=1)
'''


def _edited(text: str, *edits: tuple[str, str]) -> str:
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def _runtime(text: str) -> str:
    """The start every conversion has: the runtime imported, ``dp.init()`` after the arguments."""
    return _edited(text, ("import tensorflow as tf\n", "import tensorflow as tf\nimport dpmigrate.runtime.tensorflow as dp\n"),
                   ("cfg = ap.parse_args()\n", "cfg = ap.parse_args()\ndp.init()\n"))


SHARDED = ("batches = tf.data.Dataset.from_tensor_slices((points, heights)).batch(cfg.batch_size)",
           "batches = dp.distributed_loader(\n"
           "    tf.data.Dataset.from_tensor_slices((points, heights)).batch(dp.per_rank_batch_size(cfg.batch_size)))")
AVERAGED = ("sgd = tf.keras.optimizers.SGD(0.1)", "sgd = dp.distributed_optimizer(tf.keras.optimizers.SGD(0.1))")


def _scripts(tmp_path, original: str, converted: str) -> tuple[str, str]:
    (tmp_path / "train.py").write_text(original)
    folder = tmp_path / "converted"
    folder.mkdir()
    (folder / "train.py").write_text(converted)
    return "train.py", str(folder / "train.py")


def _verify(tmp_path, monkeypatch, script, steps: int = 2, against: str | None = None) -> dict:
    already = {m for m in FRAMEWORKS if m in sys.modules}
    data = verify(tmp_path, monkeypatch, tmp_path / script, *BATCH, against=None if against is None else tmp_path / against,
                  steps=steps, timeout=300)
    assert {m for m in FRAMEWORKS if m in sys.modules} == already  # the frameworks live in the runs only
    assert data["framework"] == "tensorflow", explain(data)
    return data


def _split_proven(data: dict, steps: int, source: str) -> None:
    check = data["comparison"]["data"]
    assert check["split"] == check["observed"] == steps, explain(data)
    assert check["source"] == source and check["sizes"] == [32, [16, 16]], check


@pytest.mark.parametrize(("case", "steps", "source"), [
    ("keras_sequential_fit", 2, "step"),
    # 12 steps per epoch: the evaluation loop over a second dataset runs between steps 12 and 13
    ("custom_loop_tf_function_metrics", 13, "loader"),
], ids=["keras-fit", "custom-loop"])
def test_a_right_conversion_is_equivalent_with_the_data_split_proven(case, steps, source, tmp_path, monkeypatch):
    (tmp_path / "before.py").write_bytes((TF / case / "before.py").read_bytes())
    data = _verify(tmp_path, monkeypatch, "before.py", steps=steps)
    assert data["verdict"] == "equivalent", explain(data)
    comparison = data["comparison"]
    assert comparison["max_difference"] < 1e-5 and comparison["converted_steps"] == [steps, steps], explain(data)
    _split_proven(data, steps, source)
    assert "changes" in data["conversion"]


def test_a_train_step_loss_left_unscaled_is_caught_as_a_scaled_update(tmp_path, monkeypatch):
    # what dpmigrate writes, less the one line that matters: loss / num_replicas_in_sync inside the tape
    broken = _edited(_runtime(STEP_OVERRIDE), (
        "model = Line()\nmodel.compile(optimizer=tf.keras.optimizers.SGD(0.1))\n",
        "with dp.scope():\n    model = Line()\n    model.compile(optimizer=tf.keras.optimizers.SGD(0.1))\n"))
    original, converted = _scripts(tmp_path, STEP_OVERRIDE, broken)
    data = _verify(tmp_path, monkeypatch, original, against=converted)
    assert data["verdict"] == "diverges", explain(data)
    assert causes(data) == ["scaled-update"], explain(data)
    assert "2x" in data["comparison"]["causes"][0]["message"], explain(data)  # N = 2 times the update
    _split_proven(data, 2, "step")  # the data was split right: only the update is wrong
    assert data["comparison"]["first"]["step"] == 1
    # the run is deterministic because the harness turned the script's randomness off
    assert {"dropout off: Dropout", "shuffling off: Model.fit(shuffle=False)"} <= set(data["harness"]), data["harness"]


def test_a_dataset_left_whole_is_caught_as_not_sharded_although_the_weights_match(tmp_path, monkeypatch):
    original, converted = _scripts(tmp_path, LOOP, _edited(_runtime(LOOP), AVERAGED))
    data = _verify(tmp_path, monkeypatch, original, against=converted)
    assert data["verdict"] == "diverges", explain(data)
    assert causes(data) == ["not-sharded"], explain(data)
    comparison = data["comparison"]
    assert comparison["max_difference"] < 1e-5 and comparison["first"] is None, explain(data)
    assert comparison["data"]["same"] == [1, 2] and comparison["data"]["sizes"] == [32, [32, 32]], comparison["data"]


def test_an_optimizer_left_unwrapped_is_caught_as_unsynchronised(tmp_path, monkeypatch):
    original, converted = _scripts(tmp_path, LOOP, _edited(_runtime(LOOP), SHARDED))
    data = _verify(tmp_path, monkeypatch, original, against=converted)
    assert data["verdict"] == "diverges", explain(data)
    assert "unsynchronised" in causes(data), explain(data)
    assert data["comparison"]["ranks_disagree"]["step"] == 1, explain(data)  # same seeded start, apart after step 1
    _split_proven(data, 2, "loader")
