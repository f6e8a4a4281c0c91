"""The Paddle dygraph and high-level-API rules, one behaviour per test (before -> after, or unchanged).

Pure codemod tests: Paddle itself is never imported here.
"""

from __future__ import annotations

import pytest
from rule_testing import assert_converts, assert_rule_converts, assert_unchanged, convert_text, findings_of

IMPORT = "import dpmigrate.runtime.paddle as dp\n"

SCRIPT = '''\
import paddle
import paddle.nn.functional as F

paddle.set_device("gpu")
data = paddle.io.TensorDataset([paddle.randn([8, 2]), paddle.randn([8, 1])])
loader = paddle.io.DataLoader(data, batch_size=4)
model = paddle.nn.Linear(2, 1)
opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
for x, y in loader():
    F.mse_loss(model(x), y).backward()
    opt.step()
    opt.clear_grad()
print("done")
paddle.save(model.state_dict(), "m.pdparams")
'''

ALONE = {
    "init-runtime": ('paddle.set_device("gpu")', 'dp.init()\npaddle.set_device("gpu")'),
    "paddle-rank-device": ('paddle.set_device("gpu")', "paddle.set_device(dp.device())"),
    "paddle-distributed-model": (
        "model = paddle.nn.Linear(2, 1)\n", "model = paddle.nn.Linear(2, 1)\nmodel = dp.distributed_model(model)\n"),
    "paddle-distributed-optimizer": (
        "opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())",
        "opt = dp.distributed_optimizer(paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters()))"),
    "paddle-shard-training-loader": (
        "loader = paddle.io.DataLoader(data, batch_size=4)",
        "loader = dp.distributed_loader(paddle.io.DataLoader(data, batch_size=4))"),
    "paddle-distributed-save": ('paddle.save(model.state_dict(), "m.pdparams")',
                                'dp.save(model.state_dict(), "m.pdparams")'),
    "main-process-print": ('print("done")', 'dp.print("done")'),
}


def _with_import(source: str) -> str:
    lines = source.splitlines(keepends=True)
    lines.insert(2, IMPORT)  # after the imports, as AddImportsVisitor puts it
    return "".join(lines)


@pytest.mark.parametrize("rule", sorted(ALONE))
def test_each_paddle_rule_alone_makes_only_its_own_edit(rule):
    old, new = ALONE[rule]
    assert_rule_converts(rule, SCRIPT, _with_import(SCRIPT.replace(old, new)))


def test_global_batch_size_alone_divides_the_training_loaders_batch():
    old = "loader = paddle.io.DataLoader(data, batch_size=4)"
    new = "loader = paddle.io.DataLoader(data, batch_size=dp.per_rank_batch_size(4))"
    assert_rule_converts("paddle-global-batch-size", SCRIPT, _with_import(SCRIPT.replace(old, new)), batch="global")


def test_the_callable_loader_idiom_through_enumerate_and_a_function_is_a_training_loader():
    result = convert_text('''\
        import paddle

        def train(net, opt, batches):
            for step, (x, y) in enumerate(batches()):
                net(x).mean().backward()
                opt.step()

        net = paddle.nn.Linear(2, 1)
        opt = paddle.optimizer.SGD(parameters=net.parameters())
        loader = paddle.io.DataLoader(paddle.io.TensorDataset([paddle.ones([4, 2])]), batch_size=2)
        train(net, opt, loader)
        ''')
    assert "loader = dp.distributed_loader(paddle.io.DataLoader(" in result.output.decode()
    assert findings_of(result, "paddle-shard-training-loader", "change")


def test_optimizers_are_matched_by_qualified_name_and_schedulers_are_not_optimizers():
    result = convert_text('''\
        import paddle
        from paddle import optimizer as o

        class SGD:
            def __init__(self, parameters):
                self.parameters = parameters

        net = paddle.nn.Linear(2, 1)
        decay = o.lr.StepDecay(learning_rate=0.1, step_size=1)
        real = o.Momentum(learning_rate=decay, parameters=net.parameters())
        mine = SGD(net.parameters())
        net(paddle.ones([1, 2])).sum().backward()
        real.step()
        ''')
    out = result.output.decode()
    assert "real = dp.distributed_optimizer(o.Momentum(" in out
    assert "decay = o.lr.StepDecay(" in out and "mine = SGD(net.parameters())" in out


def test_scale_lr_scales_learning_rate_and_declines_a_default_or_a_scheduler():
    result = convert_text('''\
        import paddle
        net = paddle.nn.Linear(2, 1)
        a = paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters())
        b = paddle.optimizer.Adam(parameters=net.parameters())
        sched = paddle.optimizer.lr.CosineAnnealingDecay(0.1, 10)
        c = paddle.optimizer.SGD(sched, parameters=net.parameters())
        net(paddle.ones([1, 2])).sum().backward()
        ''', scale_lr="linear")
    assert 'learning_rate=dp.scale_lr(0.1, "linear")' in result.output.decode()
    declined = findings_of(result, "paddle-distributed-optimizer", "declined")
    assert [f.line for f in declined] == [4, 6]
    assert "default learning rate" in declined[0].message and "scheduler" in declined[1].message


@pytest.mark.parametrize(
    "device, expected",
    [
        ('"gpu:1"', "dp.device()"),
        ('"gpu" if use_gpu else "cpu"', 'dp.device() if use_gpu else "cpu"'),
        ("args.device", 'dp.device() if args.device.startswith("gpu") else args.device'),
    ],
)
def test_set_device_gives_this_ranks_card(device, expected):
    before = f'''\
        import paddle
        paddle.set_device({device})
        net = paddle.nn.Linear(2, 1)
        opt = paddle.optimizer.SGD(parameters=net.parameters())
        '''
    result = convert_text(before, select=("paddle-rank-device",))
    assert f"paddle.set_device({expected})" in result.output.decode()


def test_a_cpu_device_stays_and_a_computed_device_is_declined_with_the_fix():
    result = convert_text('''\
        import paddle
        paddle.set_device("cpu")
        paddle.set_device(pick_device())
        place = paddle.CUDAPlace(0)
        x = paddle.ones([2]).cuda(0)
        ''', select=("paddle-rank-device",))
    out = result.output.decode()
    assert 'paddle.set_device("cpu")' in out and "paddle.set_device(pick_device())" in out
    assert "place = paddle.CUDAPlace(dp.local_rank())" in out and ".cuda(dp.local_rank())" in out
    [declined] = findings_of(result, "paddle-rank-device", "declined")
    assert declined.line == 3 and "dp.device()" in declined.fix


def test_a_loader_with_its_own_batch_sampler_is_declined_not_sharded():
    result = convert_text('''\
        import paddle
        ds = paddle.io.TensorDataset([paddle.ones([4, 2])])
        loader = paddle.io.DataLoader(ds, batch_sampler=paddle.io.BatchSampler(ds, batch_size=2))
        net = paddle.nn.Linear(2, 1)
        opt = paddle.optimizer.SGD(parameters=net.parameters())
        for (x,) in loader:
            net(x).sum().backward()
            opt.step()
        ''')
    assert "dp.distributed_loader" not in result.output.decode()
    [declined] = findings_of(result, "paddle-shard-training-loader", "declined")
    assert "batch_sampler" in declined.message and "DistributedBatchSampler" in declined.fix


def test_global_batch_never_takes_feed_list_for_the_batch_size():
    result = convert_text('''\
        import paddle
        ds = paddle.io.TensorDataset([paddle.ones([4, 2])])
        loader = paddle.io.DataLoader(ds, None)
        net = paddle.nn.Linear(2, 1)
        opt = paddle.optimizer.SGD(parameters=net.parameters())
        for (x,) in loader:
            net(x).sum().backward()
            opt.step()
        ''', batch="global")
    assert "per_rank_batch_size" not in result.output.decode()
    [declined] = findings_of(result, "paddle-global-batch-size", "declined")
    assert "batch size" in declined.message


HAPI = '''\
import paddle

net = paddle.nn.Linear(2, 1)
model = paddle.Model(net)
model.prepare(paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters()), paddle.nn.MSELoss())
train_loader = paddle.io.DataLoader(train_ds, batch_size=8)
eval_loader = paddle.io.DataLoader(eval_ds, batch_size=8)
model.fit(train_ds, batch_size=16, epochs=2)
model.fit(train_loader, epochs=1)
model.evaluate(eval_loader)
model.save("ckpt/final")
model.load("ckpt/final")
'''


def test_high_level_api_is_not_wrapped_twice_and_gets_the_batch_policy_and_a_sharded_loader():
    assert_converts(HAPI, '''\
import paddle
import dpmigrate.runtime.paddle as dp

dp.init()
net = paddle.nn.Linear(2, 1)
model = paddle.Model(net)
model.prepare(paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters()), paddle.nn.MSELoss())
train_loader = dp.distributed_loader(paddle.io.DataLoader(train_ds, batch_size=dp.per_rank_batch_size(8)))
eval_loader = paddle.io.DataLoader(eval_ds, batch_size=8)
model.fit(train_ds, batch_size=dp.per_rank_batch_size(16), epochs=2)
model.fit(train_loader, epochs=1)
model.evaluate(eval_loader)
model.save("ckpt/final")
dp.barrier()
model.load("ckpt/final")
''', batch="global")


def test_high_level_fit_with_the_default_batch_is_declined_under_global_batch():
    result = convert_text('''\
        import paddle
        model = paddle.Model(paddle.nn.Linear(2, 1))
        model.fit(train_ds, epochs=2)
        ''', batch="global")
    [declined] = findings_of(result, "paddle-global-batch-size", "declined")
    assert declined.line == 3 and "dp.per_rank_batch_size" in declined.fix


def test_loader_evaluated_by_a_high_level_model_is_left_whole_with_a_note():
    result = convert_text(HAPI)
    [note] = findings_of(result, "paddle-shard-training-loader", "note")
    assert note.line == 7 and "left whole" in note.message


def test_whole_layer_save_and_rank_guarded_save_are_declined():
    result = convert_text('''\
        import paddle
        net = paddle.nn.Linear(2, 1)
        opt = paddle.optimizer.SGD(parameters=net.parameters())
        net(paddle.ones([1, 2])).sum().backward()
        opt.step()
        paddle.save(net, "net.pdparams")
        if args.local_rank == 0:
            paddle.save(net.state_dict(), "net.pdparams")
        ''')
    declined = findings_of(result, "paddle-distributed-save", "declined")
    assert [f.line for f in declined] == [6, 8]
    assert "state_dict" in declined[0].fix and "rank condition" in declined[1].message
    assert "dp.save" not in result.output.decode()


def test_jit_save_exports_the_unwrapped_layer_on_the_main_process_then_meets():
    result = convert_text('''\
        import paddle
        net = paddle.nn.Linear(2, 1)
        opt = paddle.optimizer.SGD(parameters=net.parameters())
        net(paddle.ones([1, 2])).sum().backward()
        opt.step()
        paddle.jit.save(net, "infer/net")
        ''')
    assert result.output.decode().endswith(
        "if dp.is_main_process():\n    paddle.jit.save(dp.unwrap(net), \"infer/net\")\ndp.barrier()\n")


def test_static_graph_files_are_left_to_the_static_rules():
    source = '''\
        import paddle
        paddle.enable_static()
        x = paddle.static.data("x", [None, 2])
        loss = paddle.mean(paddle.static.nn.fc(x, 1))
        opt = paddle.optimizer.SGD(learning_rate=0.1)
        opt.minimize(loss)
        paddle.set_device("gpu")
        paddle.save(paddle.static.default_main_program().state_dict(), "m.pdparams")
        '''
    result = convert_text(source)
    dygraph = {"paddle-rank-device", "paddle-distributed-model", "paddle-distributed-optimizer",
               "paddle-shard-training-loader"}
    assert not [f for f in result.findings if f.rule in dygraph]
    # a static program's state_dict is still saved once, by rank 0 (dp.save works in static mode)
    assert 'dp.save(paddle.static.default_main_program().state_dict(), "m.pdparams")' in result.output.decode()


def test_fluid_files_are_left_to_the_fluid_rules_even_their_paddle_save():
    result = convert_text('''\
        import paddle
        import paddle.fluid as fluid
        opt = fluid.optimizer.SGD(learning_rate=0.1)
        opt.minimize(loss)
        paddle.save(fluid.default_main_program().state_dict(), "m.pdparams")
        ''')
    assert not findings_of(result, "paddle-distributed-save")


def test_a_file_using_data_parallel_by_hand_is_left_alone():
    result = assert_unchanged('''\
        import paddle
        paddle.distributed.init_parallel_env()
        model = paddle.DataParallel(paddle.nn.Linear(2, 1))
        opt = paddle.optimizer.SGD(parameters=model.parameters())
        model(paddle.ones([1, 2])).sum().backward()
        opt.step()
        ''')
    [note] = result.findings
    assert note.line == 2 and "by hand" in note.message


def test_a_paddle_module_that_trains_nothing_is_unchanged():
    assert_unchanged('''\
        import paddle

        class Net(paddle.nn.Layer):
            def forward(self, x):
                return x * 2

        print("imported")
        ''')


def test_paddle_vision_datasets_download_on_the_main_process_first():
    result = convert_text('''\
        import paddle
        from paddle.vision.datasets import Cifar10
        train = Cifar10(mode="train")
        net = paddle.nn.Linear(2, 1)
        opt = paddle.optimizer.SGD(parameters=net.parameters())
        net(paddle.ones([1, 2])).sum().backward()
        print(len(train))
        ''')
    assert 'with dp.main_process_first():\n    train = Cifar10(mode="train")' in result.output.decode()


def test_parameters_given_positionally_after_the_learning_rate_make_a_model():
    result = convert_text('''\
        import paddle
        net = paddle.nn.Linear(2, 1)
        opt = paddle.optimizer.SGD(0.1, net.parameters())
        net(paddle.ones([1, 2])).sum().backward()
        opt.step()
        ''')
    assert "net = dp.distributed_model(net)\n" in result.output.decode()


def test_high_level_summary_is_printed_by_the_main_process_only_unless_its_value_is_kept():
    result = convert_text('''\
        import paddle
        model = paddle.Model(paddle.nn.Linear(2, 1))
        model.summary((1, 2))
        info = model.summary((1, 2))
        model.fit(train_ds, batch_size=4)
        ''')
    out = result.output.decode()
    assert "if dp.is_main_process():\n    model.summary((1, 2))\ninfo = model.summary((1, 2))\n" in out


def test_input_spec_alone_is_dygraph_and_static_graph_names_are_static():
    dygraph = convert_text('''\
        import paddle
        from paddle.static import InputSpec
        net = paddle.nn.Linear(2, 1)
        opt = paddle.optimizer.SGD(parameters=net.parameters())
        net(paddle.ones([1, 2])).sum().backward()
        opt.step()
        paddle.jit.save(net, "infer/net", input_spec=[InputSpec([None, 2])])
        ''')
    assert dygraph.generation == "dygraph" and "dp.distributed_optimizer(" in dygraph.output.decode()
    static = convert_text('''\
        import paddle
        x = paddle.static.data("x", [None, 2])
        opt = paddle.optimizer.SGD(learning_rate=0.1)
        opt.minimize(paddle.mean(x))
        ''')
    assert static.generation == "static" and not findings_of(static, "paddle-distributed-optimizer")
