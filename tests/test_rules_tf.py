"""Focused tests of the TensorFlow/Keras rules: one behaviour each, a before and an after (or a no-op)."""

from __future__ import annotations

from rule_testing import assert_rule_converts, assert_unchanged, convert_text, findings_of

HEAD = "import numpy as np\nimport tensorflow as tf\n"
IMPORT = "import dpmigrate.runtime.tensorflow as dp\n"


def test_functional_model_layers_and_optimizer_move_under_the_scope():
    assert_rule_converts("keras-strategy-scope", HEAD + """
x, y = np.zeros((8, 3)), np.zeros((8, 1))
opt = tf.keras.optimizers.SGD(0.1)
data_note = "unrelated"
inputs = tf.keras.Input((3,))
outputs = tf.keras.layers.Dense(1)(inputs)
model = tf.keras.Model(inputs, outputs)
model.compile(optimizer=opt, loss="mse")
model.fit(x, y, batch_size=4)
""", HEAD + IMPORT + """
x, y = np.zeros((8, 3)), np.zeros((8, 1))
with dp.scope():
    opt = tf.keras.optimizers.SGD(0.1)
    data_note = "unrelated"
    inputs = tf.keras.Input((3,))
    outputs = tf.keras.layers.Dense(1)(inputs)
    model = tf.keras.Model(inputs, outputs)
    model.compile(optimizer=opt, loss="mse")
model = dp.distributed_model(model)
model.fit(x, y, batch_size=4)
""")


def test_a_model_compiled_far_from_where_it_is_built_is_declined():
    result = convert_text(HEAD + """
def train(model, x, y):
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, y, batch_size=4)
""", select=("keras-strategy-scope",))
    assert result.output == (HEAD + """
def train(model, x, y):
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, y, batch_size=4)
""").encode()
    assert [f.line for f in findings_of(result, "keras-strategy-scope", "declined")] == [5]


FIT = HEAD + """
model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(np.zeros((8, 3)), np.zeros((8, 1)), batch_size=16, verbose=2)
"""


def test_per_device_policy_multiplies_the_fit_batch_by_the_world_size():
    result = convert_text(FIT, select=("keras-fit",))
    assert "batch_size=16 * dp.world_size(), verbose=2 if dp.is_main_process() else 0)" in result.output.decode()


def test_global_policy_keeps_the_fit_batch_and_says_so():
    result = convert_text(FIT, select=("keras-fit",), batch="global")
    assert "batch_size=16, verbose=2 if dp.is_main_process() else 0)" in result.output.decode()
    assert any("--batch global" in f.message for f in findings_of(result, "keras-fit", "note"))


def test_per_device_policy_scales_the_batch_of_a_dataset_given_to_fit():
    result = convert_text(HEAD + """
ds = tf.data.Dataset.from_tensor_slices((np.zeros((8, 3)), np.zeros((8, 1))))
ds = ds.batch(4).prefetch(2)
model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(ds, epochs=1)
""", select=("keras-fit",))
    assert "ds = ds.batch(4 * dp.world_size()).prefetch(2)" in result.output.decode()


def test_fit_on_an_input_it_cannot_follow_is_declined_not_guessed():
    result = convert_text(HEAD + """
def train(data):
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(data, epochs=1)
""", select=("keras-fit",))
    assert "model.fit(data, epochs=1, verbose=" in result.output.decode()
    assert [f.line for f in findings_of(result, "keras-fit", "declined")] == [7]


def test_csv_logger_is_declined_and_checkpoints_are_left_to_tf_keras():
    result = convert_text(HEAD + """
model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(np.zeros((8, 3)), np.zeros((8, 1)), callbacks=[tf.keras.callbacks.CSVLogger("log.csv"),
          tf.keras.callbacks.ModelCheckpoint("ckpt.keras")])
""")
    assert [f.line for f in findings_of(result, "keras-fit", "declined")] == [6]
    assert any("ModelCheckpoint kept" in f.message for f in findings_of(result, "keras-fit", "note"))


def test_save_under_a_rank_condition_is_declined_and_reported_as_divergent():
    result = convert_text(HEAD + """
import os
model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(np.zeros((8, 3)), np.zeros((8, 1)), batch_size=4)
if int(os.environ.get("RANK", "0")) == 0:
    model.save("m.keras")
""")
    assert "    model.save(\"m.keras\")" in result.output.decode()
    assert [f.line for f in findings_of(result, "keras-save", "declined")] == [9]
    assert [f.line for f in findings_of(result, "keras-rank-divergent-code", "error")] == [9]


def test_save_weights_becomes_an_all_workers_dp_save():
    result = convert_text(FIT + "model.save_weights(path)\n", select=("keras-save",))
    assert result.output.decode().endswith("dp.save(model, path, weights_only=True)\n")


def test_custom_loop_averages_gradients_and_shards_with_a_per_rank_batch_under_global_policy():
    assert_rule_converts("tf-custom-loop", HEAD + """
model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
opt = tf.keras.optimizers.SGD(0.1)
ds = tf.data.Dataset.from_tensor_slices((np.zeros((8, 3)), np.zeros((8, 1))))
ds = ds.batch(4)
for x, y in ds:
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
""", HEAD + IMPORT + """
model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
opt = dp.distributed_optimizer(tf.keras.optimizers.SGD(0.1))
ds = tf.data.Dataset.from_tensor_slices((np.zeros((8, 3)), np.zeros((8, 1))))
ds = dp.distributed_loader(ds.batch(dp.per_rank_batch_size(4)))
for x, y in ds:
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
""", batch="global")


def test_custom_loop_with_a_summed_loss_is_declined_unchanged():
    source = HEAD + """
model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
opt = tf.keras.optimizers.SGD(0.1)
ds = tf.data.Dataset.from_tensor_slices((np.zeros((8, 3)), np.zeros((8, 1)))).batch(4)
for x, y in ds:
    with tf.GradientTape() as tape:
        loss = tf.nn.compute_average_loss(tf.square(model(x) - y), global_batch_size=4)
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
"""
    result = assert_unchanged(source, select=("tf-custom-loop",))
    assert [f.line for f in findings_of(result, "tf-custom-loop", "declined")] == [9]


def test_an_overridden_train_step_gets_its_loss_divided_by_the_replicas():
    result = convert_text(HEAD + """
class Net(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = tf.keras.layers.Dense(1)
        self.loss_fn = tf.keras.losses.MeanSquaredError()

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.loss_fn(y, self(x))
        grads = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
        return {"loss": loss}
""", select=("keras-train-step-loss", "tf-custom-loop"))
    assert ("            loss = self.loss_fn(y, self(x))\n"
            "            loss = loss / tf.distribute.get_strategy().num_replicas_in_sync\n") in result.output.decode()
    assert not findings_of(result, "tf-custom-loop")


def test_multi_gpu_model_import_keeps_the_other_names():
    result = convert_text("""import numpy as np
from tensorflow.keras.utils import multi_gpu_model, to_categorical
from tensorflow import keras
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
parallel = multi_gpu_model(model, gpus=4)
parallel.compile(optimizer="sgd", loss="mse")
parallel.fit(np.zeros((8, 3)), to_categorical(np.zeros(8), 2), batch_size=64)
""", select=("keras-multi-gpu-model",))
    out = result.output.decode()
    assert "from tensorflow.keras.utils import to_categorical\n" in out
    assert "multi_gpu_model" not in out
    assert "model.compile(" in out and "model.fit(" in out and "parallel" not in out


def test_tf1_graph_files_are_left_whole_even_by_the_shared_rules():
    source = """import tensorflow.compat.v1 as tf
x = tf.placeholder(tf.float32, [None, 2])
w = tf.get_variable("w", [2, 1])
loss = tf.reduce_mean(tf.matmul(x, w))
train_op = tf.train.GradientDescentOptimizer(0.1).minimize(loss)
with tf.Session() as sess:
    print(sess.run(loss, feed_dict={x: [[1.0, 2.0]]}))
"""
    result = assert_unchanged(source)
    assert [f.rule for f in result.findings if f.severity != "note"] == ["tf-legacy-graph"]


def test_standalone_keras_imports_are_read_through_tensorflow():
    result = convert_text("""import numpy as np
import keras
import keras.backend as K
from keras.layers import Dense
model = keras.Sequential([keras.Input((3,)), Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(np.zeros((8, 3)), np.zeros((8, 1)), batch_size=4)
""", select=("keras-through-tensorflow",))
    assert result.output.decode().splitlines()[1:4] == [
        "from tensorflow import keras", "from tensorflow.keras import backend as K",
        "from tensorflow.keras.layers import Dense"]


def test_a_script_of_layers_without_training_is_unchanged():
    assert_unchanged(HEAD + """
def block(width):
    return tf.keras.Sequential([tf.keras.layers.Dense(width), tf.keras.layers.ReLU()])
print(block(4))
""")


def test_keras_downloads_run_on_the_main_process_first():
    result = convert_text(HEAD + """
import tensorflow_datasets as tfds
path = tf.keras.utils.get_file("data.npz", "https://example.com/data.npz")
ds = tfds.load("mnist", split="train", as_supervised=True)
model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(np.zeros((8, 3)), np.zeros((8, 1)), batch_size=4)
""", select=("download-main-process-first",))
    assert ("with dp.main_process_first():\n"
            "    path = tf.keras.utils.get_file(\"data.npz\", \"https://example.com/data.npz\")\n"
            "    ds = tfds.load(\"mnist\", split=\"train\", as_supervised=True)\n") in result.output.decode()


def test_a_tf2_script_using_compat_v1_logging_is_still_converted():
    result = convert_text(HEAD + """
tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(np.zeros((8, 3)), np.zeros((8, 1)), batch_size=4)
""")
    assert "with dp.scope():" in result.output.decode()
    assert not findings_of(result, "tf-legacy-graph")
