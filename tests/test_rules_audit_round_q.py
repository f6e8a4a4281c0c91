"""Issue 19, audit round Q: shapes of real Paddle scripts, each as our own script.

- a VGG trainer of round P saved its best checkpoint under ``if current_acc > best_acc:``, nested in
  ``if steps % save_steps == 0:``. Only an ``if`` directly in the loop's body had its test all-reduced; the nested
  one was reported as an error and left so, and the ranks could part there (one waits in the save for the other).
  An ``if`` nested in tests that read no per-rank figure is reached by every rank alike: it is rewritten too.
"""

from __future__ import annotations

import textwrap

import pytest
from rule_testing import convert_text, findings_of
from verify_cases import explain, verify

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


def test_a_best_save_nested_in_a_counter_test_gets_its_test_all_reduced():
    result = convert_text(NESTED_BEST_SAVE)
    code = result.output.decode()
    assert ("            if dp.all_reduce(current_loss) < dp.all_reduce(best_loss):\n"
            "                best_loss = current_loss\n"
            '                dp.save(model.state_dict(), "best.pdparams")\n') in code, code
    assert "        if steps % 2 == 0:\n" in code
    assert not findings_of(result, "paddle-save-condition", "error")
    [change] = findings_of(result, "paddle-save-condition", "change")
    assert change.line == 21 and "every rank takes the same branch" in change.message


def test_a_best_save_nested_in_a_test_of_this_ranks_figure_stays_an_error():
    under_a_figure = NESTED_BEST_SAVE.replace("if steps % 2 == 0:", "if float(loss) < 1.0:")
    result = convert_text(under_a_figure)
    [error] = findings_of(result, "paddle-save-condition", "error")
    assert "`current_loss`" in error.message and "hangs" in error.message
    assert "if current_loss < best_loss:" in result.output.decode()


@pytest.mark.slow
def test_the_nested_best_save_trains_and_saves_like_one_process(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(NESTED_BEST_SAVE))
    data = verify(tmp_path, monkeypatch, script, steps=6)
    assert data["verdict"] == "equivalent", explain(data)
    check = data["comparison"]["data"]
    assert check["observed"] == check["split"] == 6, explain(data)
