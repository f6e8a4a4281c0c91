"""Cases for the TensorFlow runtime in one process, run by tests/test_tf_runtime_single.py in a pytest of their
own (one framework per process: the main test session imports torch).

Not launched, the runtime starts nothing and behaves exactly like the plain TensorFlow code: the same
training written with and without dp.* gives bit-identical weights. The per-worker sharding is checked
for 2 workers as a pure function of (rank, world size) against the single-process batches.
"""

import os
import pickle

import numpy as np
import pytest
import tensorflow as tf
from tensorflow import keras

import dpmigrate.runtime.tensorflow as dp
from dpmigrate.runtime import Role, Strategy, UnsupportedStrategy, _tf_data, _tf_env, _tf_strategy

LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TF_CONFIG",
                      "PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "SLURM_PROCID", "SLURM_NTASKS",
                      "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "TORCHELASTIC_RUN_ID")


@pytest.fixture(autouse=True)
def not_launched(monkeypatch):
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    dp._reset_for_tests()
    yield
    dp._reset_for_tests()


def data(n=64):
    rng = np.random.RandomState(1)
    x = rng.normal(size=(n, 4)).astype("float32")
    return x, (x @ rng.normal(size=(4, 1))).astype("float32")


def model_with_fixed_weights():
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(3, activation="tanh"), keras.layers.Dense(1)])
    rng = np.random.RandomState(2)
    model.set_weights([rng.normal(size=w.shape).astype("float32") for w in model.get_weights()])
    return model


def train(use_dp: bool):
    x, y = data()
    if use_dp:
        dp.init()
        with dp.scope():
            model = model_with_fixed_weights()
        model = dp.distributed_model(model)
        optimizer = dp.distributed_optimizer(keras.optimizers.SGD(0.05))
        batches = dp.distributed_loader(tf.data.Dataset.from_tensor_slices((x, y)).batch(dp.per_rank_batch_size(16)))
    else:
        model = model_with_fixed_weights()
        optimizer = keras.optimizers.SGD(0.05)
        batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(16)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(xb) - yb))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    losses = [float(step(xb, yb)) for _ in range(2) for xb, yb in batches]
    return model.get_weights(), losses


def test_a_tape_loop_through_dp_is_bit_identical_to_plain_tensorflow():
    plain_weights, plain_losses = train(use_dp=False)
    dp_weights, dp_losses = train(use_dp=True)
    assert dp_losses == plain_losses
    for a, b in zip(plain_weights, dp_weights):
        assert np.array_equal(a, b)
    assert plain_losses[-1] < plain_losses[0]  # it trained


def test_not_launched_init_starts_nothing_and_scope_is_the_default_strategy():
    assert dp.init() == Role()
    assert (dp.rank(), dp.world_size(), dp.local_rank(), dp.is_main_process()) == (0, 1, 0, True)
    with dp.scope():
        assert not tf.distribute.has_strategy()
        assert tf.distribute.get_strategy() is tf.distribute.get_strategy()
    assert "TF_CONFIG" not in os.environ
    assert dp.device() in ("/CPU:0", "/GPU:0")


def test_not_launched_model_optimizer_and_dataset_come_back_untouched():
    model, optimizer = model_with_fixed_weights(), keras.optimizers.SGD(0.1)
    dataset = tf.data.Dataset.range(10).batch(3)
    assert dp.distributed_model(model) is model and dp.unwrap(model) is model
    assert dp.distributed_optimizer(optimizer) is optimizer and "apply_gradients" not in vars(optimizer)
    assert dp.distributed_loader(dataset) is dataset


def test_arrays_become_the_batches_from_tensor_slices_would_give():
    x, y = data(10)
    batches = list(dp.distributed_loader((x, y), batch_size=4))
    assert [len(b[0]) for b in batches] == [4, 4, 2]
    assert np.array_equal(np.concatenate([b[0] for b in batches]), x)


def test_two_workers_take_alternate_batches_that_together_are_the_original_ones():
    original = [b.numpy().tolist() for b in tf.data.Dataset.range(20).batch(3)]  # 7 batches, the last of 2
    shards = [[b.numpy().tolist() for b in _tf_data.distributed_loader_for(tf.data.Dataset.range(20).batch(3), r, 2)]
              for r in (0, 1)]
    assert shards[0] == original[0:6:2] and shards[1] == original[1:6:2]  # batch 6 dropped: equal step counts
    evaluation = [[b.numpy().tolist() for b in
                   _tf_data.distributed_loader_for(tf.data.Dataset.range(20).batch(3), r, 2, evaluation=True)]
                  for r in (0, 1)]
    assert sorted(sum(evaluation, [])) == sorted(original)  # every batch exactly once
    options = _tf_data.distributed_loader_for(tf.data.Dataset.range(20).batch(3), 0, 2).options()
    assert options.experimental_distribute.auto_shard_policy == tf.data.experimental.AutoShardPolicy.OFF


def test_a_dataset_of_unknown_length_is_refused_for_training_with_the_fix():
    filtered = tf.data.Dataset.range(20).filter(lambda v: v % 2 == 0).batch(3)
    with pytest.raises(ValueError, match="assert_cardinality"):
        _tf_data.distributed_loader_for(filtered, 0, 2)


def test_collectives_on_one_process_return_the_value():
    assert dp.all_reduce(3) == 3 and dp.all_reduce(2.5, op="max") == 2.5
    assert dp.all_reduce(tf.constant([1.0, 2.0]), op="sum").numpy().tolist() == [1.0, 2.0]
    metric = keras.metrics.Mean()
    metric.update_state([1.0, 3.0])
    assert float(dp.all_reduce(metric)) == 2.0
    assert dp.all_gather(tf.constant(5)).numpy().tolist() == [5]
    assert dp.all_gather({"a": 1}) == [{"a": 1}]
    assert dp.broadcast("x") == "x"
    dp.barrier()
    with pytest.raises(ValueError, match="all_reduce\\(op='median'\\)"):
        dp.all_reduce(1.0, op="median")


def test_strategy_knobs_tf_cannot_honour_raise_and_bucket_size_becomes_bytes_per_pack():
    for knobs in (dict(hierarchical_allreduce=True), dict(localsgd_steps=4), dict(gradient_compression="fp16"),
                  dict(gradient_accumulation=2)):
        with pytest.raises(UnsupportedStrategy):
            dp.init(Strategy(**knobs))
        dp._reset_for_tests()
    options = _tf_strategy.communication_options(Strategy(bucket_size_mb=25), 30.0)
    assert (options.bytes_per_pack, options.timeout_seconds) == (25 * 2**20, 30.0)


def test_save_writes_a_loadable_model_weights_checkpoint_and_object_and_leaves_no_temporaries(tmp_path):
    model = model_with_fixed_weights()
    assert dp.save(model, tmp_path / "m.keras") == str(tmp_path / "m.keras")
    dp.save(model, tmp_path / "w.weights.h5", weights_only=True)
    checkpoint = tf.train.Checkpoint(model=model)
    saved = dp.save(checkpoint, tmp_path / "ckpt" / "step")
    assert saved == str(tmp_path / "ckpt" / "step-1") and tf.train.latest_checkpoint(tmp_path / "ckpt") == saved
    dp.save({"epoch": 3}, tmp_path / "state.pkl")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "m.keras", "state.pkl", "w.weights.h5"]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["checkpoint", "step-1.data-00000-of-00001",
                                                                      "step-1.index"]
    loaded = keras.models.load_model(tmp_path / "m.keras")
    for a, b in zip(loaded.get_weights(), model.get_weights()):
        assert np.array_equal(a, b)
    with open(tmp_path / "state.pkl", "rb") as f:
        assert pickle.load(f) == {"epoch": 3}


def test_loop_helpers_on_one_process_are_the_default_strategy():
    per_example = tf.constant([1.0, 2.0, 3.0, 6.0])
    assert float(dp.loop.compute_average_loss(per_example)) == 3.0
    assert float(dp.loop.reduce(dp.loop.run(lambda: tf.constant(2.0)), op="sum")) == 2.0
    dataset = tf.data.Dataset.range(4).batch(2)
    assert dp.loop.distribute(dataset) is dataset
    assert dp.loop.strategy() is tf.distribute.get_strategy()


def test_keras3_models_are_told_apart_from_tf_keras_ones():
    assert _tf_env.is_keras3_model(model_with_fixed_weights()) == keras.__name__.startswith("keras")


def test_not_launched_the_tf_only_helpers_change_nothing(tmp_path):
    """dp.enter_scope() sets no strategy, dp.chief_path() is the path itself, shuffles and predict stay Keras'
    and TensorFlow's own: the converted script run plainly is the original (issue 20)."""
    from tensorflow.python.data.ops import dataset_ops

    shuffle, predict = dataset_ops.DatasetV2.shuffle, keras.Model.predict
    dp.enter_scope()
    assert not tf.distribute.has_strategy()
    assert dp.chief_path(tmp_path / "export") == tmp_path / "export" and dp.chief_path("logs") == "logs"
    assert dataset_ops.DatasetV2.shuffle is shuffle and keras.Model.predict is predict


def test_a_checkpoint_manager_saved_through_dp_save_writes_what_the_manager_writes(tmp_path):
    model = model_with_fixed_weights()
    plain = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), tmp_path / "plain", max_to_keep=2)
    ours = tf.train.CheckpointManager(tf.train.Checkpoint(model=model), tmp_path / "ours", max_to_keep=2)
    for _ in range(3):
        plain.save()
        written = dp.save(ours, ours.directory)
    assert written == ours.latest_checkpoint == str(tmp_path / "ours" / "ckpt-3")
    assert sorted(p.name for p in (tmp_path / "plain").iterdir()) == sorted(p.name for p in (tmp_path / "ours").iterdir())
