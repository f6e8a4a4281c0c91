"""Which loader a step trained on: the one whose batch fed the model in training mode, not the one read last.

The Paddle addition tutorial (issue 19 audit) evaluates a validation loader inside the training step, between
reading its training batch and ``opt.step()``. The conversion leaves that loader whole on purpose (every rank
evaluates all of it) and says so; verify took its batches, read last, for the step's and said "not sharded"
although the training batches were split and the weights matched. The training loader left whole must still be
caught (the check below runs the same script with its loader unsharded by hand).
"""

from __future__ import annotations

import textwrap

import pytest
from verify_cases import causes, explain, verify

pytestmark = pytest.mark.slow

ORIGINAL = '''
    import numpy as np
    import paddle

    rng = np.random.RandomState(0)
    train_ds = paddle.io.TensorDataset([paddle.to_tensor(rng.rand(64, 4).astype("float32")),
                                        paddle.to_tensor(rng.rand(64, 1).astype("float32"))])
    dev_ds = paddle.io.TensorDataset([paddle.to_tensor(rng.rand(32, 4).astype("float32")),
                                      paddle.to_tensor(rng.rand(32, 1).astype("float32"))])
    train_reader = paddle.io.DataLoader(train_ds, batch_size=16, shuffle=True, drop_last=True)
    dev_reader = paddle.io.DataLoader(dev_ds, batch_size=16, shuffle=False)
    model = paddle.nn.Linear(4, 1)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    for step, (x, y) in enumerate(train_reader()):
        loss = paddle.nn.functional.mse_loss(model(x), y)
        if step % 2 == 0:
            model.eval()
            losses = []
            for dx, dy in dev_reader():
                losses.append(paddle.nn.functional.mse_loss(model(dx), dy).numpy())
            print("eval", step, np.stack(losses).mean())
            model.train()
        loss.backward()
        opt.step()
        opt.clear_grad()
'''


def test_a_validation_loader_read_inside_the_step_is_not_taken_for_the_training_data(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(ORIGINAL))
    data = verify(tmp_path, monkeypatch, script, steps=3)
    assert data["verdict"] == "equivalent", explain(data)
    check = data["comparison"]["data"]
    assert check["observed"] == 3 and check["split"] == 3, explain(data)


def test_the_training_loader_left_whole_beside_it_is_still_not_sharded(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(ORIGINAL))
    converted = tmp_path / "converted.py"
    from dpmigrate.cli import main

    main(["--batch", "global", "-o", str(tmp_path / "out"), str(script)])
    text = (tmp_path / "out" / "train.py").read_text()
    whole = text.replace("dp.distributed_loader(paddle.io.DataLoader(train_ds, batch_size=dp.per_rank_batch_size(16), "
                         "shuffle=True, drop_last=True))", "paddle.io.DataLoader(train_ds, batch_size=16, "
                         "shuffle=True, drop_last=True)")
    assert whole != text, text
    converted.write_text(whole)
    data = verify(tmp_path, monkeypatch, script, steps=3, against=converted)
    assert data["verdict"] == "diverges" and "not-sharded" in causes(data), explain(data)
