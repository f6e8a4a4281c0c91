"""Issue 19, audit rounds D and E, executed: the shapes of ``test_rules_audit_round_e.py`` on 2 ranks against 1 process.

``dpmigrate verify`` of the fixtures ``trainer_keyword_loader``, ``dataset_share_of_loss``, ``one_epoch_function``,
``model_then_plain_loop``, ``device_guard_loop`` and ``layers_in_a_list`` (1 process against 2, step by step, the split
proven, or the exemption their execute.json states) is ``test_fixtures_execute_paddle.py``'s. Here, past verify's steps:

- the trainer's log file, opened once at the top of the script, is written whole by the main process (both ranks
  wrote it before: half the lines and a stray byte), and the steps it counts are the original's;
- the epoch's loss per sample, added up as ``loss.item() * len(x) / len(train_set)``, prints the original's figures;
- a ``paddle.Model`` project whose helper module, naming no framework, writes a report into the folder the save
  makes: the job ends on both ranks (rank 1 crashed before) and is equivalent to one process, its data set's
  shuffled list shared.

The runs are subprocesses; this process imports no framework.
"""

from __future__ import annotations

import json
import re
import textwrap

import pytest
from fixture_cases import FIXTURES, run
from test_rules_audit_round_e import write_project
from test_verify_paddle_real import _launch, _python
from verify_cases import explain, verify

from dpmigrate.cli import main

pytestmark = pytest.mark.slow

PADDLE = FIXTURES / "paddle"


def _original_and_launched(case: str, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    (one / "train.py").write_bytes((PADDLE / case / "before.py").read_bytes())
    (two / "train.py").write_bytes(run(PADDLE / case, batch="global").output)
    return one, _python(["train.py"], one), two, _launch("train.py", [], two)


def test_the_trainers_log_is_written_once_whole_and_its_steps_are_the_originals(tmp_path):
    one, original, two, job = _original_and_launched("trainer_keyword_loader", tmp_path)
    assert (two / "history.txt").read_text().count("\n") == (one / "history.txt").read_text().count("\n") == 2
    assert re.fullmatch(r"(epoch \d accuracy \d\.\d{4}\n)+", (two / "history.txt").read_text())  # no stray bytes
    steps = [line.split("] ", 1)[-1] for line in job.stdout.splitlines() if "steps done" in line]
    assert steps == [line for line in original.stdout.splitlines() if "steps done" in line] == ["steps done 16"]


def test_the_loss_per_sample_of_the_epoch_prints_the_originals_figures(tmp_path):
    _, original, _, job = _original_and_launched("dataset_share_of_loss", tmp_path)

    def figures(output):
        return [float(x) for x in re.findall(r"average loss ([0-9.]+)", output)]

    expected, launched = figures(original.stdout), figures(job.stdout)
    assert len(expected) == 3 and len(launched) == 3  # printed once, by the main process
    assert launched == pytest.approx(expected, abs=2e-6)


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


def test_one_epoch_function_prints_each_validation_figure_once_over_the_whole_set(tmp_path):
    """Its verify (equivalent, split proven) is the fixtures'; launched, the validation loader is left whole, so the
    main process prints the whole set's error (a sum over 32 samples), once per epoch."""
    _, original, _, job = _original_and_launched("one_epoch_function", tmp_path)
    expected = [float(x) for x in re.findall(r"validation error ([0-9.]+)", original.stdout)]
    launched = [float(x) for x in re.findall(r"validation error ([0-9.]+)", job.stdout)]
    assert len(expected) == len(launched) == 2
    # (the ranks shuffle with the distributed sampler's generator, not the original's: close, not equal)
    assert launched == pytest.approx(expected, rel=0.25), (expected, launched)


def test_a_loop_under_device_guard_declined_still_ends_on_both_ranks_and_saves_once(tmp_path):
    one, original, two, job = _original_and_launched("device_guard_loop", tmp_path)
    assert [line.split("] ", 1)[-1] for line in job.stdout.splitlines() if "loss" in line] == [
        line for line in original.stdout.splitlines() if "loss" in line]  # seeded: rank 0 is the original
    assert sorted(p.name for p in two.iterdir() if p.suffix == ".pdparams") == ["quadratic.pdparams"]


def test_a_network_fine_tuned_by_a_plain_loop_after_fit_ends_as_the_original(tmp_path):
    """Round F (the guide's train/eval/predict notebook): the plain loop after ``fit`` trained the raw network, each
    rank apart. Wrapped before its optimizer, the 2-rank job prints the original's loss (seeded, unshuffled)."""
    _, original, _, job = _original_and_launched("model_then_plain_loop", tmp_path)

    def loss(output):
        return [float(x) for x in re.findall(r"fine-tuned loss ([0-9.]+)", output)]

    assert len(loss(job.stdout)) == 1 and loss(job.stdout) == pytest.approx(loss(original.stdout), abs=2e-5)


def test_verify_runs_a_script_that_imports_its_project_through_the_folder_above(tmp_path, monkeypatch):
    """Round F (FCCDN_paddle): ``tools/train.py`` puts the project root on ``sys.path`` and imports ``tools.helper``;
    verify placed the converted copy where that root had no ``tools/`` and blamed the conversion."""
    tools = tmp_path / "project" / "tools"
    tools.mkdir(parents=True)
    (tools / "helper.py").write_text(textwrap.dedent("""\
        import numpy as np
        import paddle

        class Rows(paddle.io.Dataset):
            def __init__(self):
                draw = np.random.RandomState(3)
                self.x = draw.rand(32, 4).astype("float32")
                self.y = self.x.sum(1, keepdims=True)

            def __getitem__(self, i):
                return self.x[i], self.y[i]

            def __len__(self):
                return 32
        """))
    (tools / "train.py").write_text(textwrap.dedent("""\
        import os
        import sys
        sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
        from tools.helper import Rows
        import paddle

        paddle.seed(0)
        loader = paddle.io.DataLoader(Rows(), batch_size=8, shuffle=False)
        model = paddle.nn.Linear(4, 1)
        opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
        for x, y in loader:
            paddle.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            opt.clear_grad()
        """))
    data = verify(tmp_path / "project", monkeypatch, tools / "train.py", steps=3)
    assert data["verdict"] == "equivalent", explain(data)
    assert data["comparison"]["data"]["split"] == 3, explain(data)
