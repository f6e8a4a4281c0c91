"""Issue 19, audit rounds I and J: shapes of real Paddle scripts the conversion got wrong, each as our own script.

- a steel-defect classifier kept its log in ``log_path.open("w")`` and wrote its history with pathlib
  (``path.write_text(json.dumps(...))``, ``with path.open("a") as f:`` in a helper module): only the builtin
  ``open`` was run on the main process, so both ranks truncated and wrote the same log and the CSV got every row
  twice. (The plateau scheduler, the hash seed and the unused ``paddle.Model`` of this round have their own tests:
  ``test_plateau_metric.py``, ``test_hash_seed.py``, fixture ``paddle/unused_hapi_model``.)
- a memory network stopped on ``info["validate_perplexity"] < target``: the stop test became
  ``dp.all_reduce(info)[...]``, and both ranks failed at the end of the first epoch (a dict is no number);
- under ``--batch global``, a summed loss in a loop that draws its batches by hand (nothing sharded) was still
  multiplied by the world size: every rank summed the whole batch, so the update was N times the original's;
- a loop over a generator of the file's own reached through another name (``generator = data_generator``) that
  yields batches it cuts itself: nothing was split, and only the summary line said so;
- one ``model.train_batch(x, y)`` step of a ``paddle.Model`` outside any loop (the docstring example of Paddle's
  ``Model.train_batch``, round K): every rank trained on the same tensors, and the summary said the global batch was
  N times the script's;
- learning-rate schedulers made with ``verbose=True`` (OneCycleLR's and CosineAnnealingWarmRestarts' examples,
  round L): Paddle printed each "set learning rate" line on every rank.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from rule_testing import convert_text, findings_of

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


DICT_STOP = """\
    import numpy as np
    import paddle

    paddle.seed(0)
    model = paddle.nn.Linear(4, 1)
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    x = paddle.to_tensor(np.ones([8, 4], dtype="float32"))
    for epoch in range(4):
        loss = paddle.nn.functional.mse_loss(model(x), paddle.zeros([8, 1]))
        loss.backward()
        opt.step()
        opt.clear_grad()
        info = {"epoch": epoch, "loss": float(loss)}
        history = {"val": {"loss": float(loss)}}
        if info["loss"] < 1e-6:
            break
        if history["val"]["loss"] < 1e-7:
            break
    print("stopped after", epoch)
    """


def test_a_stop_test_on_a_dicts_entry_reduces_the_entry_not_the_dict():
    code = convert_text(DICT_STOP).output.decode()
    assert 'if dp.all_reduce(info["loss"]) < 1e-6:' in code
    assert 'if dp.all_reduce(history["val"]["loss"]) < 1e-7:' in code
    assert "dp.all_reduce(info)" not in code and "dp.all_reduce(history)" not in code


@pytest.mark.slow
def test_the_converted_dict_stop_test_runs_on_two_ranks(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent(DICT_STOP))
    original = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    [stopped] = [line for line in original.stdout.splitlines() if line.startswith("stopped after")]
    subprocess.run([sys.executable, "-m", "dpmigrate", "train.py"], cwd=tmp_path, capture_output=True, timeout=120)
    assert "dp.all_reduce(info[" in (tmp_path / "train.py").read_text()
    proc = subprocess.run([sys.executable, "-m", "dpmigrate.launch", "-n", "2", "--log-dir", str(tmp_path / "logs"),
                           "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and f"[rank0] {stopped}" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


SUMMED_BY_HAND = """\
    import numpy as np
    import paddle

    data = np.random.RandomState(0).rand(64, 4).astype("float32")
    model = paddle.nn.Linear(4, 1)
    opt = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
    lossfn = paddle.nn.MSELoss(reduction="sum")
    for step in range(3):
        {batch}
        loss = lossfn(model(x), paddle.zeros([x.shape[0], 1]))
        loss.backward()
        opt.step()
        opt.clear_grad()
    """


def test_a_summed_loss_is_scaled_only_where_the_batch_is_this_ranks_share():
    drawn = convert_text(SUMMED_BY_HAND.format(batch="x = paddle.to_tensor(data[np.random.randint(0, 64, size=16)])"),
                         batch="global")
    assert "dp.world_size()" not in drawn.output.decode() and not findings_of(drawn, "summed-loss")
    cut = convert_text(SUMMED_BY_HAND.format(batch="x = paddle.to_tensor(data[step * 16:(step + 1) * 16])"),
                       batch="global")
    [note] = findings_of(cut, "paddle-manual-batching", "note")
    assert "every rank reads the same batches" in note.message and not findings_of(cut, "summed-loss")
    # (a loop over a sharded DataLoader is still scaled: tests/test_rules_summed_loss.py)


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
