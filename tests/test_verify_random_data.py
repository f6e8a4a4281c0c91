"""Random data drawn once, unseeded, before training: shared by the conversion, proven by ``dpmigrate verify``.

Scripts of our own in the shapes real ones use (issue 18): a helper looping Python's ``random`` to build the
train set (torch), and a Paddle script drawing its target with ``paddle.randn`` and its inputs with NumPy.
Under verify every rank but 0 is seeded apart, so data a conversion fails to share differs per rank: with
``shared-random-data`` ignored (``[tool.dpmigrate]``) verify must find the Paddle runs apart (``paddle.randn``:
the framework's generator); converted as is, they are equivalent with the split proven. The torch script draws with
Python's ``random`` after ``dp.init()``, which gives every rank rank 0's state of it (issue 19, round F): equivalent
even with the rule ignored, the runtime's sharing proven end to end.
"""

from __future__ import annotations

import textwrap

import pytest
from verify_cases import causes, explain, verify

pytestmark = pytest.mark.slow

TORCH = '''
    import random

    import torch
    from torch.utils.data import DataLoader


    def make_rows(n):
        rows = []
        for _ in range(n):
            a, b = random.uniform(-1, 1), random.uniform(-1, 1)
            rows.append((torch.tensor([a, b]), torch.tensor([2 * a - b])))
        return rows


    train_rows = make_rows(256)
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in DataLoader(train_rows, batch_size=32):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
'''

PADDLE = '''
    import numpy as np
    import paddle

    W = paddle.randn([3, 1])
    X = np.random.rand(256, 3).astype("float32")
    paddle.seed(0)  # the model's start (after the draws: they stay unseeded)
    net = paddle.nn.Linear(3, 1)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters())
    data = paddle.io.TensorDataset([paddle.to_tensor(X), paddle.to_tensor(X) @ W])
    for x, y in paddle.io.DataLoader(data, batch_size=32):
        loss = paddle.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()
'''


@pytest.mark.parametrize("framework", ["torch", "paddle"])
@pytest.mark.parametrize("shared", [True, False], ids=["converted", "rule-ignored"])
def test_unseeded_data_drawn_once_is_the_same_on_every_rank(framework, shared, tmp_path, monkeypatch):
    (tmp_path / "train.py").write_text(textwrap.dedent({"torch": TORCH, "paddle": PADDLE}[framework]).lstrip())
    if not shared:
        (tmp_path / "pyproject.toml").write_text('[tool.dpmigrate]\nignore = ["shared-random-data"]\n')
    data = verify(tmp_path, monkeypatch, tmp_path / "train.py", steps=3)
    if shared or framework == "torch":  # (torch, rule ignored: dp.init() shared Python's generator state)
        assert data["verdict"] == "equivalent", explain(data)
        assert data["comparison"]["data"]["split"] == 3, explain(data)
    else:  # rank 1 trains on other samples: the batch split of the original's is not what the ranks read
        assert data["verdict"] == "diverges", explain(data)
        assert "inputs-differ" in causes(data), explain(data)
