"""Cases for the Paddle runtime in one process, run by tests/test_paddle_runtime_single.py in a pytest of
their own (one framework per process: the main test session imports torch).

Not launched, the runtime starts nothing and behaves exactly like the plain Paddle code; the sharding of
loaders is checked for 2 ranks as a pure function of (rank, world size) against the single-process batches.
"""

import io
import os

import numpy as np
import paddle
import pytest

import dpmigrate.runtime.paddle as dp
from dpmigrate.runtime import _paddle_data, _paddle_strategy

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


def dataset(n=10):
    return paddle.io.TensorDataset([paddle.arange(n, dtype="float32").reshape([n, 1])])


def batches(loader):
    return [b[0].numpy().ravel().astype(int).tolist() for b in loader]


def test_init_without_launcher_is_rank_0_of_1_and_starts_nothing():
    role = dp.init()
    assert (role.rank, role.world_size, role.launcher) == (0, 1, "none")
    assert dp.init() is role
    assert not paddle.distributed.is_initialized()
    assert (dp.rank(), dp.local_rank(), dp.world_size(), dp.is_main_process()) == (0, 0, 1, True)
    assert dp.device() == "cpu"


def test_model_optimizer_and_loader_are_the_originals():
    model = paddle.nn.Linear(3, 2)
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    loader = paddle.io.DataLoader(dataset(), batch_size=4, shuffle=True)
    assert dp.distributed_model(model) is model and dp.unwrap(model) is model
    assert dp.distributed_optimizer(optimizer) is optimizer
    assert dp.distributed_loader(loader) is loader and dp.distributed_loader(loader, evaluation=True) is loader
    data = dataset()
    assert dp.distributed_loader(data) is data


def test_unwrap_removes_a_data_parallel_wrapper_without_starting_anything():
    model = paddle.nn.Linear(3, 2)
    wrapped = paddle.DataParallel(model)  # world size 1: Paddle wraps without a process group
    assert dp.unwrap(wrapped) is model
    assert list(wrapped.state_dict()) == list(model.state_dict()) == ["weight", "bias"]


def test_collectives_return_the_value_unchanged():
    tensor = paddle.to_tensor([1.5, 2.5])
    assert dp.all_reduce(3) == 3 and dp.all_reduce(2.5, op="max") == 2.5
    reduced = dp.all_reduce(tensor, op="sum")
    assert reduced is not tensor and reduced.numpy().tolist() == [1.5, 2.5]
    assert dp.all_gather(tensor).numpy().tolist() == [1.5, 2.5]
    assert dp.all_gather(paddle.to_tensor(4.0)).numpy().tolist() == [4.0]
    assert dp.all_gather({"a": 1}) == [{"a": 1}]
    assert dp.broadcast("x") == "x" and dp.broadcast(tensor) is tensor
    dp.barrier()
    with pytest.raises(ValueError, match="all_reduce\\(op='avg'\\)"):
        dp.all_reduce(1, op="avg")


def test_policies_at_world_size_1():
    assert dp.per_rank_batch_size(32) == 32
    assert dp.scale_lr(0.1) == 0.1 and dp.scale_lr(0.1, "sqrt") == 0.1
    assert dp.shard([1, 2, 3]) == [1, 2, 3]


def test_save_writes_what_paddle_save_writes_atomically(tmp_path):
    model = paddle.nn.Linear(3, 2)
    dp.save(model.state_dict(), tmp_path / "ckpt.pdparams")
    plain = io.BytesIO()
    paddle.save(model.state_dict(), plain)
    assert (tmp_path / "ckpt.pdparams").read_bytes() == plain.getvalue()
    assert os.listdir(tmp_path) == ["ckpt.pdparams"]  # no temporary left
    state = paddle.load(str(tmp_path / "ckpt.pdparams"))
    assert np.array_equal(state["weight"].numpy(), model.weight.numpy())


def test_save_makes_a_missing_folder_as_paddle_save_does(tmp_path):
    """Issue 19, round H: a recommender tutorial saved into ./checkpoint/ it never made; paddle.save makes it."""
    model = paddle.nn.Linear(3, 2)
    paddle.save(model.state_dict(), str(tmp_path / "plain" / "deeper" / "ckpt.pdparams"))
    dp.save(model.state_dict(), str(tmp_path / "ours" / "deeper" / "ckpt.pdparams"))
    assert (tmp_path / "ours" / "deeper" / "ckpt.pdparams").read_bytes() == \
        (tmp_path / "plain" / "deeper" / "ckpt.pdparams").read_bytes()


def test_print_and_main_process_first_run_once(capsys):
    with dp.main_process_first():
        dp.print("hello", 1)
    with dp.scope():
        pass
    assert capsys.readouterr().out == "hello 1\n"


@pytest.mark.parametrize("strategy, knob", [
    (dp.Strategy(hierarchical_allreduce=True), "use_hierarchical_allreduce"),
    (dp.Strategy(localsgd_steps=4), "localsgd"),
    (dp.Strategy(gradient_compression="fp16"), "fp16_allreduce"),
    (dp.Strategy(gradient_accumulation=2), "gradient_merge"),
])
def test_static_graph_only_knobs_are_refused_in_dygraph(strategy, knob):
    with pytest.raises(dp.UnsupportedStrategy, match=f"DistributedStrategy.{knob}.*static-graph optimizer only"):
        dp.init(strategy)


def test_sync_batchnorm_maps_onto_the_static_strategy_and_unlaunched_leaves_the_model():
    assert _paddle_strategy.to_distributed_strategy(dp.Strategy(sync_batchnorm=True), mode="static-fleet").sync_batch_norm
    dp.init(dp.Strategy(sync_batchnorm=True))
    model = paddle.nn.Sequential(paddle.nn.Linear(3, 4), paddle.nn.BatchNorm1D(4))
    assert dp.distributed_model(model) is model and type(model[1]) is paddle.nn.BatchNorm1D


def test_sync_batchnorm_off_a_gpu_is_refused_naming_the_layers_and_a_model_without_them_is_kept():
    model = paddle.nn.Sequential(paddle.nn.Linear(3, 4), paddle.nn.BatchNorm1D(4))
    with pytest.raises(dp.UnsupportedStrategy, match=r"GPUs only and this rank trains on cpu, .*layers \(1\)"):
        _paddle_strategy.synchronised_batchnorm(model)
    plain = paddle.nn.Sequential(paddle.nn.Linear(3, 4), paddle.nn.LayerNorm(4))
    assert _paddle_strategy.synchronised_batchnorm(plain) is plain


def test_bf16_compression_is_refused_everywhere():
    with pytest.raises(dp.UnsupportedStrategy, match="fp16_allreduce only"):
        _paddle_strategy.check(dp.Strategy(gradient_compression="bf16"), mode="static-fleet")


def test_knobs_map_onto_distributed_strategy():
    native = _paddle_strategy.to_distributed_strategy(dp.Strategy(bucket_size_mb=8), mode="dygraph")
    assert native.fuse_grad_size_in_MB == 8 and native.fuse_all_reduce_ops
    native = _paddle_strategy.to_distributed_strategy(dp.Strategy(
        hierarchical_allreduce=True, localsgd_steps=4, localsgd_warmup_steps=10, gradient_accumulation=3),
        mode="static-fleet")
    assert native.use_hierarchical_allreduce and native.localsgd and native.gradient_merge
    assert (native.localsgd_configs["k_steps"], native.localsgd_configs["begin_step"]) == (4, 11)
    assert (native.gradient_merge_configs["k_steps"], native.gradient_merge_configs["avg"]) == (3, True)


def test_init_twice_with_another_strategy_is_an_error():
    dp.init(dp.Strategy(bucket_size_mb=8))
    with pytest.raises(ValueError, match="already called"):
        dp.init(dp.Strategy(bucket_size_mb=16))


# --- sharding for 2 ranks, as a pure function of (rank, world size) --------------------------------


def test_training_shards_make_up_the_single_process_global_batches():
    """Global batch k of 2 ranks x 4 == batch k of 1 process x 8, in order, drop_last kept."""
    single = batches(paddle.io.DataLoader(dataset(20), batch_size=8, shuffle=False, drop_last=True))
    shards = [batches(_paddle_data.distributed_loader_for(
        paddle.io.DataLoader(dataset(20), batch_size=4, shuffle=False, drop_last=True), r, 2)) for r in (0, 1)]
    assert single == [[0, 1, 2, 3, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13, 14, 15]]
    assert [a + b for a, b in zip(*shards)] == single


def test_shuffled_training_shards_agree_across_ranks_and_change_every_epoch():
    loaders = [_paddle_data.distributed_loader_for(paddle.io.DataLoader(dataset(16), batch_size=4, shuffle=True),
                                                   r, 2) for r in (0, 1)]
    epochs = [[sum(batches(loader), []) for loader in loaders] for _ in range(2)]
    for first, second in epochs:
        assert sorted(first + second) == list(range(16))  # disjoint and complete: the ranks agree
    assert epochs[0][0] != epochs[1][0]  # a new permutation on the second pass, without set_epoch
    assert [type(loader.batch_sampler).__name__ for loader in loaders] == ["DistributedBatchSampler"] * 2
    assert loaders[0].batch_sampler.batch_size == 4


def test_evaluation_shards_see_every_sample_exactly_once():
    shards = [batches(_paddle_data.distributed_loader_for(paddle.io.DataLoader(dataset(11), batch_size=2), r, 2,
                                                          evaluation=True)) for r in (0, 1)]
    assert sorted(sum(shards[0] + shards[1], [])) == list(range(11))  # 11 samples: no padding
    assert shards[0] == [[0, 2], [4, 6], [8, 10]] and shards[1] == [[1, 3], [5, 7], [9]]


def test_evaluation_shards_with_drop_last_split_the_samples_one_process_evaluates():
    """drop_last=True: 20 samples in batches of 8 are 16 evaluated (0..15) on one process. Each rank dropping its own
    last batch evaluated 0, 2, ..., 14 and 1, 3, ..., 15 only by luck of the sizes, and paddle.Model's gathered count
    (up to len(dataset), 20) never closed (round Q: "Eval samples: 16", then 4)."""
    single = batches(paddle.io.DataLoader(dataset(21), batch_size=8, drop_last=True))
    loaders = [_paddle_data.distributed_loader_for(paddle.io.DataLoader(dataset(21), batch_size=8, drop_last=True), r, 2,
                                                   evaluation=True) for r in (0, 1)]
    shards = [batches(loader) for loader in loaders]
    assert sorted(sum(shards[0] + shards[1], [])) == sorted(sum(single, [])) == list(range(16))
    assert shards[0] == [[0, 2, 4, 6, 8, 10, 12, 14]] and shards[1] == [[1, 3, 5, 7, 9, 11, 13, 15]]
    assert [len(loader.dataset) for loader in loaders] == [16, 16]  # what paddle.Model counts the gathered samples to
    whole = _paddle_data.distributed_loader_for(paddle.io.DataLoader(dataset(16), batch_size=8, drop_last=True), 0, 2,
                                                evaluation=True)
    assert len(whole.dataset) == 16 and batches(whole) == [[0, 2, 4, 6, 8, 10, 12, 14]]


def test_a_custom_batch_sampler_is_refused_with_the_fix():
    data = dataset()
    loader = paddle.io.DataLoader(data, batch_sampler=paddle.io.BatchSampler(
        sampler=paddle.io.WeightedRandomSampler([1.0] * 10, 10), batch_size=2))
    with pytest.raises(ValueError, match="DistributedBatchSampler"):
        _paddle_data.distributed_loader_for(loader, 0, 2)


def test_a_dataset_is_sharded_by_position():
    shard = _paddle_data.distributed_loader_for(dataset(5), 1, 2)
    assert [int(shard[i][0].item()) for i in range(len(shard))] == [1, 3]


def test_static_mode_at_world_size_1_keeps_the_optimizer_and_refuses_knobs_on_cpu():
    paddle.enable_static()
    try:
        optimizer = paddle.optimizer.SGD(learning_rate=0.1)
        assert dp.distributed_optimizer(optimizer) is optimizer
        dp._reset_for_tests()
        with pytest.raises(dp.UnsupportedStrategy, match="CPU build in static graph mode"):
            dp.init(dp.Strategy(bucket_size_mb=8))
    finally:
        paddle.disable_static()
