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
dp.enter_scope()
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
    assert ("if dp.local_rank() == 0:\n"
            "    path = tf.keras.utils.get_file(\"data.npz\", \"https://example.com/data.npz\")\n"
            "    ds = tfds.load(\"mnist\", split=\"train\", as_supervised=True)\n"
            "dp.barrier()\n") in result.output.decode()


def test_a_tf2_script_using_compat_v1_logging_is_still_converted():
    result = convert_text(HEAD + """
tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(np.zeros((8, 3)), np.zeros((8, 1)), batch_size=4)
""")
    assert "with dp.scope():" in result.output.decode()
    assert not findings_of(result, "tf-legacy-graph")


# --- issue 20: TensorFlow/Keras on real scripts -----------------------------------------------------------------

GAN_STEP = HEAD + """
class Pair(tf.keras.Model):
    def __init__(self, d, g):
        super().__init__()
        self.d, self.g = d, g

    def compile(self, d_opt, g_opt):
        super().compile()
        self.d_opt, self.g_opt = d_opt, g_opt

    def train_step(self, real):
        z = tf.ones((tf.shape(real)[0], 2))
        with tf.GradientTape() as tape:
            d_loss = tf.reduce_mean(self.d(real)) - tf.reduce_mean(self.d(self.g(z)))
        with tf.GradientTape() as probe:
            probe.watch(real)
            judged = self.d(real)
        slope = probe.gradient(judged, [real])
        d_grads = tape.gradient(d_loss, self.d.trainable_weights)
        self.d_opt.apply_gradients(zip(d_grads, self.d.trainable_weights))
        with tf.GradientTape() as tape:
            g_loss = -tf.reduce_mean(self.d(self.g(z)))
        g_grads = tape.gradient(g_loss, self.g.trainable_weights)
        g_grads = [tf.clip_by_norm(g, 1.0) for g in g_grads]
        self.g_opt.apply_gradients(zip(g_grads, self.g.trainable_weights))
        return {"d": d_loss, "g": g_loss}
"""


def test_every_loss_of_a_train_step_with_two_tapes_is_scaled_but_a_gradient_no_optimizer_applies_is_not():
    out = convert_text(GAN_STEP, select=("keras-train-step-loss",)).output.decode()
    assert ("            d_loss = tf.reduce_mean(self.d(real)) - tf.reduce_mean(self.d(self.g(z)))\n"
            "            d_loss = d_loss / tf.distribute.get_strategy().num_replicas_in_sync\n") in out
    assert ("            g_loss = -tf.reduce_mean(self.d(self.g(z)))\n"
            "            g_loss = g_loss / tf.distribute.get_strategy().num_replicas_in_sync\n") in out
    assert "judged = judged /" not in out  # a gradient penalty's probe: its gradient reaches no optimizer
    assert IMPORT not in out  # plain TensorFlow: no runtime import for it


def test_a_train_step_taking_the_gradient_of_an_expression_is_declined_not_skipped():
    source = GAN_STEP.replace("d_grads = tape.gradient(d_loss, ", "d_grads = tape.gradient(d_loss * 0.5, ")
    result = convert_text(source, select=("keras-train-step-loss",))
    assert [f.line for f in findings_of(result, "keras-train-step-loss", "declined")] == [21]
    assert "g_loss = g_loss / tf.distribute" in result.output.decode()


LOOP_HEAD = HEAD + """
model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
opt = tf.keras.optimizers.SGD(0.1)


@tf.function
def learn(x, y):
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(x) - y))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
"""


def test_loop_data_is_followed_through_take_enumerate_and_a_parameter_to_its_callers():
    out = convert_text(LOOP_HEAD + """

def run(dataset, steps):
    for i, (x, y) in enumerate(dataset.take(steps), 1):
        learn(x, y)


stream = tf.data.Dataset.from_tensor_slices((np.zeros((8, 3)), np.zeros((8, 1)))).repeat().batch(4).prefetch(1)
run(stream, 10)
""", select=("tf-custom-loop",), batch="global").output.decode()
    assert ("stream = dp.distributed_loader(tf.data.Dataset.from_tensor_slices((np.zeros((8, 3)), np.zeros((8, 1))))"
            ".repeat().batch(dp.per_rank_batch_size(4)).prefetch(1))\n") in out


def test_loop_data_read_with_next_from_an_iterator_and_zipped_pipelines_are_sharded():
    out = convert_text(LOOP_HEAD + """
left = tf.data.Dataset.from_tensor_slices(np.zeros((8, 3))).batch(4)
right = tf.data.Dataset.from_tensor_slices(np.zeros((8, 1))).batch(4)
for x, y in zip(left, right):
    learn(x, y)
it = iter(tf.data.Dataset.from_tensor_slices((np.zeros((8, 3)), np.zeros((8, 1)))).repeat().batch(4))
for step in range(5):
    x, y = next(it)
    learn(x, y)
""", select=("tf-custom-loop",)).output.decode()
    assert "left = dp.distributed_loader(tf.data" in out and "right = dp.distributed_loader(tf.data" in out
    assert "it = iter(dp.distributed_loader(tf.data.Dataset" in out


def test_a_counted_take_after_the_batch_is_kept_outside_the_shard():
    out = convert_text(LOOP_HEAD + """
ds = tf.data.Dataset.from_tensor_slices((np.zeros((8, 3)), np.zeros((8, 1)))).batch(4).take(2)
for x, y in ds:
    learn(x, y)
""", select=("tf-custom-loop",)).output.decode()
    assert "ds = dp.distributed_loader(tf.data.Dataset.from_tensor_slices((np.zeros((8, 3)), np.zeros((8, 1)))).batch(4))" \
           ".take(2)\n" in out  # every worker takes its 2 batches


def test_a_training_loop_whose_data_cannot_be_followed_is_declined():
    result = convert_text(LOOP_HEAD + """
x_all, y_all = np.zeros((8, 3)), np.zeros((8, 1))
for start in range(0, 8, 4):
    learn(x_all[start:start + 4], y_all[start:start + 4])
""", select=("tf-custom-loop",))
    assert [f.line for f in findings_of(result, "tf-custom-loop", "declined")] == [15]
    assert "opt = dp.distributed_optimizer(" in result.output.decode()  # averaged: like one process, N times over


def test_an_eager_tower_loop_is_kept_with_a_note_and_its_optimizer_and_data_distributed():
    result = convert_text(LOOP_HEAD.replace("@tf.function\n", "") + """
ds = tf.data.Dataset.from_tensor_slices((np.zeros((8, 3)), np.zeros((8, 1)))).batch(4)
for x, y in ds:
    towers = []
    for i in range(2):
        with tf.device("/gpu:%d" % i):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(model(x[i::2]))
            towers.append(tape.gradient(loss, model.trainable_variables))
    opt.apply_gradients(zip([tf.add_n(g) / 2 for g in zip(*towers)], model.trainable_variables))
""", select=("tf-custom-loop",))
    assert [f.line for f in findings_of(result, "tf-custom-loop", "note") if "tower" in f.message] == [16]
    assert "ds = dp.distributed_loader(" in result.output.decode()


def test_a_loop_of_epochs_under_one_fixed_device_is_no_tower_loop():
    result = convert_text(LOOP_HEAD + """
ds = tf.data.Dataset.from_tensor_slices((np.zeros((8, 3)), np.zeros((8, 1)))).batch(4)
for epoch in range(3):
    with tf.device("/gpu:0"):
        for x, y in ds:
            learn(x, y)
""", select=("tf-custom-loop",))
    assert not [f for f in result.findings if "tower" in f.message]


def test_what_every_worker_writes_goes_to_the_chief_and_images_are_written_by_it():
    out = convert_text(LOOP_HEAD + """
import os
from PIL import Image
ds = tf.data.Dataset.from_tensor_slices((np.zeros((8, 3)), np.zeros((8, 1)))).batch(4)
writer = tf.summary.create_file_writer("logs/train")
tf.summary.trace_on(graph=True, profiler_outdir="logs/profile")
for x, y in ds:
    learn(x, y)
picture = tf.keras.utils.array_to_img(np.zeros((4, 4, 1)))
picture.save("preview.png")
Image.fromarray(np.zeros((4, 4), "uint8")).save("plain.png")
tf.keras.utils.plot_model(model, to_file="model.png")
tf.saved_model.save(model, os.path.join("out", "export"))
""").output.decode()
    assert 'writer = tf.summary.create_file_writer(dp.chief_path("logs/train"))' in out
    assert 'tf.summary.trace_on(graph=True, profiler_outdir=dp.chief_path("logs/profile"))' in out
    assert 'if dp.is_main_process():\n    picture.save("preview.png")\n' in out
    assert 'if dp.is_main_process():\n    Image.fromarray(np.zeros((4, 4), "uint8")).save("plain.png")\n' in out
    assert 'if dp.is_main_process():\n    tf.keras.utils.plot_model(model, to_file="model.png")\n' in out
    assert 'tf.saved_model.save(model, dp.chief_path(os.path.join("out", "export")))' in out


def test_a_checkpoint_manager_saves_through_dp_save_on_every_worker():
    out = convert_text(LOOP_HEAD + """
manager = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), "ckpts", max_to_keep=2)
ds = tf.data.Dataset.from_tensor_slices((np.zeros((8, 3)), np.zeros((8, 1)))).batch(4)
for epoch in range(2):
    for x, y in ds:
        learn(x, y)
    path = manager.save(checkpoint_number=epoch)
""", select=("keras-save",)).output.decode()
    assert "    path = dp.save(manager, manager.directory, checkpoint_number=epoch)\n" in out


def test_an_imageio_writer_block_is_written_by_the_chief():
    out = convert_text(LOOP_HEAD + """
import imageio
ds = tf.data.Dataset.from_tensor_slices((np.zeros((8, 3)), np.zeros((8, 1)))).batch(4)
for x, y in ds:
    learn(x, y)
with imageio.get_writer("anim.gif", mode="I") as frames:
    for i in range(3):
        frames.append_data(np.zeros((4, 4), "uint8"))
""", select=("tf-chief-writes",)).output.decode()
    assert 'if dp.is_main_process():\n    with imageio.get_writer("anim.gif", mode="I") as frames:\n' in out


FIT_MAIN = HEAD + """
import argparse

keep = tf.keras.optimizers.SGD(0.1)
inner = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])


def main():
    args = argparse.ArgumentParser().parse_args()
    model = tf.keras.Sequential([inner])
    model.compile(optimizer=keep, loss="mse")
    model.fit(np.zeros((8, 3)), np.zeros((8, 1)), batch_size=4)


if __name__ == "__main__":
    main()
"""


def test_a_fit_script_enters_the_strategy_scope_before_its_first_keras_object():
    """Objects built at module level, before main() runs dp.init(): dp.enter_scope() goes before the first."""
    out = convert_text(FIT_MAIN, select=("keras-strategy-scope",)).output.decode()
    assert "\ndp.enter_scope()\nkeep = tf.keras.optimizers.SGD(0.1)\n" in out
    assert out.index("dp.enter_scope()") < out.index("def main():")


def test_a_fit_script_enters_the_strategy_scope_right_after_init():
    out = convert_text(FIT_MAIN.replace("keep = tf.keras.optimizers.SGD(0.1)\ninner = tf.keras.Sequential("
                                        "[tf.keras.Input((3,)), tf.keras.layers.Dense(1)])\n", "")
                       .replace("model = tf.keras.Sequential([inner])", "model = tf.keras.Sequential([tf.keras.Input("
                                "(3,)), tf.keras.layers.Dense(1)])").replace("optimizer=keep", "optimizer='sgd'"),
                       ).output.decode()
    assert "    args = argparse.ArgumentParser().parse_args()\n    dp.init()\n    dp.enter_scope()\n" in out


def test_a_model_compiled_away_from_where_it_is_built_is_covered_by_the_program_scope():
    result = convert_text(HEAD + """
def train(model, x, y):
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, y, batch_size=4)


train(tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)]), np.zeros((8, 3)), np.zeros((8, 1)))
""")
    assert not findings_of(result, "keras-strategy-scope", "declined")
    assert [f.line for f in findings_of(result, "keras-strategy-scope", "note")] == [5]
    assert "dp.enter_scope()\n" in result.output.decode()


def test_a_custom_loop_script_gets_no_program_scope():
    assert "enter_scope" not in convert_text(LOOP_HEAD + """
for x, y in tf.data.Dataset.from_tensor_slices((np.zeros((8, 3)), np.zeros((8, 1)))).batch(4):
    learn(x, y)
""").output.decode()


KERAS3_FIT = """import numpy as np
import keras
from keras import ops


class Dot(keras.Model):
    def call(self, x):
        return ops.sum(x, axis=1, keepdims=True)


model = Dot()
model.compile(optimizer="sgd", loss="mse")
model.fit(np.zeros((8, 3)), np.zeros((8, 1)), batch_size=4)
"""


def test_keras3_only_apis_keep_their_imports_and_fit_is_declined_naming_them():
    result = convert_text(KERAS3_FIT)
    out = result.output.decode()
    assert "import keras\nfrom keras import ops\n" in out and "from tensorflow" not in out
    assert "dp.scope()" not in out and "batch_size=4)" in out
    declined = findings_of(result, "keras-strategy-scope", "declined")
    assert [f.line for f in declined] == [12] and "keras.ops" in declined[0].message


def test_a_keras3_custom_loop_keeps_keras3_and_is_converted():
    out = convert_text("""import numpy as np
import keras
import tensorflow as tf

model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
opt = keras.optimizers.SGD(0.1)
for x, y in tf.data.Dataset.from_tensor_slices((np.zeros((8, 3)), np.zeros((8, 1)))).batch(4):
    with tf.GradientTape() as tape:
        loss = keras.ops.mean(keras.ops.square(model(x) - y))
    opt.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
""").output.decode()
    assert "import keras\n" in out and "opt = dp.distributed_optimizer(keras.optimizers.SGD(0.1))" in out
    assert "for x, y in dp.distributed_loader(tf.data.Dataset" in out


SEQUENCE = HEAD + """
class Rows(tf.keras.utils.Sequence):
    def __init__(self, x, y, batch_size):
        super().__init__()
        self.x, self.y, self.batch_size = x, y, batch_size

    def __len__(self):
        return len(self.x) // self.batch_size

    def __getitem__(self, i):
        return self.x[i * self.batch_size:(i + 1) * self.batch_size], self.y[i * self.batch_size:(i + 1) * self.batch_size]

    def on_epoch_end(self):
        np.random.shuffle(self.x)


model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
save = tf.keras.callbacks.ModelCheckpoint("w.weights.h5", save_weights_only=True, save_freq=10)
model.fit(Rows(np.zeros((64, 3)), np.zeros((64, 1)), 16), steps_per_epoch=4, callbacks=[save])
"""


def test_a_sequence_gets_its_batch_multiplied_and_an_unseeded_shuffle_in_it_is_declined():
    result = convert_text(SEQUENCE, select=("keras-fit",))
    assert "model.fit(Rows(np.zeros((64, 3)), np.zeros((64, 1)), 16 * dp.world_size()), steps_per_epoch=4" in \
        result.output.decode()
    assert [f.line for f in findings_of(result, "keras-fit", "declined")] == [16]  # np.random.shuffle
    notes = [f.message.split("=")[0] for f in findings_of(result, "keras-fit", "note") if "counts" in f.message]
    assert notes == ["save_freq", "steps_per_epoch"]


def test_a_sequence_under_the_global_policy_is_kept_and_said_so():
    result = convert_text(SEQUENCE, select=("keras-fit",), batch="global")
    assert "np.zeros((64, 1)), 16), steps_per_epoch=4" in result.output.decode()
    assert any("Keras splits each of its batches" in f.message for f in findings_of(result, "keras-fit", "note"))


def test_an_aliased_multi_gpu_model_in_a_session_script_is_declined_as_multi_gpu_model_not_as_towers():
    result = assert_unchanged("""import numpy as np
import tensorflow as tf
from keras import backend as K
from keras.layers import Dense
from keras.models import Sequential
from keras.utils import multi_gpu_model as replicate

K.set_session(tf.Session())
towers = []
for g in range(2):
    with tf.device("/gpu:%d" % g):
        towers.append(make_tower(g))
model = Sequential([Dense(4, input_shape=(8,))])
parallel = replicate(model, gpus=2)
parallel.compile(optimizer="sgd", loss="mse")
parallel.fit(np.zeros((32, 8)), np.zeros((32, 4)), batch_size=16)
""")
    declined = findings_of(result, "tf-legacy-graph", "declined")
    assert [f.line for f in declined] == [14] and "multi_gpu_model" in declined[0].message


def test_a_keras_dataset_factory_gets_its_batch_size_multiplied_or_its_default_made_explicit():
    source = HEAD + """
train = tf.keras.utils.text_dataset_from_directory("reviews/train", batch_size=16)
train = train.map(lambda x, y: (x, y)).cache()
test = tf.keras.utils.image_dataset_from_directory("images")
model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(train, epochs=1)
model.fit(test, epochs=1)
"""
    out = convert_text(source, select=("keras-fit",)).output.decode()
    assert 'text_dataset_from_directory("reviews/train", batch_size=16 * dp.world_size())' in out
    assert 'image_dataset_from_directory("images", batch_size=32 * dp.world_size())' in out
    result = convert_text(source, select=("keras-fit",), batch="global")
    assert "world_size" not in result.output.decode().split("model = ")[0]
    assert not findings_of(result, "keras-fit", "declined")


def test_under_the_global_policy_a_batch_constant_read_in_the_step_is_reported():
    result = convert_text(HEAD + """
BATCH = 64
ds = tf.data.Dataset.from_tensor_slices(np.zeros((256, 4), "float32")).batch(BATCH)
gen = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(4)])
opt = tf.keras.optimizers.SGD(0.1)


@tf.function
def step(real):
    noise = tf.random.normal([BATCH, 2])
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(gen(noise) - real))
    opt.apply_gradients(zip(tape.gradient(loss, gen.trainable_variables), gen.trainable_variables))


for real in ds:
    step(real)
""", select=("tf-custom-loop",), batch="global")
    notes = [f for f in findings_of(result, "tf-custom-loop", "note") if "BATCH is read in the training step" in f.message]
    assert [f.line for f in notes] == [12]


def test_an_image_data_generator_flow_gets_its_batch_multiplied():
    out = convert_text(HEAD + """
from tensorflow.keras.preprocessing.image import ImageDataGenerator
augment = ImageDataGenerator(horizontal_flip=True)
model = tf.keras.Sequential([tf.keras.Input((4, 4, 1)), tf.keras.layers.Flatten(), tf.keras.layers.Dense(1)])
model.compile(optimizer="sgd", loss="mse")
model.fit(augment.flow(np.zeros((8, 4, 4, 1)), np.zeros((8, 1)), batch_size=4), epochs=1)
""", select=("keras-fit",)).output.decode()
    assert "augment.flow(np.zeros((8, 4, 4, 1)), np.zeros((8, 1)), batch_size=4 * dp.world_size())" in out
