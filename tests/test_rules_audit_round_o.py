"""Issue 19, audit round O: shapes of real Paddle scripts whose conversion crashed, each as our own script.

- a house-price study script built ``opt = Adam(parameters=model.parameters())`` on a plain network, then rebound
  the same name, ``model = paddle.Model(model)``, and prepared it with ``opt``: the conversion added
  ``model = dp.distributed_model(model)`` after ``prepare`` and every rank failed ("needs a paddle.nn.Layer, got
  Model"). Once the name holds a ``paddle.Model`` there, nothing is added (its ``prepare`` wraps the network).
- a skip-gram notebook's ``download()`` wrote ``./text8.txt`` in ``with open(...) as f:`` and then called
  ``f.close()``; the module then read the file. The write went under ``if dp.is_main_process():`` but not the
  ``close``, so the other rank failed with ``f`` unbound, and nothing made it wait for the file before reading it.
  Now the ``close`` goes with the block, and a ``dp.barrier()`` follows it.
- an image classifier printed ``print(model.summary())``: ``dp.print`` printed the returned dict once, but
  ``summary()`` had printed its layer table on every rank. The statement now runs on the main process.
"""

from __future__ import annotations

import textwrap

import pytest
from rule_testing import convert_text, findings_of
from test_verify_paddle_real import _launch, _python
from verify_cases import explain, verify

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

WRITTEN_THEN_READ = """\
    import paddle


    def download():
        corpus = " ".join("w%d" % (i % 7) for i in range(64)).encode()
        with open("./corpus.txt", "wb") as f:
            f.write(corpus)
        f.close()


    download()
    with open("./corpus.txt", "r") as f:
        words = f.read().split(" ")
    x = paddle.to_tensor([[float(w[1:])] for w in words])
    paddle.seed(0)
    model = paddle.nn.Linear(1, 1)
    opt = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
    for step in range(3):
        loss = paddle.mean(model(x) ** 2)
        loss.backward()
        opt.step()
        opt.clear_grad()
    print("words", len(words), "loss", float(loss))
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


def test_a_guarded_write_takes_its_close_along_and_the_later_read_waits_for_it():
    code = convert_text(WRITTEN_THEN_READ).output.decode()
    assert ('    if dp.is_main_process():\n        with open("./corpus.txt", "wb") as f:\n            f.write(corpus)\n'
            '        f.close()\n    dp.barrier()\n') in code
    used_after = convert_text("""\
        import paddle
        def write(text):
            with open("notes.txt", "w") as f:
                f.write(text)
            print(f.closed)
        net = paddle.nn.Linear(1, 1)
        opt = paddle.optimizer.SGD(parameters=net.parameters())
        for step in range(2):
            net(paddle.ones([2, 1])).mean().backward()
            opt.step()
        write("done")
        """).output.decode()
    assert '    with open("notes.txt", "w") as f:\n        f.write(text)\n' in used_after  # f read later: left whole
    rebound = convert_text("""\
        import paddle
        net = paddle.nn.Linear(1, 1)
        opt = paddle.optimizer.SGD(parameters=net.parameters())
        for step in range(2):
            net(paddle.ones([2, 1])).mean().backward()
            opt.step()
        with open("first.txt", "w") as f:
            f.write("one")
        with open("second.txt", "w") as f:
            f.write("two")
        """).output.decode()
    assert rebound.count("if dp.is_main_process():\n    with open(") == 2  # a later `as f` binds, it does not read


@pytest.mark.slow
def test_the_file_written_once_is_read_by_every_rank_after_it_is_there(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    (one / "train.py").write_text(textwrap.dedent(WRITTEN_THEN_READ))
    (two / "train.py").write_bytes(convert_text(WRITTEN_THEN_READ).output)
    original = _python(["train.py"], one)
    job = _launch("train.py", [], two)
    ran = [line.split("] ", 1)[-1] for line in job.stdout.splitlines() if line.split("] ", 1)[-1].startswith("words")]
    assert ran == [line for line in original.stdout.splitlines() if line.startswith("words")]


def test_a_printed_summary_runs_on_the_main_process_whole():
    result = convert_text("""\
        import paddle
        net = paddle.nn.Linear(4, 2)
        model = paddle.Model(net, paddle.static.InputSpec([None, 4], "float32", "x"))
        model.prepare(paddle.optimizer.SGD(parameters=model.parameters()), paddle.nn.CrossEntropyLoss())
        print(model.summary())
        print("ready")
        model.fit(paddle.io.TensorDataset([paddle.rand([8, 4]), paddle.randint(0, 2, [8, 1])]), batch_size=4)
        """)
    code = result.output.decode()
    assert "if dp.is_main_process():\n    print(model.summary())\n" in code and 'dp.print("ready")' in code
