"""Figures a converted Paddle script computes from per-rank values: losses summed or divided by the data set's size,
epoch sums, stop tests on a dict's entry, and best-checkpoint tests nested in other tests, reduced over the ranks
where they must be and only there.

Each test is a shape a real Paddle script showed in issue 19's audits, written as our own script;
``tests/paddle_audit_rounds.md`` keeps the rounds' notes on where each came from.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap

import pytest
from paddle_shapes import NESTED_BEST_SAVE, _original_and_launched
from rule_testing import convert_text, findings_of
from verify_cases import explain, verify


@pytest.mark.slow
def test_the_loss_per_sample_of_the_epoch_prints_the_originals_figures(tmp_path):
    _, original, _, job = _original_and_launched("dataset_share_of_loss", tmp_path)

    def figures(output):
        return [float(x) for x in re.findall(r"average loss ([0-9.]+)", output)]

    expected, launched = figures(original.stdout), figures(job.stdout)
    assert len(expected) == 3 and len(launched) == 3  # printed once, by the main process
    assert launched == pytest.approx(expected, abs=2e-6)


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
