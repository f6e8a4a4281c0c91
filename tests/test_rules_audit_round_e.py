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


def test_batches_drawn_unseeded_in_a_generator_a_factory_returns_are_said_to_differ_per_rank():
    result = convert_text(READER.format(seed=""))
    [note] = findings_of(result, "paddle-manual-batching", "note")
    assert "draws its batches at random at every step (`random.choice`, unseeded" in note.message
    assert "each rank draws its own" in note.message and note.effect == "shard"
    assert (note.line, note.col) == (19, 1)  # the loop


def test_batches_drawn_after_a_seed_are_said_to_be_the_same_on_every_rank():
    result = convert_text(READER.format(seed="random.seed(3)"))
    [note] = findings_of(result, "paddle-manual-batching", "note")
    assert "after a seed every rank sets alike: every rank draws the same batches" in note.message


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
    assert '        mixed += loss.item() / len(other)\n    share = dp.all_reduce(share, op="sum")\n' in out, out
    assert "mixed = dp.all_reduce" not in out


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
