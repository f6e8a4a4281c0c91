"""Issue 19, audit rounds D and E: shapes of real Paddle scripts the conversion got wrong, each as our own script.

- a trainer object handed the loader by keyword, whose loop trains through a method of the class
  (``loss = self.train_step(data)``): it was taken for an evaluation loader, left whole, each rank shuffling its
  own way while the report said "correct" (fixture ``trainer_keyword_loader``);
- batches drawn with Python's ``random`` in a generator a factory returns (the image_search tutorial's pairs):
  no note at all, while the summary said every rank reads all the data;
- a loss added up as ``loss.item() / len(train_set)`` inside the loop (LMF): half the figure on 2 ranks
  (fixture ``dataset_share_of_loss``);
- ``log = open("log.txt", "w+")`` kept for the run (a captcha trainer): both ranks wrote it, a stray byte at the end;
- a helper module naming no framework writing a report into the folder ``paddle.Model.save`` makes, and a data
  set's static ``parse`` shuffling its list (paddle-workbook's cats and dogs): rank 1 crashed, and each rank read
  the samples in its own order.

Executed on 2 ranks against 1 process: ``test_paddle_audit_round_e.py``.
"""

from __future__ import annotations

import textwrap

from rule_testing import convert_text, findings_of

from dpmigrate.cli import main

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


LOG = """\
    import paddle
    {before}
    log = open({args})
    loader = paddle.io.DataLoader(DATA, batch_size=8)
    net = paddle.nn.Linear(4, 1)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters())
    for x, y in loader:
        loss = paddle.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        opt.clear_grad()
        log.write("%f\\n" % float(loss))
    log.close()
    """


def test_a_log_file_kept_open_for_writing_is_the_main_processes_and_devnull_elsewhere():
    result = convert_text(LOG.format(before="", args="'log.txt', 'w+', encoding='utf-8'"))
    out = result.output.decode()
    assert "log = open('log.txt' if dp.is_main_process() else os.devnull, 'w+', encoding='utf-8')" in out
    assert out.startswith("import paddle\nimport os\nimport dpmigrate.runtime.paddle as dp\n"), out
    [change] = findings_of(result, "main-process-output", "change")
    assert "file `'log.txt'` opened for writing and kept in `log`" in change.message
    again = convert_text(out)
    assert again.output.decode() == out


def test_a_file_opened_for_reading_or_under_a_name_os_is_left_alone():
    reading = convert_text(LOG.format(before="", args="'log.txt'")).output.decode()
    assert "log = open('log.txt')" in reading
    shadowed = convert_text(LOG.format(before="os = 'posix'", args="'log.txt', 'w'")).output.decode()
    assert "log = open('log.txt', 'w')" in shadowed


def test_a_sum_divided_by_the_training_sets_size_inside_the_loop_is_summed_over_the_ranks():
    result = convert_text("""\
        import paddle
        train_set = make_set()
        other = make_set()
        loader = paddle.io.DataLoader(train_set, batch_size=8)
        net = paddle.nn.Linear(4, 1)
        opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters())
        for epoch in range(3):
            share = 0.0
            mixed = 0.0
            for x, y in loader:
                loss = paddle.nn.functional.mse_loss(net(x), y)
                loss.backward()
                opt.step()
                opt.clear_grad()
                share += loss.item() / len(train_set)
                mixed += loss.item() / len(other)
            print(share, mixed)
        """)
    out = result.output.decode()
    assert ('        mixed += loss.item() / len(other)\n    share = dp.all_reduce(share, op="sum")\n'
            '    mixed = dp.all_reduce(mixed, op="sum")\n') in out, out  # (an epoch sum the script prints: below)


EPOCH_SUMS = """\
    import paddle
    loader = paddle.io.DataLoader(DATA, batch_size=8)
    net = paddle.nn.Linear(4, 1)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters())
    kept = 0.0
    for epoch in range(3):
        total, batches, odd = 0.0, 0, 0.0
        for i, (x, y) in enumerate(loader):
            loss = paddle.nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            opt.clear_grad()
            total += loss
            batches += 1
            odd += float(loss)
            kept += float(loss)
        print(epoch, total, total / batches, total / len(loader))
        print(odd / (i + 1), kept)
    """


def test_epoch_sums_reported_after_the_loop_are_summed_or_averaged_over_the_ranks():
    result = convert_text(EPOCH_SUMS)
    out = result.output.decode()
    assert '        kept += float(loss)\n    odd = dp.all_reduce(odd, op="mean")\n' in out, out  # / this rank's batches
    assert "dp.all_reduce(total" not in out  # read both as a sum (/ batches) and per batch (/ len(loader))
    assert "dp.all_reduce(batches" not in out  # the count divides `total`, which stays this rank's
    assert "dp.all_reduce(kept" not in out  # never reset: a running figure across epochs
    [change] = findings_of(result, "paddle-training-dataset-averages", "change")
    assert change.message.startswith("odd averaged over all ranks after this loop")
    plain = convert_text(EPOCH_SUMS.replace(", total / len(loader))", ")")).output.decode()
    assert ('    total = dp.all_reduce(total, op="sum")\n    batches = dp.all_reduce(batches, op="sum")\n'
            '    odd = dp.all_reduce(odd, op="mean")\n') in plain, plain


PROJECT_TRAIN = """\
    import os
    import paddle
    import mod.rows
    import mod.report


    def main():
        model = paddle.Model(paddle.nn.Linear(1, 2))
        model.prepare(paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters()),
                      paddle.nn.CrossEntropyLoss(), paddle.metric.Accuracy())
        model.fit(mod.rows.Rows(16), epochs=1, batch_size=4, verbose=0)
        result = model.evaluate(mod.rows.Rows(8, shuffle=False), batch_size=4, verbose=0)
        folder = os.path.join("params", "run")
        model.save(os.path.join(folder, "model"))
        mod.report.write(os.path.join(folder, "report.json"), {"acc": float(result["acc"])})


    if __name__ == "__main__":
        main()
    """
PROJECT_ROWS = """\
    import random
    import numpy as np
    import paddle


    class Rows(paddle.io.Dataset):
        def __init__(self, n, shuffle=True):
            super().__init__()
            self.rows = self.parse(n, shuffle)

        @staticmethod
        def parse(n, shuffle):
            lines = list(range(n))
            if shuffle:
                random.shuffle(lines)
            return lines

        def noisy(self, i):
            order = list(range(4))
            random.shuffle(order)
            return order

        def __getitem__(self, i):
            r = self.rows[i] + 0 * self.noisy(i)[0]
            return np.array([r], dtype="float32"), np.array([r % 2], dtype="int64")

        def __len__(self):
            return len(self.rows)
    """
PROJECT_REPORT = """\
    import json


    def write(path, figures):
        with open(path, "w") as f:
            json.dump(figures, f)
    """


def write_project(folder):
    (folder / "mod").mkdir()
    (folder / "mod" / "__init__.py").write_text("")
    (folder / "mod" / "rows.py").write_text(textwrap.dedent(PROJECT_ROWS))
    (folder / "mod" / "report.py").write_text(textwrap.dedent(PROJECT_REPORT))
    (folder / "train.py").write_text(textwrap.dedent(PROJECT_TRAIN))


def test_a_helper_naming_no_framework_writes_on_the_main_process_and_a_parse_method_shuffles_alike(tmp_path, capsys):
    write_project(tmp_path)
    assert main([str(tmp_path / "train.py")]) == 1  # files changed
    err = capsys.readouterr().err
    report = (tmp_path / "mod" / "report.py").read_text()
    assert '    if dp.is_main_process():\n        with open(path, "w") as f:\n' in report, report
    assert report.startswith("import json\nimport dpmigrate.runtime.paddle as dp\n")
    rows = (tmp_path / "mod" / "rows.py").read_text()
    assert "            random.shuffle(lines)\n            lines = dp.broadcast(lines)\n" in rows, rows
    assert rows.count("dp.broadcast") == 1  # not the draw __getitem__ makes through noisy(): per sample, in workers
    assert "report.py:5:10: change main-process-output: file written by the main process only" in err, err
    train = (tmp_path / "train.py").read_text()
    assert 'model.save(os.path.join(folder, "model"))\n    dp.barrier()\n' in train, train
    before = {p: p.read_bytes() for p in tmp_path.rglob("*.py")}
    assert main([str(tmp_path / "train.py")]) == 0  # a second run changes nothing
    assert {p: p.read_bytes() for p in tmp_path.rglob("*.py")} == before


def test_a_helper_naming_no_framework_of_a_script_left_alone_stays_as_it_is(tmp_path):
    (tmp_path / "report.py").write_text(textwrap.dedent(PROJECT_REPORT))
    (tmp_path / "train.py").write_text("import report\nreport.write('r.json', {})\n")
    main([str(tmp_path / "train.py")])
    assert (tmp_path / "report.py").read_text() == textwrap.dedent(PROJECT_REPORT)


def test_a_visualdl_writer_handed_to_another_modules_function_is_left_on_every_rank_and_declined():
    result = convert_text("""\
        import paddle
        from visualdl import LogWriter
        import loop
        writer = LogWriter(logdir="log")
        kept = LogWriter(logdir="kept")
        for epoch in range(2):
            loop.train_per_epoch(epoch, writer)
            kept.add_scalar("epoch", epoch, epoch)
        """)
    out = result.output.decode()
    assert 'writer = LogWriter(logdir="log")\n' in out and "loop.train_per_epoch(epoch, writer)" in out
    assert 'kept = LogWriter(logdir="kept") if dp.is_main_process() else None' in out
    [declined] = findings_of(result, "paddle-visualdl", "declined")
    assert "handed to `loop.train_per_epoch(epoch, writer)`" in declined.message and declined.line == 4


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


def test_two_saves_under_one_test_reduce_the_figure_once():
    """Round G (a knowledge-distillation trainer): ``if dp.all_reduce(dp.all_reduce(roc_auc)) > best:``."""
    out = convert_text("""\
        import paddle
        model = paddle.nn.Linear(2, 1)
        opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
        best = 0.0
        for epoch in range(2):
            loss = model(paddle.rand([4, 2])).mean()
            loss.backward()
            opt.step()
            opt.clear_grad()
            metric = 1.0 / (1.0 + float(loss))
            if metric > best:
                paddle.save(model.state_dict(), "model.pdparams")
                paddle.save(opt.state_dict(), "opt.pdopt")
        """).output.decode()
    assert "    if dp.all_reduce(metric) > best:\n" in out, out


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


def test_a_helper_modules_prints_are_the_main_processes(tmp_path, capsys):
    (tmp_path / "helpers.py").write_text("import paddle\n\ndef build():\n    net = paddle.nn.Linear(4, 1)\n"
                                         "    print('built', net)\n    return net\n")
    (tmp_path / "train.py").write_text(textwrap.dedent("""\
        import paddle
        import helpers
        model = helpers.build()
        opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
        for x, y in paddle.io.DataLoader(DATA, batch_size=8):
            paddle.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        """))
    main([str(tmp_path / "train.py")])
    assert "    dp.print('built', net)\n" in (tmp_path / "helpers.py").read_text()
    assert "helpers.py:5:5: change main-process-print" in capsys.readouterr().err


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
