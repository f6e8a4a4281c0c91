"""Which Paddle models and optimizers a conversion wraps: networks rebound to a ``paddle.Model``, optimizers over a
``paddle.Model``'s parameters stepped by plain loops, layers trained before their ``paddle.Model`` is built, layers
kept in lists, models that train themselves, dropout over data nothing splits, and the current device.

Each test is a shape a real Paddle script showed in issue 19's audits, written as our own script;
``tests/paddle_audit_rounds.md`` keeps the rounds' notes on where each came from.
"""

from __future__ import annotations

import re
import textwrap

import pytest
from fixture_cases import FIXTURES
from paddle_shapes import NESTED_BEST_SAVE, ONE_SAMPLE, _original_and_launched
from rule_testing import convert_text, findings_of
from test_verify_paddle_real import _launch, _python
from verify_cases import explain, verify


@pytest.mark.slow
def test_a_network_fine_tuned_by_a_plain_loop_after_fit_ends_as_the_original(tmp_path):
    """Round F (the guide's train/eval/predict notebook): the plain loop after ``fit`` trained the raw network, each
    rank apart. Wrapped before its optimizer, the 2-rank job prints the original's loss (seeded, unshuffled)."""
    _, original, _, job = _original_and_launched("model_then_plain_loop", tmp_path)

    def loss(output):
        return [float(x) for x in re.findall(r"fine-tuned loss ([0-9.]+)", output)]

    assert len(loss(job.stdout)) == 1 and loss(job.stdout) == pytest.approx(loss(original.stdout), abs=2e-5)


LISTED = """\
    import {framework}
    import {framework}.nn as nn
    class Net(nn.{base}):
        def __init__(self):
            super().__init__()
            self.first = nn.Linear(4, 4)
            self.blocks = {blocks}
            {register}
        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return self.first(x)
    model = Net()
    """


def test_layers_kept_in_a_plain_list_are_noted_with_the_frameworks_list():
    """Round H (awesome-DeepLearning's recommender): unregistered, they were not broadcast; each rank had its own."""
    for framework, base, fix in (("paddle", "Layer", "nn.LayerList"), ("torch", "Module", "nn.ModuleList")):
        for blocks in ("[nn.Linear(4, 4) for _ in range(2)]", "[]\n            self.blocks.append(nn.Linear(4, 4))"):
            result = convert_text(LISTED.format(framework=framework, base=base, blocks=blocks, register="") + TRAIN_TAIL)
            [note] = findings_of(result, "unregistered-layers", "note")
            assert note.line == 7 and f"self.blocks = {fix}([...])" in note.fix
        registered = LISTED.format(framework=framework, base=base, blocks="[nn.Linear(4, 4)]",
                                   register="self.add_sublayer('b0', self.blocks[0])" if framework == "paddle" else
                                   "self.add_module('b0', self.blocks[0])")
        assert not findings_of(convert_text(registered + TRAIN_TAIL), "unregistered-layers")
        kept = LISTED.format(framework=framework, base=base, blocks="nn.ModuleList([nn.Linear(4, 4)])", register="")
        assert not findings_of(convert_text(kept + TRAIN_TAIL), "unregistered-layers")


TRAIN_TAIL = "model(x).sum().backward()\n"  # (LISTED ends in its indent)


def test_the_current_device_becomes_this_ranks_card_when_it_is_a_gpu():
    result = convert_text("""\
        import paddle
        paddle.device.set_device(paddle.device.get_device())
        net = paddle.nn.Linear(2, 1)
        """)
    assert ("paddle.device.set_device(dp.device() if paddle.device.get_device().startswith(\"gpu\") "
            "else paddle.device.get_device())") in result.output.decode()
    assert not findings_of(result, "paddle-rank-device", "declined")


OPTIMIZER_OVER_THE_MODEL = """\
    import numpy as np
    import paddle
    import paddle.nn.functional as F

    draw = np.random.RandomState(0)
    points = paddle.io.TensorDataset([paddle.to_tensor(draw.rand(96, 8).astype("float32")),
                                      paddle.to_tensor(draw.randint(0, 3, (96, 1)).astype("int64"))])
    loader = paddle.io.DataLoader(points, batch_size=32, shuffle=False)
    paddle.seed(0)
    net = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(), paddle.nn.Linear(16, 3))
    model = paddle.Model(net)
    model.prepare(optimizer=paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters()),
                  loss=paddle.nn.CrossEntropyLoss())
    model.fit(points, batch_size=32, epochs=1, verbose=0)
    optim = paddle.optimizer.SGD(learning_rate=0.2, parameters=model.parameters())
    for epoch in range(2):
        for x, y in loader:
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            optim.step()
            optim.clear_grad()
    """


def test_an_optimizer_over_a_paddle_models_parameters_stepped_by_a_plain_loop_gets_its_network_wrapped():
    result = convert_text(OPTIMIZER_OVER_THE_MODEL)
    code = result.output.decode()
    assert "net = dp.distributed_model(net)\noptim = dp.distributed_optimizer(paddle.optimizer.SGD(" in code
    assert "model.prepare(optimizer=paddle.optimizer.SGD(" in code  # the prepared one stays the high-level API's
    [wrapped] = findings_of(result, "paddle-distributed-model", "change")
    assert wrapped.line == 15
    notes = [f for f in findings_of(result, "paddle-distributed-optimizer", "note") if "prepares a paddle.Model" in f.message]
    assert [n.line for n in notes] == [12]


@pytest.mark.slow
def test_the_plain_loop_after_fit_trains_like_one_process(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(OPTIMIZER_OVER_THE_MODEL))
    data = verify(tmp_path, monkeypatch, script, steps=5)  # 3 steps of fit, then 2 of the plain loop
    assert data["verdict"] == "equivalent", explain(data)
    check = data["comparison"]["data"]
    assert check["observed"] == check["split"] == 5, explain(data)


def test_a_model_that_trains_itself_is_declined_with_a_fix_that_runs():
    for framework, optimizer in [("paddle", "paddle.optimizer.SGD(learning_rate=0.01, parameters=self.parameters())"),
                                 ("torch", "torch.optim.SGD(self.parameters(), lr=0.01)")]:
        result = convert_text(f"""\
            import {framework}

            class Critic({framework}.nn.{"Layer" if framework == "paddle" else "Module"}):
                def __init__(self):
                    super().__init__()
                    self.fc = {framework}.nn.Linear(4, 1)

                def forward(self, x):
                    return self.fc(x)

                def fit_all(self, batches):
                    opt = {optimizer}
                    for x in batches:
                        loss = self(x).mean()
                        loss.backward()
                        opt.step()

            critic = Critic()
            critic.fit_all([{framework}.ones([4, 4])])
            """)
        rule = "paddle-distributed-model" if framework == "paddle" else "distributed-model"
        [declined] = findings_of(result, rule, "declined")
        assert declined.line == 12 and "the model trains itself" in declined.message, framework
        assert "self.model" not in declined.fix and "move the training loop out of the class" in declined.fix


REBOUND = """\
    import numpy as np
    import paddle

    draw = np.random.RandomState(0)
    inputs = draw.rand(64, 4).astype("float32")
    data = paddle.io.TensorDataset([paddle.to_tensor(inputs), paddle.to_tensor(inputs.sum(1, keepdims=True))])
    paddle.seed(1)
    model = paddle.nn.Linear(4, 1)
    opt = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    model = paddle.Model(model)
    model.prepare(opt, paddle.nn.MSELoss())
    model.fit(data, batch_size=16, epochs=1, verbose=0)
    """


def test_a_network_rebound_to_a_paddle_model_under_its_own_name_is_not_wrapped():
    result = convert_text(REBOUND)
    assert "distributed_model" not in result.output.decode()
    [note] = findings_of(result, "paddle-distributed-model", "note")
    assert note.line == 11 and "names a paddle.Model by the time it would be wrapped" in note.message


@pytest.mark.slow
def test_the_rebound_network_trains_through_the_paddle_model_like_one_process(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(REBOUND))
    data = verify(tmp_path, monkeypatch, script, steps=3)
    assert data["verdict"] == "equivalent", explain(data)
    check = data["comparison"]["data"]
    assert check["observed"] == check["split"] == 3, explain(data)



MODEL_AFTER_THE_LOOP = """\
    import numpy as np
    import paddle

    draw = np.random.RandomState(0)
    inputs = draw.rand(64, 4).astype("float32")
    data = paddle.io.TensorDataset([paddle.to_tensor(inputs), paddle.to_tensor(inputs.sum(1, keepdims=True))])
    loader = paddle.io.DataLoader(data, batch_size=8)
    paddle.seed(1)
    model = paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.ReLU(), paddle.nn.Linear(8, 1))
    opt = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    for x, y in loader:
        loss = paddle.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()
    high = paddle.Model(model)
    high.prepare(paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters()), paddle.nn.MSELoss())
    high.fit(data, batch_size=8, epochs=1, verbose=0)
    high.save("final")
    """


def test_a_layer_trained_by_a_loop_before_its_paddle_model_is_built_is_wrapped_where_it_is_built():
    result = convert_text(MODEL_AFTER_THE_LOOP)
    code = result.output.decode()
    assert "model = dp.distributed_model(model)\nopt = dp.distributed_optimizer(" in code, code
    assert "high = paddle.Model(dp.unwrap(model))\n" in code
    assert not findings_of(result, "paddle-distributed-model", "declined")
    changes = findings_of(result, "paddle-distributed-model", "change")
    assert [c.line for c in changes] == [9, 16] and "built after the plain loop" in changes[1].message
    built_first = MODEL_AFTER_THE_LOOP.replace("    high = paddle.Model(model)\n", "").replace(
        "    paddle.seed(1)\n", "    paddle.seed(1)\n    high = None\n").replace(
        "    opt = paddle.optimizer", "    high = paddle.Model(model)\n    opt = paddle.optimizer", 1)
    assert "dp.unwrap" not in convert_text(built_first).output.decode()  # built before the loop: as before


@pytest.mark.slow
def test_the_loop_then_the_paddle_model_built_after_it_train_like_one_process(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(MODEL_AFTER_THE_LOOP))
    data = verify(tmp_path, monkeypatch, script, steps=14)  # 8 steps of the loop, 6 of fit
    assert data["verdict"] == "equivalent", explain(data)
    check = data["comparison"]["data"]
    assert check["observed"] == check["split"] == 14, explain(data)


def test_dropout_over_data_nothing_splits_is_noted_once_with_the_fix():
    one_sample = ONE_SAMPLE.replace("paddle.nn.ReLU(),", "paddle.nn.ReLU(), paddle.nn.Dropout(0.5), paddle.nn.Dropout(0.1),")
    [note] = findings_of(convert_text(one_sample), "unsplit-dropout", "note")
    assert note.line == 3 and "draws its own mask on each rank" in note.message and "paddle.seed(0)" in note.fix
    library = ONE_SAMPLE.replace("paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(), paddle.nn.Linear(16, 3))",
                                 "paddle.vision.models.vgg11(num_classes=3)")
    assert findings_of(convert_text(library), "unsplit-dropout", "note")
    torch_lstm = """\
        import torch
        net = torch.nn.LSTM(4, 8, num_layers=2, dropout=0.2)
        x = torch.randn(5, 1, 4)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        out, _ = net(x)
        out.sum().backward()
        opt.step()
        """
    [torch_note] = findings_of(convert_text(torch_lstm), "unsplit-dropout", "note")
    assert torch_note.line == 2 and "torch.manual_seed(0)" in torch_note.fix
    seeded = torch_lstm.replace("import torch\n", "import torch\n        torch.manual_seed(3)\n")
    assert not findings_of(convert_text(seeded), "unsplit-dropout")  # every rank draws the same masks
    assert not findings_of(convert_text(torch_lstm.replace("dropout=0.2", "dropout=0.0")), "unsplit-dropout")
    rate_tested = one_sample.replace("paddle.nn.Dropout(0.5), paddle.nn.Dropout(0.1),",
                                     "*([paddle.nn.Dropout(rate)] if rate > 0 else []),").replace(
                                         "import paddle\n", "import paddle\n    rate = 0.0\n", 1)
    assert "rate = 0.0" in rate_tested and not findings_of(convert_text(rate_tested), "unsplit-dropout")
    sharded = NESTED_BEST_SAVE.replace("paddle.nn.Linear(4, 1)",
                                       "paddle.nn.Sequential(paddle.nn.Dropout(0.2), paddle.nn.Linear(4, 1))")
    assert not findings_of(convert_text(sharded), "unsplit-dropout")  # each rank's masks fall on its own samples


@pytest.mark.slow
def test_the_dropout_note_s_fix_trains_one_sample_like_one_process(tmp_path):
    """Fixture ``paddle/one_sample_dropout``: with the note's fix (the same seed on every rank), the 2-rank job prints
    the losses one process prints; its dropout masks are then alike on every rank."""
    case = FIXTURES / "paddle" / "one_sample_dropout"
    seeded = "import paddle\nimport paddle.nn as nn\n"
    before, after = (case / "before.py").read_text(), (case / "after.py").read_text()
    assert before.count(seeded) == 1 and after.count("dp.init()\n") == 1
    (tmp_path / "before.py").write_text(before.replace(seeded, seeded + "paddle.seed(0)\n"))
    (tmp_path / "after.py").write_text(after.replace("dp.init()\n", "dp.init()\npaddle.seed(0)\n"))
    original = _python(["before.py"], tmp_path)
    job = _launch("after.py", [], tmp_path)
    losses = [line.split("] ", 1)[-1] for line in job.stdout.splitlines() if "loss" in line]
    expected = [line for line in original.stdout.splitlines() if "loss" in line]
    assert len(expected) == 3 and losses == expected, (losses, expected)


def test_layers_without_parameters_models_never_built_and_pil_images():
    source = """\
        import numpy as np
        import paddle
        import paddle.nn as nn
        from PIL import Image


        class Net(nn.Layer):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 2)
                self.pool = nn.MaxPool2D(2)
                self.act = nn.ReLU()

            def forward(self, x):
                return self.fc(x)


        class Unused(nn.Layer):
            def __init__(self):
                super().__init__()
                self.bn = nn.BatchNorm1D(4)

            def forward(self, x):
                return self.bn(x)


        net = Net()
        opt = paddle.optimizer.SGD(parameters=net.parameters())
        loader = paddle.io.DataLoader(paddle.io.TensorDataset([paddle.rand([8, 4])]), batch_size=4)
        for (x,) in loader:
            net(x).mean().backward()
            opt.step()
        grid = Image.fromarray(np.zeros((4, 4), "uint8"))
        grid.save("grid.png")
        Image.fromarray(np.zeros((4, 4), "uint8")).convert("L").save("grey.png")
        """
    result = convert_text(source)
    code = result.output.decode()
    assert "find_unused_parameters" not in code and not findings_of(result, "batch-norm")
    assert 'if dp.is_main_process():\n    grid.save("grid.png")' in code, code
    assert 'if dp.is_main_process():\n    Image.fromarray(np.zeros((4, 4), "uint8")).convert("L").save("grey.png")' in code
    built = convert_text(source.replace("net = Net()", "net = Net()\n        spare = Unused()").replace(
        "return self.fc(x)", "return self.fc(self.act(x) if self.training else x)"))
    assert findings_of(built, "batch-norm") and "find_unused_parameters" not in built.output.decode()


OPTIMIZER_FACTORY = """\
    import numpy as np
    import paddle

    draw = np.random.RandomState(0)
    inputs = draw.rand(64, 4).astype("float32")
    data = paddle.io.TensorDataset([paddle.to_tensor(inputs), paddle.to_tensor(inputs.sum(1, keepdims=True))])
    paddle.seed(1)
    model = paddle.Model(paddle.nn.Linear(4, 1))


    def make_optimizer(parameters=None):
        optimizer = paddle.optimizer.SGD(learning_rate=0.05, parameters=parameters)
        return optimizer


    optimizer = make_optimizer(model.parameters())
    model.prepare(optimizer, paddle.nn.MSELoss())
    model.fit(data, batch_size=8, epochs=1, verbose=0)
    """


def test_an_optimizer_a_function_makes_for_prepare_is_left_to_the_high_level_api():
    result = convert_text(OPTIMIZER_FACTORY)
    assert "distributed_optimizer" not in result.output.decode()
    [note] = findings_of(result, "paddle-distributed-optimizer", "note")
    assert note.line == 12 and "prepares a paddle.Model" in note.message
    stepped = OPTIMIZER_FACTORY.replace("model.prepare(optimizer, paddle.nn.MSELoss())",
                                        "model.prepare(paddle.optimizer.SGD(parameters=model.parameters()))")
    assert "dp.distributed_optimizer(paddle.optimizer.SGD(learning_rate=0.05" in convert_text(stepped).output.decode()
