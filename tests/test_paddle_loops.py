"""How a converted Paddle script's training loops get their data: loaders handed to trainers and local modules,
hand-made and generator-fed batches, one-epoch functions, evaluation loaders, ``fit``'s batch size, batch sizes
read in ``forward``, loops under ``device_guard``, and where ``dp.init()`` goes.

Each test is a shape a real Paddle script showed in issue 19's audits, written as our own script;
``tests/paddle_audit_rounds.md`` keeps the rounds' notes on where each came from.
"""

from __future__ import annotations

import re
import textwrap

import pytest
from paddle_shapes import FIT_WITH_A_CHECKPOINT, _original_and_launched
from rule_testing import convert_text, findings_of

from dpmigrate.cli import main


@pytest.mark.slow
def test_one_epoch_function_prints_each_validation_figure_once_over_the_whole_set(tmp_path):
    """Its verify (equivalent, split proven) is the fixtures'; launched, the validation loader is left whole, so the
    main process prints the whole set's error (a sum over 32 samples), once per epoch."""
    _, original, _, job = _original_and_launched("one_epoch_function", tmp_path)
    expected = [float(x) for x in re.findall(r"validation error ([0-9.]+)", original.stdout)]
    launched = [float(x) for x in re.findall(r"validation error ([0-9.]+)", job.stdout)]
    assert len(expected) == len(launched) == 2
    # (the ranks shuffle with the distributed sampler's generator, not the original's: close, not equal)
    assert launched == pytest.approx(expected, rel=0.25), (expected, launched)


@pytest.mark.slow
def test_a_loop_under_device_guard_declined_still_ends_on_both_ranks_and_saves_once(tmp_path):
    one, original, two, job = _original_and_launched("device_guard_loop", tmp_path)
    assert [line.split("] ", 1)[-1] for line in job.stdout.splitlines() if "loss" in line] == [
        line for line in original.stdout.splitlines() if "loss" in line]  # seeded: rank 0 is the original
    assert sorted(p.name for p in two.iterdir() if p.suffix == ".pdparams") == ["quadratic.pdparams"]


READER = """\
    import random
    import numpy as np
    import paddle
    {seed}
    table = np.arange(64, dtype="float32").reshape(16, 4)


    def pairs(count):
        def reader():
            for _ in range(count):
                rows = [random.choice(range(16)) for _ in range(4)]
                yield table[rows]
        return reader


    batches = pairs(5)
    net = paddle.nn.Linear(4, 1)
    opt = paddle.optimizer.SGD(learning_rate=0.01, parameters=net.parameters())
    for x in batches():
        net(paddle.to_tensor(x)).mean().backward()
        opt.step()
        opt.clear_grad()
    """


def test_batches_drawn_in_a_generator_a_factory_returns_are_said_to_be_the_same_on_every_rank():
    """Python's generator: seeded or not, alike on every rank (dp.init() shares rank 0's state)."""
    for seed in ("", "random.seed(3)"):
        result = convert_text(READER.format(seed=seed))
        [note] = findings_of(result, "paddle-manual-batching", "note")
        assert "(`random.choice`) from a generator alike on every rank" in note.message
        assert "every rank draws the same batches, which is correct" in note.message and note.effect is None
        assert (note.line, note.col) == (19, 1)  # the loop


def test_batches_drawn_from_paddles_unseeded_generator_are_said_to_differ_per_rank():
    result = convert_text(READER.format(seed="").replace("yield table[rows]", "yield paddle.rand([4, 4])"))
    [note] = findings_of(result, "paddle-manual-batching", "note")
    assert "(`paddle.rand`, unseeded, no DataLoader): each rank draws its own" in note.message and note.effect == "shard"


TRAINLIB = """\
    import numpy as np
    import paddle


    def train_per_epoch(model, loader, opt):
        for step, (xb, yb) in enumerate(loader):
            loss = paddle.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            opt.clear_grad()


    def train_model():
        x = paddle.to_tensor(np.random.RandomState(0).randn(64, 4).astype("float32"))
        y = paddle.to_tensor(np.random.RandomState(1).randint(0, 2, (64, 1)).astype("int64"))
        loader = paddle.io.DataLoader(paddle.io.TensorDataset([x, y]), batch_size=16, shuffle=True)
        model = paddle.nn.Linear(4, 2)
        opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
        train_per_epoch(model, loader, opt)
        print("final", float(model.weight.sum()))
    """


def test_an_entry_point_that_only_calls_a_local_modules_training_function_is_converted_with_it(tmp_path, capsys):
    (tmp_path / "trainlib.py").write_text(textwrap.dedent(TRAINLIB))
    (tmp_path / "main.py").write_text("from trainlib import train_model\n\nif __name__ == '__main__':\n    train_model()\n")
    main([str(tmp_path / "main.py")])
    err = capsys.readouterr().err
    assert (tmp_path / "main.py").read_text() == ("from trainlib import train_model\nimport dpmigrate.runtime.paddle as dp\n\n"
                                                  "if __name__ == '__main__':\n    dp.init()\n    train_model()\n")
    library = (tmp_path / "trainlib.py").read_text()
    assert "loader = dp.distributed_loader(paddle.io.DataLoader(" in library and "model = dp.distributed_model(model)" in library
    assert "comes through its local module trainlib, so it is converted as a PaddlePaddle script" in err, err


def test_a_loader_handed_to_a_local_modules_training_loop_is_sharded_by_position_or_keyword(tmp_path, capsys):
    (tmp_path / "trainlib.py").write_text(textwrap.dedent(TRAINLIB))
    script = textwrap.dedent("""\
        import paddle
        import trainlib
        from trainlib import train_per_epoch

        def main():
            model = paddle.nn.Linear(4, 2)
            opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
            first = paddle.io.DataLoader(DATA, batch_size=16, shuffle=True)
            second = paddle.io.DataLoader(DATA, batch_size=16, shuffle=True)
            other = paddle.io.DataLoader(DATA, batch_size=16)
            trainlib.train_per_epoch(model, first, opt)
            train_per_epoch(model, opt=opt, loader=second)
            trainlib.train_model(other)

        main()
        """)
    (tmp_path / "train.py").write_text(script)
    main([str(tmp_path / "train.py")])
    out = (tmp_path / "train.py").read_text()
    assert "first = dp.distributed_loader(paddle.io.DataLoader(" in out and "second = dp.distributed_loader(" in out, out
    assert "other = paddle.io.DataLoader(DATA, batch_size=16)" in out  # not a parameter a training loop iterates
    assert "train.py:10:13: declined paddle-shard-training-loader: cannot tell" in capsys.readouterr().err


EPOCH = """\
    import paddle

    def epoch(loader, {signature}):
        total = 0.0
        for x, y in loader:
            loss = ((model(x) - y) ** 2).mean()
            if training:
                opt.clear_grad()
                loss.backward()
                opt.step()
            {after}
            total += float(loss)
        return total

    train_loader = paddle.io.DataLoader(DATA, batch_size=4, shuffle=True)
    test_loader = paddle.io.DataLoader(TEST, batch_size=4)
    model = paddle.nn.Linear(4, 1)
    opt = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
    for e in range(2):
        print(epoch(train_loader, {train}))
        print(epoch(test_loader, {test}))
    """


def _epoch(signature="training=False", after="pass", train="training=True", test="training=False"):
    return convert_text(EPOCH.format(signature=signature, after=after, train=train, test=test))


def test_one_epoch_function_told_not_to_train_leaves_the_validation_loader_whole():
    for case in (_epoch(), _epoch(test="False"), _epoch(test=""), _epoch(signature="training", test="False")):
        out = case.output.decode()
        assert "train_loader = dp.distributed_loader(" in out and "test_loader = paddle.io.DataLoader(TEST" in out, out
        [note] = findings_of(case, "paddle-evaluation-loader", "note")
        assert "its loop also trains on `train_loader` (told by its call when to train)" in note.message


def test_one_epoch_function_that_also_trains_outside_the_flag_or_is_told_true_shards_both():
    for case in (_epoch(after="loss.backward()"), _epoch(test="training=True"), _epoch(test="flag")):
        out = case.output.decode()
        assert "test_loader = dp.distributed_loader(paddle.io.DataLoader(TEST" in out, out


GUARDED_LOOP = """\
    import paddle
    net = paddle.nn.Linear(1, 1)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters())
    with paddle.static.device_guard("gpu"):
        for step in range(3):
            loss = net(paddle.ones([2, 1])).mean()
            loss.backward()
            opt.step()
            opt.clear_grad()
    """


def test_a_dygraph_loop_under_device_guard_is_declined_at_the_guard_without_coverage_noise():
    result = convert_text(GUARDED_LOOP)
    declined = findings_of(result, "static-device-guard", "declined") + findings_of(result, "coverage", "declined")
    assert [(f.rule, f.line) for f in declined] == [("static-device-guard", 4)]
    assert "remove the `with paddle.static.device_guard(...)` line" in declined[0].fix


def test_a_dygraph_loop_under_device_guard_with_an_input_spec_for_export_is_declined_too():
    exported = GUARDED_LOOP + '    paddle.jit.save(net, "out/net", input_spec=[paddle.static.InputSpec([None, 1], "float32")])\n'
    assert [f.line for f in findings_of(convert_text(exported), "static-device-guard", "declined")] == [4]


def test_a_program_built_under_device_guard_is_static_graph_and_not_declined_for_it():
    result = convert_text("""\
        import paddle
        paddle.enable_static()
        x = paddle.static.data("x", [None, 1])
        with paddle.static.device_guard("cpu"):
            loss = paddle.static.nn.fc(x, 1).mean()
        paddle.optimizer.SGD(0.1).minimize(loss)
        exe = paddle.static.Executor(paddle.CPUPlace())
        """)
    assert not findings_of(result, "static-device-guard")


def test_init_goes_at_the_top_of_the_main_block_when_it_draws_data_before_calling_the_training_function():
    """word2vec (round F): ``data = datautil.make_data()`` then ``train(net, ...)``: dp.init() went to the top of
    ``train``, after the draw, so the generators were shared too late and the ranks drew different data."""
    out = convert_text("""\
        import paddle
        import datautil

        def train(model, data):
            opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
            for x, y in data:
                paddle.nn.functional.mse_loss(model(x), y).backward()
                opt.step()

        if __name__ == "__main__":
            data = datautil.make_data()
            train(paddle.nn.Linear(1, 1), data)
        """).output.decode()
    assert 'if __name__ == "__main__":\n    dp.init()\n    data = datautil.make_data()\n' in out, out
    assert out.count("dp.init()") == 1


HAND_UPDATE = """\
    import {framework}
    weight = {framework}.zeros([4, 1])
    weight.{trainable}
    loader = {loader}(DATA, batch_size=16)
    for x, y in loader:
        loss = ((x @ weight - y) ** 2).mean()
        loss.backward()
        {update}
    """


def test_a_loader_feeding_parameters_updated_by_hand_is_left_whole_and_declined():
    """Round G (the Paddle guide on layers and models, fed from a DataLoader): tensors updated from ``.grad`` with no
    optimizer; the loader was sharded, nothing averaged the gradients, and each rank trained on its half apart."""
    shapes = {
        "paddle": dict(trainable="stop_gradient = False", loader="paddle.io.DataLoader",
                       update="weight.set_value(weight - 0.1 * weight.grad)"),
        "torch": dict(trainable="requires_grad_()", loader="torch.utils.data.DataLoader",
                      update="weight.data -= 0.1 * weight.grad"),
    }
    for framework, parts in shapes.items():
        result = convert_text(HAND_UPDATE.format(framework=framework, **parts))
        assert "distributed_loader" not in result.output.decode()
        [declined] = [f for f in result.findings if f.severity == "declined" and "shard-training-loader" in f.rule]
        assert "updates its parameters by hand" in declined.message and "dp.all_reduce(w.grad)" in declined.fix
        with_optimizer = HAND_UPDATE.format(framework=framework, **parts) + (
            "    opt = paddle.optimizer.SGD(parameters=[weight])\n" if framework == "paddle" else
            "    opt = torch.optim.SGD([weight], lr=0.1)\n")
        assert "distributed_loader" in convert_text(with_optimizer).output.decode()


def test_a_full_batch_paddle_loop_is_noted_at_the_loop():
    result = convert_text("""\
        import paddle
        x = paddle.to_tensor([[1.0], [2.0], [3.0], [4.0]])
        y = 3 * x + 1
        net = paddle.nn.Linear(1, 1)
        opt = paddle.optimizer.SGD(learning_rate=0.01, parameters=net.parameters())
        for step in range(20):
            loss = paddle.nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            opt.clear_grad()
        """)
    [note] = findings_of(result, "paddle-manual-batching", "note")
    assert note.line == 6 and "uses the whole data at every step (full-batch training" in note.message
    assert "dp.shard(x)" in note.fix


def test_a_loop_over_the_files_own_generator_says_at_the_loop_that_nothing_is_split():
    result = convert_text("""\
        import random
        import numpy as np
        import paddle
        images = np.random.RandomState(0).rand(40, 4).astype("float32")


        def batches():
            order = list(range(len(images)))
            random.shuffle(order)
            for start in range(0, len(order), 8):
                yield images[order[start:start + 8]]


        def train(model):
            opt = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
            for epoch in range(2):
                generator = batches
                for step, x in enumerate(generator()):
                    model(paddle.to_tensor(x)).mean().backward()
                    opt.step()
                    opt.clear_grad()


        if __name__ == "__main__":
            train(paddle.nn.Linear(4, 1))
        """)
    [note] = findings_of(result, "paddle-manual-batching", "declined")
    assert "reads its batches from `enumerate(generator())`" in note.message and "no faster" in note.message
    assert note.line == 18 and "dp.shard(x)" in note.fix


def test_a_train_batch_step_outside_a_loop_says_its_batch_is_not_split():
    result = convert_text("""\
        import paddle
        net = paddle.nn.Linear(4, 2)
        model = paddle.Model(net, paddle.static.InputSpec([None, 4], "float32", "x"),
                             paddle.static.InputSpec([None, 1], "int64", "y"))
        opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
        model.prepare(opt, paddle.nn.CrossEntropyLoss())
        x = paddle.rand([4, 4])
        y = paddle.randint(0, 2, [4, 1])
        loss = model.train_batch([x], [y])
        print(loss)
        """)
    [note] = [f for f in findings_of(result, "paddle-high-level-api", "note") if "train_batch" in f.message]
    assert "train_batch(...) trains on the tensors it is handed" in note.message and note.line == 9
    assert "model.train_batch([dp.shard(x)], [dp.shard(y)])" in note.fix
    assert not any(f.effect == "shard" for f in result.findings)  # so the summary says nothing was sharded


RETURNED_LOADER = """\
    import numpy as np
    import paddle


    class Reviews(paddle.io.Dataset):
        def __init__(self, n):
            self.x = np.arange(n * 4, dtype="float32").reshape(n, 4)
            self.y = (np.arange(n) % 2).astype("int64").reshape(n, 1)

        def __getitem__(self, i):
            return self.x[i], self.y[i]

        def __len__(self):
            return len(self.x)


    def get_data_loader(n):
        loader = paddle.io.DataLoader(Reviews(n), batch_size=8, shuffle=True, drop_last=True)
        return loader


    train_loader = get_data_loader(64)
    model = paddle.Model(paddle.nn.Linear(4, 2))
    model.prepare(paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters()), paddle.nn.CrossEntropyLoss())
    model.fit(train_loader, epochs=1, verbose=0)
    model.fit(Reviews(32), epochs=1, verbose=0)
    """


def test_fit_on_a_loader_a_function_returns_is_not_declined_for_its_batch_size():
    result = convert_text(RETURNED_LOADER, batch="global")
    [scaled] = findings_of(result, "paddle-global-batch-size", "change")
    assert scaled.line == 18 and "dp.per_rank_batch_size(8)" in result.output.decode()
    # only the fit on a Dataset, whose batch size is fit's own default of 1, is declined
    [declined] = findings_of(result, "paddle-global-batch-size", "declined")
    assert declined.line == 26 and "default batch size of 1" in declined.message


NO_METRIC = """\
    import paddle

    train_set = paddle.io.TensorDataset([paddle.rand([64, 4]), paddle.randint(0, 2, [64, 1])])
    test_set = paddle.io.TensorDataset([paddle.rand([32, 4]), paddle.randint(0, 2, [32, 1])])
    train_loader = paddle.io.DataLoader(train_set, batch_size=8, shuffle=True)
    test_loader = paddle.io.DataLoader(test_set, batch_size=8)
    predict_loader = paddle.io.DataLoader(test_set, batch_size=8)
    model = paddle.Model(paddle.nn.Linear(4, 2))
    model.prepare(paddle.optimizer.Adam(parameters=model.parameters()), paddle.nn.CrossEntropyLoss())
    model.fit(train_loader, test_loader, epochs=1)
    model.predict(predict_loader)
    """


def test_an_evaluation_loader_left_whole_says_paddle_counts_its_samples_on_every_rank():
    result = convert_text(NO_METRIC)
    notes = {f.line: f.message for f in findings_of(result, "paddle-shard-training-loader", "note")}
    assert "left whole, every rank evaluates all of it" in notes[6]
    assert "'Eval samples' count it prints is about N times the loader's (its loss is exact)" in notes[6]
    assert "left whole" in notes[7] and "Eval samples" not in notes[7]  # predict gathers nothing, but counts
    assert "the 'Predict samples' count paddle.Model prints is N times the loader's" in notes[7]


SHAPED_BY_THE_BATCH = """\
    import paddle

    BATCH_SIZE = 8


    class WeightedLoss(paddle.nn.Layer):
        def forward(self, pred, label):
            weights = paddle.full(shape=[BATCH_SIZE], fill_value=1.0, dtype="float32")
            return paddle.mean(weights * ((pred - label) ** 2).squeeze(-1))


    data = paddle.io.TensorDataset([paddle.rand([BATCH_SIZE * 4, 4]), paddle.rand([BATCH_SIZE * 4, 1])])
    model = paddle.Model(paddle.nn.Linear(4, 1))
    model.prepare(paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters()), WeightedLoss())
    model.fit(data, batch_size=BATCH_SIZE, epochs=1, verbose=0, drop_last=True)
    """


GAN_LABELS = """\
    import paddle

    def train(args, generator, discriminator, loader):
        opt = paddle.optimizer.Adam(parameters=discriminator.parameters())
        for real in loader:
            real_label = paddle.full([args.batch_size, 1], 1.0)
            loss = paddle.nn.functional.binary_cross_entropy_with_logits(discriminator(real), real_label)
            loss.backward()
            opt.step()
            opt.clear_grad()

    def main(args):
        loader = paddle.io.DataLoader(paddle.io.TensorDataset([paddle.rand([64, 4])]), batch_size=args.batch_size,
                                      drop_last=True)
        train(args, None, paddle.nn.Linear(4, 1), loader)
    """


def test_the_global_batch_sizing_a_tensor_in_forward_is_declined_with_the_fix():
    result = convert_text(SHAPED_BY_THE_BATCH, batch="global")
    [declined] = findings_of(result, "paddle-global-batch-size", "declined")
    assert (declined.line, declined.col) == (8, 38) and "`BATCH_SIZE` sizes a tensor here (paddle.full(...))" in declined.message
    assert "dp.per_rank_batch_size(BATCH_SIZE) here" in declined.fix
    # the data set's size outside any loop is a set-up, not a batch: left alone
    assert "paddle.rand([BATCH_SIZE * 4, 4])" in result.output.decode()
    assert not findings_of(convert_text(SHAPED_BY_THE_BATCH), "paddle-global-batch-size", "declined")  # per-device


def test_the_global_batch_sizing_labels_in_a_training_loop_is_declined():
    result = convert_text(GAN_LABELS, batch="global")
    [declined] = findings_of(result, "paddle-global-batch-size", "declined")
    assert declined.line == 6 and "`args.batch_size` sizes a tensor here" in declined.message
    assert "batch_size=dp.per_rank_batch_size(args.batch_size)" in result.output.decode()


GENERATOR_AND_A_PEEK = """\
    import random

    import numpy as np
    import paddle


    def load_data(count):
        images = np.arange(count * 4, dtype="float32").reshape(count, 4)
        labels = np.arange(count, dtype="float32").reshape(count, 1)
        order = list(range(count))

        def data_generator():
            random.shuffle(order)
            for start in range(0, count, 8):
                picked = order[start:start + 8]
                yield images[picked], labels[picked]
        return data_generator


    model = paddle.nn.Linear(4, 1)
    train_loader = load_data(64)
    opt = paddle.optimizer.SGD(learning_rate=0.001, parameters=model.parameters())
    for epoch in range(2):
        for batch_id, (x, y) in enumerate(train_loader()):
            loss = paddle.mean((model(paddle.to_tensor(x)) - paddle.to_tensor(y)) ** 2)
            loss.backward()
            opt.step()
            opt.clear_grad()

    peek = paddle.io.DataLoader(paddle.io.TensorDataset([paddle.rand([8, 4])]), batch_size=4)
    for batch in peek:
        print(batch[0].shape)
        break
    """


def test_a_generator_fed_loop_is_noted_even_with_a_dataloader_that_only_evaluates():
    result = convert_text(GENERATOR_AND_A_PEEK)
    [note] = findings_of(result, "paddle-manual-batching", "note")
    assert note.line == 24 and "every rank draws the same batches" in note.message and "no speed-up" in note.message


def test_fit_s_positional_batch_size_is_the_third_argument():
    code = convert_text(FIT_WITH_A_CHECKPOINT, batch="global").output.decode()
    assert "model.fit(train_ds, test_ds, dp.per_rank_batch_size(8), epochs=2" in code, code


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
