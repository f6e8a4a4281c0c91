"""Issue 19, audit round Q: shapes of real Paddle scripts, each as our own script.

- a VGG trainer of round P saved its best checkpoint under ``if current_acc > best_acc:``, nested in
  ``if steps % save_steps == 0:``. Only an ``if`` directly in the loop's body had its test all-reduced; the nested
  one was reported as an error and left so, and the ranks could part there (one waits in the save for the other).
  An ``if`` nested in tests that read no per-rank figure is reached by every rank alike: it is rewritten too.
- the autograd guide trains one step on one random sample, broadcast to every rank: nothing can be split, and the
  conversion's summary says "no training data was sharded". verify still called it "diverges" with a cause that
  listed ways to lose a split, as if the conversion had failed to make one. It now quotes the conversion, as it did
  for a loop's hand-cut-batches note (whose wording no test held).
- a tabular Transformer's trainer trained its Layer with a plain loop, then built ``paddle.Model(model)`` only to
  save it. Any ``paddle.Model`` over the network made the plain loop's optimizer "trained outside the paddle.Model":
  declined, with a fix to place before the optimizer that could not be followed, while the loader was sharded and
  each rank trained its half alone. A ``paddle.Model`` built after the loop's last step is no obstacle: the Layer is
  wrapped where it is built, and the ``paddle.Model`` gets the Layer itself (``dp.unwrap``), whose own ``prepare``
  wraps it for a later ``fit``.
- an LSTM regression on an npz called ``fit(train_ds, test_ds, 256, ...)``: ``--batch global`` took the second
  positional argument (the evaluation data) for the batch size, and every verify of it failed on both ranks.
- an IMDB GRU script fitted with ``save_dir`` and then loaded ``save_dir/final``: rank 0 writes it at the end of
  ``fit``, the other rank went on at once and failed to load it (or loaded an earlier run's). The ranks now wait
  after a ``fit`` that writes checkpoints, as after ``save``.
- its evaluation DataLoader had ``drop_last=True``: sharded for ``paddle.Model``, whose gathered count runs to
  ``len(dataset)``, later evaluations covered fewer samples ("Eval samples: 128", then 32) while the report said the
  metrics were the original's. It is now a note with the fix; and an evaluation loader a loop reads
  (``evaluation=True``) splits the samples one process evaluates (runtime test in ``paddle_cases_single.py``).
- outputs left on every rank: a beam surrogate's ``fig.savefig`` and ``np.savez``, a GAN's ``cv2.imwrite`` of its
  sample grid (a Paddle vocabulary had no image writers), and a ``print`` followed by a ``try:`` whose ``except``
  exits, taken for an error message.
- a FashionMNIST script's model built a ``MaxPool2D`` its ``forward`` never called: ``find_unused_parameters=True``
  was set, saying its parameters would get no gradient (a pooling layer has none); and a second model class it
  defined but never built got a batch-norm note. Round R's super-resolution script saved its sample grid with
  PIL's ``image.save(path)`` on every rank; two tabular scripts wrote ``submission.csv`` with pandas' ``to_csv`` on
  every rank (twice the rows in append mode). A MobileViT trainer built its optimizer in a function and handed the
  result to ``prepare``: it was wrapped by ``dp.distributed_optimizer`` while a note said the high-level API's
  optimizer is not wrapped again. A wind-power GRU's loop read `enumerate(train_loader)` from a DataLoader another
  module's method returned; its decline said "(no DataLoader)" and told the author to build one.
- the autograd guide's one broadcast sample went through a VGG with dropout: every rank trains on it, each with its
  own dropout mask, so a step averages N masks where one process drew one, and nothing said so (verify turns
  dropout off). A file whose conversion splits no data now gets a note at its first dropout, with the fix.
- ``dpmigrate verify`` left a 3-step checkpoint in a beam surrogate's ``outputs/pinn_results``: its scratch folders
  linked the user's folders whole, and the original ran where it is (``__file__`` paths in the user's tree). Small
  folders are now made anew with their entries linked, and the original runs as a copy placed like the conversion.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from rule_testing import convert_text, findings_of
from test_verify_paddle_real import _launch, _python
from verify_cases import causes, explain, verify

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

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

HAND_CUT = """\
    import numpy as np
    import paddle

    rows = np.arange(64, dtype="float32").reshape(16, 4) / 64
    net = paddle.nn.Linear(4, 1)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters())
    for start in range(0, 16, 4):
        x = paddle.to_tensor(rows[start:start + 4])
        loss = (net(x) - x.sum(1, keepdim=True)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.clear_grad()
    """


@pytest.mark.slow
@pytest.mark.parametrize(("source", "steps", "quoted"), [
    (ONE_SAMPLE, 1, "(in its summary: no training data was sharded)"),
    (HAND_CUT, 3, "(train.py:7, paddle-manual-batching)"),
], ids=["one-broadcast-sample", "hand-cut-batches"])
def test_verify_quotes_the_conversion_where_it_said_nothing_is_split(source, steps, quoted, tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source))
    data = verify(tmp_path, monkeypatch, script, steps=steps)
    assert data["verdict"] == "diverges" and causes(data) == ["not-sharded"], explain(data)
    assert data["headline"].endswith("as the conversion says (no speed-up, not a fault)"), explain(data)
    [cause] = data["comparison"]["causes"]
    assert cause["message"].startswith(f"as the conversion says {quoted}, every rank reads all the data"), explain(data)


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


def test_fit_s_positional_batch_size_is_the_third_argument():
    code = convert_text(FIT_WITH_A_CHECKPOINT, batch="global").output.decode()
    assert "model.fit(train_ds, test_ds, dp.per_rank_batch_size(8), epochs=2" in code, code


def test_the_ranks_wait_after_a_fit_that_writes_checkpoints():
    result = convert_text(FIT_WITH_A_CHECKPOINT)
    code = result.output.decode()
    assert 'save_dir="ckpt")\ndp.barrier()\nmodel.load("ckpt/final")\n' in code, code
    [change] = [f for f in findings_of(result, "paddle-high-level-api", "change") if "fit(...)" in f.message]
    assert change.line == 10 and "with save_dir" in change.message
    callback = FIT_WITH_A_CHECKPOINT.replace(', save_dir="ckpt")', ', callbacks=[paddle.callbacks.ModelCheckpoint(1, "ckpt")])')
    assert ')])\ndp.barrier()\nmodel.load(' in convert_text(callback).output.decode()
    assert "dp.barrier()" not in convert_text(FIT_WITH_A_CHECKPOINT.replace(', save_dir="ckpt"', "").replace(
        '    model.load("ckpt/final")\n', "")).output.decode()


@pytest.mark.slow
def test_the_checkpoint_fit_wrote_is_loaded_by_every_rank_once_it_is_there(tmp_path):
    (tmp_path / "train.py").write_bytes(convert_text(FIT_WITH_A_CHECKPOINT).output)
    for _ in range(2):  # the second run finds the first run's checkpoint: it must not load that one early either
        job = _launch("train.py", [], tmp_path)
        assert "finished" in job.stderr + job.stdout


def test_an_evaluation_loader_with_drop_last_that_a_paddle_model_gathers_is_noted_with_the_fix():
    source = """\
        import paddle
        data = paddle.io.TensorDataset([paddle.rand([20, 4]), paddle.randint(0, 2, [20, 1])])
        train_loader = paddle.io.DataLoader(data, batch_size=8, shuffle=True, drop_last=True)
        eval_loader = paddle.io.DataLoader(data, batch_size=8, drop_last=True)
        model = paddle.Model(paddle.nn.Linear(4, 2))
        model.prepare(paddle.optimizer.SGD(parameters=model.parameters()), paddle.nn.CrossEntropyLoss(), paddle.metric.Accuracy())
        model.fit(train_loader, eval_loader, epochs=3)
        """
    result = convert_text(source)
    [note] = [f for f in findings_of(result, "paddle-shard-training-loader", "note") if f.line == 4]
    assert "the count carries into the next evaluation" in note.message and note.fix.startswith("drop_last=False")
    kept = convert_text(source.replace("batch_size=8, drop_last=True)", "batch_size=8)"))
    assert [f.line for f in findings_of(kept, "paddle-shard-training-loader", "change")] == [3, 4]


def test_figures_arrays_and_images_are_written_by_the_main_process():
    code = convert_text("""\
        import cv2
        import matplotlib.pyplot as plt
        import numpy as np
        import paddle

        net = paddle.nn.Linear(2, 1)
        opt = paddle.optimizer.SGD(parameters=net.parameters())
        for step in range(3):
            net(paddle.ones([4, 2])).mean().backward()
            opt.step()
            opt.clear_grad()
        fig, ax = plt.subplots()
        ax.plot([1, 2])
        fig.savefig("loss.png")
        np.savez("weights.npz", w=net.weight.numpy())
        np.savez_compressed("small.npz", w=net.weight.numpy())
        cv2.imwrite("grid.png", np.zeros((4, 4), "uint8"))
        """).output.decode()
    for line in ('fig.savefig("loss.png")', 'np.savez("weights.npz"', 'np.savez_compressed("small.npz"',
                 'cv2.imwrite("grid.png"'):
        assert f"if dp.is_main_process():\n    {line}" in code, (line, code)


def test_a_print_before_a_try_whose_except_exits_is_printed_once():
    code = convert_text("""\
        import sys
        import paddle

        print("Starting to load data...")
        try:
            rows = open("rows.csv").read()
        except OSError:
            sys.exit(1)
        net = paddle.nn.Linear(2, 1)
        opt = paddle.optimizer.SGD(parameters=net.parameters())
        net(paddle.ones([4, 2])).mean().backward()
        opt.step()
        """).output.decode()
    assert 'dp.print("Starting to load data...")' in code, code


WRITES_INTO_ITS_FOLDERS = """\
    import os

    import numpy as np
    import paddle

    here = os.path.dirname(os.path.abspath(__file__))
    rows = np.arange(32, dtype="float32").reshape(8, 4) / 32
    loader = paddle.io.DataLoader(paddle.io.TensorDataset([paddle.to_tensor(rows)]), batch_size=4)
    net = paddle.nn.Linear(4, 1)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters())
    for (x,) in loader:
        net(x).mean().backward()
        opt.step()
        opt.clear_grad()
    paddle.save(net.state_dict(), "outputs/by_cwd.pdparams")
    paddle.save(net.state_dict(), os.path.join(here, "outputs", "by_file.pdparams"))
    paddle.save(net.state_dict(), os.path.join(here, "beside.pdparams"))
    """


@pytest.mark.slow
def test_verify_leaves_no_new_file_in_the_users_folders(tmp_path, monkeypatch):
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "kept.txt").write_text("the user's")
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(WRITES_INTO_ITS_FOLDERS))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    data = verify(tmp_path, monkeypatch, script, steps=2)
    assert data["verdict"] == "equivalent", explain(data)
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.name != "verify.json")
    assert after == before and (tmp_path / "outputs" / "kept.txt").read_text() == "the user's"


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


def test_a_table_pandas_writes_is_written_by_the_main_process():
    code = convert_text("""\
        import pandas as pd
        import paddle

        net = paddle.nn.Linear(2, 1)
        opt = paddle.optimizer.SGD(parameters=net.parameters())
        for step in range(3):
            net(paddle.ones([4, 2])).mean().backward()
            opt.step()
        frame = pd.DataFrame({"pred": [1, 2]})
        frame.to_csv("submission.csv", index=None, mode="a")
        text = frame.to_csv()
        """).output.decode()
    assert 'if dp.is_main_process():\n    frame.to_csv("submission.csv", index=None, mode="a")' in code, code
    assert "\ntext = frame.to_csv()\n" in code  # no path: it returns the text, every rank needs it


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


def test_a_loop_over_batches_the_conversion_cannot_follow_does_not_claim_there_is_no_dataloader():
    result = convert_text("""\
        import paddle
        from experiment import Experiment

        train_data, train_loader = Experiment().get_data(flag="train")
        net = paddle.nn.Linear(4, 1)
        opt = paddle.optimizer.Adam(parameters=net.parameters())
        for i, (x, y) in enumerate(train_loader):
            paddle.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
            opt.clear_grad()
        """)
    [declined] = findings_of(result, "paddle-manual-batching", "declined")
    assert "(no DataLoader the conversion can follow to here)" in declined.message
    assert "dp.distributed_loader(...)" in declined.fix


def test_verify_s_scratch_folder_makes_small_folders_anew_and_links_large_ones(tmp_path):
    from dpmigrate.verify import runs

    user = tmp_path / "project"
    (user / "outputs" / "runs").mkdir(parents=True)
    (user / "outputs" / "kept.txt").write_text("the user's")
    (user / "data").mkdir()
    for i in range(runs.MIRRORED_ENTRIES + 1):
        (user / "data" / f"{i}.txt").write_text("")
    work = tmp_path / "work"
    work.mkdir()
    scratch = runs.scratch_folder(work, "cwd", user)
    assert not (scratch / "outputs").is_symlink() and (scratch / "outputs" / "runs").is_dir()
    assert (scratch / "outputs" / "kept.txt").is_symlink() and (scratch / "outputs" / "kept.txt").read_text() == "the user's"
    assert (scratch / "data").is_symlink()  # a data set: linked whole
    (scratch / "outputs" / "runs" / "new.pdparams").write_text("")
    assert not (user / "outputs" / "runs" / "new.pdparams").exists()


def test_the_folder_above_is_mirrored_within_a_smaller_budget_than_the_working_one(tmp_path):
    """A parent that holds many small folders (the user's other projects; pytest's folder of every test) had each
    mirrored anew, up to 5,000 entries per placement: 21,000 links, 20 of 32 s of a small script's verify."""
    from dpmigrate.verify import runs

    user = tmp_path / "projects" / "mine"
    (user / "outputs").mkdir(parents=True)
    for i in range(200):  # siblings: 200 small projects of 3 entries each
        sibling = tmp_path / "projects" / f"other{i:03d}"
        (sibling / "src").mkdir(parents=True)
        (sibling / "a.txt").write_text("")
        (sibling / "b.txt").write_text("")
    work = tmp_path / "work"
    work.mkdir()
    scratch = runs.scratch_folder(work, "cwd", user)
    assert not (scratch / "outputs").is_symlink()  # the working folder: mirrored as before
    made = [p for p in scratch.parent.iterdir() if p.name.startswith("other") and not p.is_symlink()]
    assert 0 < len(made) * 3 <= runs.PARENT_BUDGET < 200 * 3  # the first few siblings anew, then linked whole
    assert all((scratch.parent / f"other{i:03d}" / "a.txt").exists() for i in range(200))  # all still reachable


def test_a_failed_job_shows_each_rank_s_last_error_first(tmp_path):
    """Round O's skip-gram notebook: the tail of the converted run showed rank 0's gloo timeout, not rank 1's error."""
    from dpmigrate.verify import runs

    log = tmp_path / "converted.log"
    log.write_text("[rank1] Traceback (most recent call last):\n[rank1]   File \"train.py\", line 9\n"
                   "[rank1] UnboundLocalError: cannot access local variable 'f'\n"
                   + "".join(f"[rank0] waiting {i}\n" for i in range(40))
                   + "[rank0] Error Message Summary:\n[rank0] RuntimeError: gloo timeout after 60 s\n")
    run = runs.Run(1, 1.0, log)
    assert run.rank_errors() == ["rank 0: RuntimeError: gloo timeout after 60 s",
                                 "rank 1: UnboundLocalError: cannot access local variable 'f'"]
    assert not any("UnboundLocalError" in line for line in run.tail())  # scrolled out of the tail
