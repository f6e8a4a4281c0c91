"""Scripts and helpers several of the Paddle subject tests share (``test_paddle_*.py``): the executed fixtures' original
and 2-rank runs, and the audit scripts more than one subject checks."""

from __future__ import annotations

from fixture_cases import FIXTURES, run
from test_verify_paddle_real import _launch, _python

PADDLE = FIXTURES / "paddle"


def _original_and_launched(case: str, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    (one / "train.py").write_bytes((PADDLE / case / "before.py").read_bytes())
    (two / "train.py").write_bytes(run(PADDLE / case, batch="global").output)
    return one, _python(["train.py"], one), two, _launch("train.py", [], two)


NESTED_BEST_SAVE = """\
    import numpy as np
    import paddle

    draw = np.random.RandomState(0)
    inputs = draw.rand(64, 4).astype("float32")
    data = paddle.io.TensorDataset([paddle.to_tensor(inputs), paddle.to_tensor(inputs.sum(1, keepdims=True))])
    loader = paddle.io.DataLoader(data, batch_size=8)
    paddle.seed(1)
    model = paddle.nn.Linear(4, 1)
    opt = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    steps, best_loss = 0, 1e9
    for epoch in range(2):
        for x, y in loader:
            loss = paddle.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.clear_grad()
            steps += 1
            if steps % 2 == 0:
                current_loss = float(loss)
                if current_loss < best_loss:
                    best_loss = current_loss
                    paddle.save(model.state_dict(), "best.pdparams")
    print("best", best_loss)
    """


ONE_SAMPLE = """\
    import paddle

    net = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(), paddle.nn.Linear(16, 3))
    x = paddle.rand([1, 8])
    label = paddle.randint(0, 3, [1, 1])
    loss = paddle.nn.functional.cross_entropy(net(x), label)
    loss.backward()
    opt = paddle.optimizer.Adam(parameters=net.parameters())
    opt.step()
    print(float(loss))
    """


FIT_WITH_A_CHECKPOINT = """\
    import numpy as np
    import paddle

    draw = np.random.RandomState(0)
    inputs = draw.rand(64, 4).astype("float32")
    train_ds = paddle.io.TensorDataset([paddle.to_tensor(inputs), paddle.to_tensor(inputs.sum(1, keepdims=True))])
    test_ds = paddle.io.TensorDataset([paddle.to_tensor(inputs[:16]), paddle.to_tensor(inputs[:16].sum(1, keepdims=True))])
    model = paddle.Model(paddle.nn.Linear(4, 1))
    model.prepare(paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters()), paddle.nn.MSELoss())
    model.fit(train_ds, test_ds, 8, epochs=2, verbose=0, save_dir="ckpt")
    model.load("ckpt/final")
    print(model.evaluate(test_ds, batch_size=8, verbose=0))
    """
