"""What a converted Paddle script writes and prints: logs kept open, pathlib and helper-module writes, figures, tables,
summaries and checkpoints are the main process's, readers wait for the file, and plain reads are left alone.

Each test is a shape a real Paddle script showed in issue 19's audits, written as our own script;
``tests/paddle_audit_rounds.md`` keeps the rounds' notes on where each came from.
Rule-level checks convert text; the slow ones run the conversion on 2 ranks against 1 process.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest
from fixture_cases import FIXTURES, run
from paddle_shapes import FIT_WITH_A_CHECKPOINT, _original_and_launched
from rule_testing import convert_text, findings_of
from test_verify_paddle_real import _launch, _python
from verify_cases import explain, verify

from dpmigrate.cli import main


@pytest.mark.slow
def test_the_trainers_log_is_written_once_whole_and_its_steps_are_the_originals(tmp_path):
    one, original, two, job = _original_and_launched("trainer_keyword_loader", tmp_path)
    assert (two / "history.txt").read_text().count("\n") == (one / "history.txt").read_text().count("\n") == 2
    assert re.fullmatch(r"(epoch \d accuracy \d\.\d{4}\n)+", (two / "history.txt").read_text())  # no stray bytes
    steps = [line.split("] ", 1)[-1] for line in job.stdout.splitlines() if "steps done" in line]
    assert steps == [line for line in original.stdout.splitlines() if "steps done" in line] == ["steps done 16"]


@pytest.mark.slow
def test_a_paddle_model_project_with_a_writing_helper_ends_on_both_ranks_and_is_equivalent(tmp_path, monkeypatch):
    original, converted = tmp_path / "original", tmp_path / "converted"
    original.mkdir(), converted.mkdir()
    write_project(original)
    data = verify(original, monkeypatch, original / "train.py", steps=3)
    assert data["verdict"] == "equivalent", explain(data)
    check = data["comparison"]["data"]
    assert check["observed"] == check["split"] == 3, explain(data)
    write_project(converted)
    main([str(converted / "train.py"), "--batch", "global"])
    _launch("train.py", [], converted)
    assert json.loads((converted / "params" / "run" / "report.json").read_text()).keys() == {"acc"}
    assert (converted / "params" / "run" / "model.pdparams").exists()


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


PATHLIB = """\
    import gzip
    import json
    from pathlib import Path

    import torch

    out = Path("results")
    out.mkdir(exist_ok=True)
    log_file = (out / "train.log").open("w", encoding="utf-8")
    packed = gzip.open(out / "steps.gz", "wt")
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    history = []
    for step in range(3):
        loss = model(torch.ones(4, 2)).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        log_file.write(f"{step} {loss.item():.6f}\\n")
        packed.write(f"{step}\\n")
        history.append(loss.item())
    log_file.close()
    packed.close()
    with (out / "curve.csv").open("a", newline="") as f:
        f.write(",".join(f"{h:.6f}" for h in history) + "\\n")
    (out / "history.json").write_text(json.dumps(history), encoding="utf-8")
    print((out / "history.json").read_text())
    """


def test_pathlib_writes_run_on_the_main_process_and_a_kept_path_open_elsewhere_opens_devnull():
    result = convert_text(PATHLIB)
    code = result.output.decode()
    assert ('log_file = (out / "train.log").open("w", encoding="utf-8") if dp.is_main_process() else '
            'open(os.devnull, "w", encoding="utf-8")') in code
    assert 'packed = gzip.open(out / "steps.gz" if dp.is_main_process() else os.devnull, "wt")' in code
    assert 'if dp.is_main_process():\n    with (out / "curve.csv").open("a", newline="") as f:' in code
    assert 'if dp.is_main_process():\n    (out / "history.json").write_text(' in code
    assert 'encoding="utf-8")\ndp.barrier()\ndp.print(' in code  # the read-back waits for the main process's write
    assert "\nimport os\n" in code
    messages = [f.message for f in findings_of(result, "main-process-output", "change")]
    assert len(messages) == 5, messages
    assert convert_text(code).output == result.output  # a second run changes nothing


def test_a_path_opened_for_reading_and_a_method_named_open_with_no_mode_are_left_alone():
    code = textwrap.dedent("""\
        from pathlib import Path
        import torch
        text = Path("labels.txt").open().read()
        rows = Path("labels.txt").open("r").readlines()
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        """)
    result = convert_text(code)
    assert not findings_of(result, "main-process-output")


@pytest.mark.slow
def test_the_converted_pathlib_writer_writes_each_file_once_on_two_ranks(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent(PATHLIB))
    subprocess.run([sys.executable, "-m", "dpmigrate", "train.py"], cwd=tmp_path, capture_output=True, timeout=120)
    proc = subprocess.run([sys.executable, "-m", "dpmigrate.launch", "-n", "2", "--log-dir", str(tmp_path / "logs"),
                           "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = tmp_path / "results"
    assert len((results / "train.log").read_text().splitlines()) == 3  # one rank's lines, whole
    assert len((results / "curve.csv").read_text().splitlines()) == 1  # appended once
    assert (results / "history.json").read_text().startswith("[")
    import gzip
    with gzip.open(results / "steps.gz", "rt") as f:
        assert f.read().split() == ["0", "1", "2"]


def test_a_verbose_scheduler_speaks_on_the_main_process_only():
    for framework, make in [("paddle", "paddle.optimizer.lr.OneCycleLR(max_learning_rate=1.0, total_steps=9, verbose=True)"),
                            ("torch", "torch.optim.lr_scheduler.StepLR(opt, 2, verbose=True)")]:
        result = convert_text(f"""\
            import {framework}
            net = {framework}.nn.Linear(2, 1)
            opt = {"paddle.optimizer.SGD(parameters=net.parameters())" if framework == "paddle"
                   else "torch.optim.SGD(net.parameters(), lr=0.1)"}
            scheduler = {make}
            quiet = {make.replace("verbose=True", "verbose=False")}
            for step in range(3):
                net({framework}.ones([4, 2])).mean().backward()
                opt.step()
                scheduler.step()
            """)
        code = result.output.decode()
        assert code.count("verbose=dp.is_main_process()") == 1 and "verbose=False" in code, code
        assert len([f for f in findings_of(result, "main-process-output") if "scheduler" in f.message]) == 1


def test_a_print_into_a_file_it_opens_runs_on_the_main_process_and_a_removal_waits_for_the_readers():
    result = convert_text("""\
        import os
        import shutil
        import paddle

        def main():
            net = paddle.nn.Linear(2, 1)
            opt = paddle.optimizer.SGD(parameters=net.parameters())
            print("start", file=open("log.txt", "w"))
            print("kept", file=log_file)
            print("read", file=open("log.txt"))
            for step in range(3):
                net(paddle.ones([4, 2])).mean().backward()
                opt.step()
                opt.clear_grad()
            paddle.save(net.state_dict(), "out/net.pdparams")
            check("out")
            shutil.rmtree("out")
            os.remove("unrelated.txt")

        if __name__ == "__main__":
            main()
            if True:
                os.remove("elsewhere")
        """)
    code = result.output.decode()
    assert 'if dp.is_main_process():\n        print("start", file=open("log.txt", "w"))' in code
    assert 'print("kept", file=log_file)' in code and 'print("read", file=open("log.txt"))' in code  # left as they were
    assert '    check("out")\n    dp.barrier()\n    if dp.is_main_process():\n        shutil.rmtree("out")' in code
    assert 'file=open("log.txt", "w"))\n    dp.barrier()\n    print("kept"' in code  # the read of log.txt waits for it
    assert code.count("dp.barrier()") == 2  # not before a removal of a path nothing earlier was handed
    [waits] = [f for f in findings_of(result, "main-process-output") if "removal" in f.message]
    assert waits.line == 17 and "what check(...) was handed" in waits.message


@pytest.mark.slow
def test_the_log_is_written_once_and_a_late_rank_still_reads_the_export_before_it_is_removed(tmp_path):
    """Fixture ``paddle/log_file_cleanup`` on 2 ranks, its rank 1 made 3 s late before it reads the export: the
    job ends, the log holds the original's lines once, and the export folder is gone."""
    case = FIXTURES / "paddle" / "log_file_cleanup"
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    (one / "train.py").write_bytes((case / "before.py").read_bytes())
    converted = run(case, batch="global").output.decode()
    late = converted.replace("def check_export(folder, points):\n",
                             "def check_export(folder, points):\n    if dp.rank() == 1:\n        __import__('time').sleep(3)\n")
    assert late != converted
    (two / "train.py").write_text(late)
    original = _python(["train.py"], one)
    job = _launch("train.py", [], two)
    assert (two / "train_log.txt").read_text() == (one / "train_log.txt").read_text() == (
        "training for 2 epochs\nepoch 0 done\nepoch 1 done\n")
    assert not (one / "export").exists() and not (two / "export").exists()
    checked = [line.split("] ", 1)[-1] for line in job.stdout.splitlines() if "exported model" in line]
    assert len(checked) == 1 and len([line for line in original.stdout.splitlines() if "exported model" in line]) == 1


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
