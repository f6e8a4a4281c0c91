"""Issue 19, audit round I: shapes of real Paddle scripts the conversion got wrong, each as our own script.

- a steel-defect classifier kept its log in ``log_path.open("w")`` and wrote its history with pathlib
  (``path.write_text(json.dumps(...))``, ``with path.open("a") as f:`` in a helper module): only the builtin
  ``open`` was run on the main process, so both ranks truncated and wrote the same log and the CSV got every row
  twice. (The plateau scheduler, the hash seed and the unused ``paddle.Model`` of this round have their own tests:
  ``test_plateau_metric.py``, ``test_hash_seed.py``, fixture ``paddle/unused_hapi_model``.)
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
