"""``dpmigrate verify --to-end``: past the K compared steps, both runs go on to their end (or a time bound), so a
conversion that trains alike for K steps and then breaks is not "equivalent" (issue 32, blind spot 6: a crash at a
reload after the first fit read "equivalent" at 3 steps), and a script that ends itself with ``os._exit`` right
after training still leaves its record (it read "never imported tensorflow")."""

from __future__ import annotations

import json
import textwrap

import pytest

from dpmigrate.verify import ending
from dpmigrate.verify.cli import main

TRAIN_THEN_RELOAD = '''
    """Trains two epochs, saves, then reloads the checkpoint on every process."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    x = torch.randn(128, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        for xb, yb in DataLoader(TensorDataset(x, y), batch_size=32):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(xb), yb).backward()
            opt.step()
    torch.save(model.state_dict(), "model.pt")
    model.load_state_dict(torch.load("model.pt"))
    print("done")
'''

# the conversion dpmigrate makes of it, broken after training: rank 1 gives up where the original goes on
BROKEN_LATE = '''
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    import dpmigrate.runtime.torch as dp

    dp.init()
    torch.manual_seed(0)
    x = torch.randn(128, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    model = torch.nn.Linear(4, 1)
    model = dp.distributed_model(model)
    opt = dp.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))
    for epoch in range(2):
        for xb, yb in dp.distributed_loader(DataLoader(TensorDataset(x, y), batch_size=16)):
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(xb), yb).backward()
            opt.step()
    if dp.rank() == 1:
        raise RuntimeError("rank 1 gives up after training")
    dp.print("done")
'''

ENDS_ITSELF = '''
    """Trains, then ends itself with os._exit (no atexit handlers run)."""
    import os
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = x.sum(1, keepdim=True)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for xb, yb in DataLoader(TensorDataset(x, y), batch_size=16):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
    os._exit(0)
'''


def _write(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(textwrap.dedent(body).lstrip())
    return path


def _verify(tmp_path, monkeypatch, script, *extra):
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "verify.json"
    code = main([str(script), "--timeout", "240", "--report", "json", "--report-file", str(report), *extra])
    data = json.loads(report.read_text())
    assert data["exit_code"] == code, data
    return data


@pytest.mark.slow
def test_a_conversion_that_breaks_after_step_k_diverges(tmp_path, monkeypatch):
    script = _write(tmp_path, "train.py", TRAIN_THEN_RELOAD)
    broken = _write(tmp_path, "broken.py", BROKEN_LATE)
    data = _verify(tmp_path, monkeypatch, script, "--against", str(broken))
    assert data["verdict"] == "diverges", data["headline"]
    assert data["headline"].startswith("diverges: the conversion failed (exit code 1) after step 3, where the "
                                       "original ran to its end (8 steps)"), data["headline"]
    assert data["comparison"]["max_difference"] < 1e-5  # alike up to step K: the end is what broke
    assert any("rank 1 gives up after training" in line for line in data["details"])


@pytest.mark.slow
def test_a_right_conversion_runs_to_its_end_and_stays_equivalent(tmp_path, monkeypatch):
    data = _verify(tmp_path, monkeypatch, _write(tmp_path, "train.py", TRAIN_THEN_RELOAD))
    assert data["verdict"] == "equivalent", data["headline"]
    assert data["ending"] == ["the original ran to its end, 8 steps in all; the conversion ran to its end, 8 steps "
                              "in all"]


@pytest.mark.slow
def test_to_end_0_stops_both_runs_at_step_k(tmp_path, monkeypatch):
    script = _write(tmp_path, "train.py", TRAIN_THEN_RELOAD)
    data = _verify(tmp_path, monkeypatch, script, "--against", str(_write(tmp_path, "broken.py", BROKEN_LATE)),
                   "--to-end", "0")
    assert data["verdict"] == "equivalent" and data["ending"] == [], data["headline"]  # what K steps alone can see


@pytest.mark.slow
def test_a_script_ending_itself_with_os_exit_leaves_its_record(tmp_path, monkeypatch):
    data = _verify(tmp_path, monkeypatch, _write(tmp_path, "train.py", ENDS_ITSELF), "--steps", "4")
    assert data["verdict"] == "equivalent", data["headline"]
    assert data["ending"] == ["the original ended itself (os._exit(0)), 4 steps in all; the conversion ended itself "
                              "(os._exit(0)), 4 steps in all"]


def _ends(folder, *ends):
    for rank, (how, steps, *seconds) in enumerate(ends):
        (folder / f"rank{rank}").mkdir(parents=True)
        (folder / f"rank{rank}" / "end.json").write_text(json.dumps({"ended": how, "steps": steps,
                                                                      "seconds": seconds[0] if seconds else None}))
    return folder


def test_a_rank_that_made_every_step_but_never_ended_is_a_hang(tmp_path):
    single = _ends(tmp_path / "single", ("exit", 40, 4.0))
    job = _ends(tmp_path / "job", ("bound", 40), ("exit", 40))
    judged = ending.judge(3, 30, single, job, 2, 0, 0)
    assert judged.failure.startswith("rank 0 of the conversion made all the original's 40 steps but did not end "
                                     "within 30 s after step 3"), judged.failure
    assert judged.lines == ["the original ran to its end, 40 steps in all; the conversion ran to its end on some ranks, "
                            "and was stopped at the 30 s bound on rank 0, 40 steps in all"]


def test_ranks_stalled_at_step_k_while_the_original_went_on_are_a_hang(tmp_path):
    single = _ends(tmp_path / "single", ("bound", 30))
    job = _ends(tmp_path / "job", ("bound", 3), ("bound", 3))
    judged = ending.judge(3, 60, single, job, 2, 0, 0)
    assert judged.failure.startswith("every rank of the conversion made no optimizer step in the 60 s after step 3, "
                                     "where the original made 27"), judged.failure


def test_a_slower_conversion_stopped_at_the_bound_is_no_failure(tmp_path):
    single = _ends(tmp_path / "single", ("bound", 30))
    job = _ends(tmp_path / "job", ("bound", 20), ("bound", 20))
    judged = ending.judge(3, 60, single, job, 2, 0, 0)
    assert judged.failure == ""
    assert judged.lines == ["the original ran 60 s past step 3 without failing (the --to-end bound), 30 steps in all; "
                            "the conversion ran 60 s past step 3 without failing (the --to-end bound), 20 steps in all"]


def test_an_original_that_fails_late_itself_leaves_the_conversion_unjudged(tmp_path):
    single = _ends(tmp_path / "single", ("exit", 10))
    job = _ends(tmp_path / "job", ("exit", 10), ("exit", 10))
    judged = ending.judge(3, 60, single, job, 2, 1, 1)
    assert judged.failure == ""
    assert judged.lines[-1] == "the original itself fails after step K: the end of the conversion is not compared"


def test_a_rank_still_ending_when_the_original_took_most_of_the_bound_is_no_hang(tmp_path):
    # the original took 15 s past step K to end (a final evaluation): 2 ranks on shared cores may well take over 20
    single = _ends(tmp_path / "single", ("exit", 80, 15.0))
    job = _ends(tmp_path / "job", ("exit", 80), ("bound", 80))
    judged = ending.judge(3, 20, single, job, 2, 0, 0)
    assert judged.failure == "", judged.failure
