"""A layer ``forward`` calls only on some steps (or never): dp.init gets Strategy(find_unused_parameters=True).

Paddle's dynamic-graph tutorial calls a layer under ``if paddle.rand([1]) > 0.5``: converted as it was, the second
step failed on every rank ("parameter ... has been ready before. Please set find_unused_parameters=True"; the issue
19 audit), where the original runs. The scripts here call theirs every other step (a counter, the same on every
rank and in one process), so verify can compare the runs: equivalent once converted.
"""

from __future__ import annotations

import textwrap

import pytest
from rule_testing import convert_text, findings_of
from verify_cases import explain, verify

SCRIPTS = {
    "torch": '''
        import torch
        from torch.utils.data import DataLoader, TensorDataset


        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.body = torch.nn.Linear(4, 8)
                self.extra = torch.nn.Linear(8, 8)
                self.head = torch.nn.Linear(8, 1)
                self.calls = 0

            def forward(self, x):
                self.calls += 1
                x = torch.relu(self.body(x))
                if self.calls % 2 == 0:
                    x = torch.relu(self.extra(x))
                return self.head(x)


        torch.manual_seed(0)
        g = torch.Generator().manual_seed(1)
        data = TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))
        model = Net()
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for x, y in DataLoader(data, batch_size=16):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        ''',
    "paddle": '''
        import numpy as np
        import paddle


        class Net(paddle.nn.Layer):
            def __init__(self):
                super().__init__()
                self.body = paddle.nn.Linear(4, 8)
                self.extra = paddle.nn.Linear(8, 8)
                self.head = paddle.nn.Linear(8, 1)
                self.calls = 0

            def forward(self, x):
                self.calls += 1
                x = paddle.nn.functional.relu(self.body(x))
                if self.calls % 2 == 0:
                    x = paddle.nn.functional.relu(self.extra(x))
                return self.head(x)


        paddle.seed(0)
        rng = np.random.RandomState(1)
        data = paddle.io.TensorDataset([paddle.to_tensor(rng.randn(64, 4).astype("float32")),
                                        paddle.to_tensor(rng.randn(64, 1).astype("float32"))])
        model = Net()
        opt = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
        for x, y in paddle.io.DataLoader(data, batch_size=16):
            paddle.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.clear_grad()
        ''',
}


@pytest.mark.parametrize("framework", SCRIPTS)
def test_a_layer_called_under_a_condition_in_forward_gets_find_unused_parameters(framework):
    result = convert_text(textwrap.dedent(SCRIPTS[framework]))
    assert "dp.init(dp.Strategy(find_unused_parameters=True))\n" in result.output.decode()
    [init] = findings_of(result, "init-runtime", "change")
    assert "Net.forward calls self.extra under a condition (line 18)" in init.message, init.message


def test_a_layer_never_called_and_one_called_always_or_in_the_test_of_an_if():
    branch = "        if self.calls % 2 == 0:\n            x = torch.relu(self.extra(x))\n"
    never = textwrap.dedent(SCRIPTS["torch"]).replace(branch, "")
    [init] = findings_of(convert_text(never), "init-runtime", "change")
    assert "Net.forward never calls self.extra (line 10)" in init.message, init.message
    always = textwrap.dedent(SCRIPTS["torch"]).replace(branch, "        if self.extra(x).sum() > 0:\n            x = x + 1\n")
    result = convert_text(always)
    assert "find_unused_parameters" not in result.output.decode()


@pytest.mark.slow
@pytest.mark.parametrize("framework", SCRIPTS)
def test_the_conditional_layer_trains_on_two_ranks_like_the_original(framework, tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPTS[framework]))
    data = verify(tmp_path, monkeypatch, script, steps=4)
    assert data["verdict"] == "equivalent", explain(data)
    check = data["comparison"]["data"]
    assert check["observed"] == 4 and check["split"] == 4, explain(data)


def test_a_model_class_of_a_local_package_that_skips_a_layer_gets_find_unused_parameters_too(tmp_path, capsys):
    """Paddle-Stochastic-Depth-ResNet110 (issue 19 audit): the block skipped at random is in ``models/net.py``,
    re-exported by ``models/__init__.py`` (``from .net import *``); the script builds ``Net()``."""
    from dpmigrate.cli import main

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "__init__.py").write_text("from .net import *\n")
    net = textwrap.dedent(SCRIPTS["paddle"]).split("paddle.seed(0)")[0]
    (tmp_path / "models" / "net.py").write_text(net)
    script = tmp_path / "train.py"
    script.write_text("import paddle\nfrom models import Net\n\nmodel = Net()\n"
                      "opt = paddle.optimizer.SGD(parameters=model.parameters())\n"
                      "for x, y in paddle.io.DataLoader(DATA, batch_size=4):\n"
                      "    paddle.nn.functional.mse_loss(model(x), y).backward()\n    opt.step()\n")
    main(["--check", str(script)])
    err = capsys.readouterr().err
    assert ("dp.init(dp.Strategy(find_unused_parameters=True)) at the entry point" in err
            and "Net (a model class of models) calls a layer in forward only under a condition, or never (line 4)" in err), err
