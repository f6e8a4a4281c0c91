"""Issue 19, audit round M: shapes of real Paddle scripts the conversion reported wrongly, each as our own script.

- an IMDB classifier built its DataLoaders in a function (``def get_data_loader(mode): ... return loader``) and
  handed the returned loader to ``paddle.Model.fit`` with no ``batch_size``: under ``--batch global`` (the mode
  ``dpmigrate verify`` converts with) the report declined the ``fit`` for "the default batch size of 1", while
  the same report had sharded that loader and scaled its own batch size, and ``fit`` ignores ``batch_size`` for a
  DataLoader. The training was right; the report said a site was left undone that was done.
- the same classifier, prepared with a loss and no metric, evaluated a DataLoader in ``fit(train, eval_loader)``:
  left whole (its loss is then exact), with a note calling that correct; but ``paddle.Model`` gathers every
  rank's outputs, and printed "Eval samples: 256" for 128 (measured on 2 ranks). The note now says so.
- an MLP homework kept its whole log with ``print(line, file=open(log, "a"))``, after ``print(..., file=open(log,
  "w"))``: every rank wrote every line (each with its own figures) and could truncate the other's; the print is
  now run by the main process (fixture ``paddle/log_file_cleanup``).
- a device smoke test exported its model, loaded it back on every rank and removed the folder: the removal ran on
  the main process alone, with nothing between the other ranks' reads and it; a rank 5 s late failed on a deleted
  file. The removal now waits for every rank (``dp.barrier()``) when an earlier statement of the same function
  handed that path to a call.
- the same homework trained five fresh models in ``for t in range(5):`` (each handed to ``train(model, ...)``) and
  set its device with ``paddle.device.set_device(paddle.device.get_device())``: both were declined, the model
  "built and trained inside one block"; run as it was, each rank trained its own copy on its half of the data.
  A model built afresh in each turn of a ``range`` loop is now wrapped in the turn (``tests/test_rules_model.py``,
  fixture ``paddle/repeated_trials``), and the current device is treated as a device the script names.
"""

from __future__ import annotations

import pytest
from fixture_cases import FIXTURES, run
from rule_testing import convert_text, findings_of
from test_verify_paddle_real import _launch, _python

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


def test_the_current_device_becomes_this_ranks_card_when_it_is_a_gpu():
    result = convert_text("""\
        import paddle
        paddle.device.set_device(paddle.device.get_device())
        net = paddle.nn.Linear(2, 1)
        """)
    assert ("paddle.device.set_device(dp.device() if paddle.device.get_device().startswith(\"gpu\") "
            "else paddle.device.get_device())") in result.output.decode()
    assert not findings_of(result, "paddle-rank-device", "declined")
