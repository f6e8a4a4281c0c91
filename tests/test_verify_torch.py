"""``dpmigrate verify`` on torch scripts: the original on one real process, the conversion on two under
``dpmigrate launch``, compared step by step.

A right conversion is equivalent with the split of the data proven; conversions broken by hand are each
caught with their cause: a model left unwrapped (the ranks disagree), a loader left whole (the weights
match, but every rank read the same samples), a summed loss (each step moves 1/N as far), batch
normalisation over each rank's share. Runs that cannot be compared say why, with exit code 2.

The verify process never imports torch: the runs are subprocesses.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from fixture_cases import FIXTURES, run

from dpmigrate.codemod.engine import convert
from dpmigrate.findings import Options
from dpmigrate.verify.cli import main

CASE = FIXTURES / "torch" / "synthetic_mnist"


def _verify(tmp_path, monkeypatch, script, *script_args, against=None, steps=3, nproc=2):
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "verify.json"
    argv = [str(script), "-n", str(nproc), "--steps", str(steps), "--timeout", "240", "--to-end", "0", "--report",
            "json", "--report-file", str(report)]
    if against is not None:
        argv += ["--against", str(against)]
    code = main([*argv, "--", *script_args])
    data = json.loads(report.read_text())
    assert data["exit_code"] == code, data
    return data


def _causes(data) -> list[str]:
    return [c["kind"] for c in data["comparison"]["causes"]]


def _converted(tmp_path, edit=None) -> Path:
    text = run(CASE, batch="global").output.decode()
    if edit:
        for old, new in edit:
            assert old in text, old
            text = text.replace(old, new)
    path = tmp_path / "converted" / "train.py"
    path.parent.mkdir()
    path.write_text(text)
    return path


def _original(tmp_path) -> Path:
    path = tmp_path / "train.py"
    path.write_bytes((CASE / "before.py").read_bytes())
    return path


@pytest.mark.slow
def test_a_right_conversion_is_equivalent_with_the_data_split_proven(tmp_path, monkeypatch):
    script = _original(tmp_path)
    data = _verify(tmp_path, monkeypatch, script, "--batch-size", "32", "--save", "model.pt")
    assert data["verdict"] == "equivalent", data
    comparison = data["comparison"]
    assert comparison["max_difference"] < 1e-5
    assert comparison["steps"] == 3 and comparison["converted_steps"] == [3, 3]
    assert comparison["data"]["observed"] == comparison["data"]["split"] == 3
    assert comparison["data"]["sizes"] == [32, [16, 16]]
    assert "changes" in data["conversion"]
    # the user's script is untouched and nothing was written beside it (the runs have scratch folders)
    assert script.read_bytes() == (CASE / "before.py").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py", "verify.json"]


@pytest.mark.slow
def test_a_model_left_unwrapped_is_caught_as_unsynchronised(tmp_path, monkeypatch):
    broken = _converted(tmp_path, edit=[
        ("    reader = dp.distributed_model(reader)\n", ""),
        ("dp.distributed_optimizer(torch.optim.SGD(reader.parameters(), lr=args.lr))",
         "torch.optim.SGD(reader.parameters(), lr=args.lr)"),
    ])
    data = _verify(tmp_path, monkeypatch, _original(tmp_path), "--batch-size", "32", against=broken)
    assert data["verdict"] == "diverges"
    assert "unsynchronised" in _causes(data)
    assert data["comparison"]["ranks_disagree"]["step"] == 1
    assert data["comparison"]["data"]["split"] == 3  # the data was split: the model was the problem


@pytest.mark.slow
def test_a_loader_left_whole_is_caught_although_the_weights_match(tmp_path, monkeypatch):
    broken = _converted(tmp_path, edit=[(
        "dp.distributed_loader(DataLoader(displays(640, seed=100), batch_size=dp.per_rank_batch_size(args.batch_size), "
        "**extras))", "DataLoader(displays(640, seed=100), batch_size=args.batch_size, **extras)")])
    data = _verify(tmp_path, monkeypatch, _original(tmp_path), "--batch-size", "32", against=broken)
    assert data["verdict"] == "diverges"
    assert data["comparison"]["max_difference"] < 1e-6  # the blind spot of a weights-only comparison
    assert _causes(data) == ["not-sharded"]
    assert data["comparison"]["data"]["same"] == [1, 2, 3]


SUMMED_LOSS = '''
    """A linear fit whose loss is summed over the batch, not averaged."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    x = torch.randn(256, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    loader = DataLoader(TensorDataset(x, y), batch_size=32)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.001)
    for epoch in range(2):
        for xb, yb in loader:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb), yb, reduction="sum")
            loss.backward()
            opt.step()
'''

BATCHNORM = '''
    """A classifier with batch normalisation: its statistics are per rank once converted."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    x = torch.randn(256, 6)
    y = (x.sum(1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=32)


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.hidden, self.norm, self.out = nn.Linear(6, 8), nn.BatchNorm1d(8), nn.Linear(8, 2)

        def forward(self, x):
            return self.out(torch.relu(self.norm(self.hidden(x))))


    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for xb, yb in loader:
        opt.zero_grad()
        nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
'''


def _script(tmp_path, body, name="train.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body).lstrip())
    return path


@pytest.mark.slow
def test_a_summed_loss_left_as_it_is_is_caught_as_a_one_over_n_update(tmp_path, monkeypatch):
    script = _script(tmp_path, SUMMED_LOSS)
    unscaled = convert(script.read_bytes(), "train.py", Options(batch="global", ignore=("summed-loss",))).output
    (tmp_path / "unscaled.py").write_bytes(unscaled)
    data = _verify(tmp_path, monkeypatch, script, steps=2, against=tmp_path / "unscaled.py")
    assert data["verdict"] == "diverges"
    assert _causes(data) == ["scaled-update"]
    assert "1/N" in data["comparison"]["causes"][0]["message"]
    assert data["comparison"]["first"]["step"] == 1


@pytest.mark.slow
def test_a_summed_loss_converted_keeps_the_original_step(tmp_path, monkeypatch):
    data = _verify(tmp_path, monkeypatch, _script(tmp_path, SUMMED_LOSS), steps=3)
    assert data["verdict"] == "equivalent", data["headline"]
    assert data["comparison"]["data"]["split"] == 3


@pytest.mark.slow
def test_batch_normalisation_is_named_with_its_layer(tmp_path, monkeypatch):
    data = _verify(tmp_path, monkeypatch, _script(tmp_path, BATCHNORM), steps=2)
    assert data["verdict"] == "diverges"
    assert _causes(data) == ["batchnorm"]
    assert "batch normalisation (norm)" in data["comparison"]["causes"][0]["message"]


@pytest.mark.slow
def test_the_text_report_fits_one_screen(tmp_path, monkeypatch, capsys):
    script = _original(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert main([str(script), "--steps", "2", "--to-end", "0", "--", "--batch-size", "32"]) == 0
    text = capsys.readouterr().err
    assert "equivalent: max |dw|" in text
    assert "each step's 32 samples split 16 + 16 over the ranks, disjoint (2 of 2 steps, loader batches)" in text
    assert len(text.splitlines()) <= 8


def test_an_original_that_fails_cannot_be_compared(tmp_path, monkeypatch):
    script = _script(tmp_path, '''
        import sys
        print("reading /data/imagenet")
        sys.exit("no such folder: /data/imagenet")
        import torch
    ''')
    data = _verify(tmp_path, monkeypatch, script)
    assert data["exit_code"] == 2 and data["verdict"] == "error"
    assert data["headline"] == "could not run: the original failed (exit code 1)"
    assert "no such folder: /data/imagenet" in data["details"][-1]


def test_a_missing_script_cannot_be_compared(tmp_path, monkeypatch):
    data = _verify(tmp_path, monkeypatch, tmp_path / "nowhere.py")
    assert data["exit_code"] == 2
    assert "no such script" in data["headline"]


@pytest.mark.slow
def test_a_script_without_an_optimizer_step_is_inconclusive(tmp_path, monkeypatch):
    script = _script(tmp_path, '''
        import torch
        print(torch.nn.Linear(2, 2)(torch.ones(1, 2)).sum().item())
    ''')
    data = _verify(tmp_path, monkeypatch, script)
    assert data["exit_code"] == 3 and data["verdict"] == "inconclusive"
    assert "no optimizer step seen in the original" in data["headline"]


@pytest.mark.slow
def test_a_conversion_that_fails_on_two_processes_diverges(tmp_path, monkeypatch):
    script = _script(tmp_path, SUMMED_LOSS)
    broken = _script(tmp_path, SUMMED_LOSS.replace('    import torch\n', '    import os, torch\n    if os.environ.get('
                                                    '"RANK") == "1":\n        raise SystemExit("rank 1 gives up")\n'),
                     name="broken.py")
    data = _verify(tmp_path, monkeypatch, script, against=broken, steps=2)
    assert data["exit_code"] == 1
    assert "the conversion on 2 processes failed" in data["headline"]
    assert any("rank 1 gives up" in line for line in data["details"])


@pytest.mark.slow
def test_training_in_processes_the_script_starts_is_said_not_followed(tmp_path, monkeypatch):
    script = _script(tmp_path, '''
        import torch
        import torch.multiprocessing as mp

        def work(shared):
            opt = torch.optim.SGD(shared.parameters(), lr=0.1)
            for _ in range(3):
                opt.zero_grad()
                shared(torch.ones(4, 2)).sum().backward()
                opt.step()

        if __name__ == "__main__":
            model = torch.nn.Linear(2, 1)
            model.share_memory()
            worker = mp.get_context("spawn").Process(target=work, args=(model,))
            worker.start()
            worker.join()
    ''')
    data = _verify(tmp_path, monkeypatch, script)  # the converter leaves it as it is: no conversion to check
    assert data["verdict"] == "nothing to verify" and "starts its own processes" in data["headline"], data["headline"]
    data = _verify(tmp_path, monkeypatch, script, against=script)  # checked as given: verify cannot follow it
    assert data["exit_code"] == 2
    assert "processes it starts itself" in data["headline"]


def test_verify_loads_no_framework():
    import subprocess

    code = ("import sys, dpmigrate.verify, dpmigrate.verify.cli, dpmigrate.verify.compare, dpmigrate.verify.runs; "
            "print(sorted({'torch', 'tensorflow', 'paddle', 'numpy'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.slow
def test_a_script_finding_its_project_root_two_folders_up_runs_in_verifys_copy(tmp_path, monkeypatch):
    """Round I (a steel-defect classifier's ``src/cls``): ``ROOT = Path(__file__).resolve().parents[2]`` then
    ``ROOT / "data"``. The copy sat one folder deep, so ROOT was verify's scratch folder, the data was missing and
    verify blamed the conversion; the copy now mirrors the folders the script reaches."""
    project = tmp_path / "project"
    (project / "src" / "app").mkdir(parents=True)
    (project / "data").mkdir()
    (project / "data" / "rows.txt").write_text("\n".join(f"{i / 32:.4f}" for i in range(32)))
    (project / "src" / "app" / "train.py").write_text(textwrap.dedent("""\
        from pathlib import Path
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        ROOT = Path(__file__).resolve().parents[2]
        values = torch.tensor([float(v) for v in (ROOT / "data" / "rows.txt").read_text().split()])
        loader = DataLoader(TensorDataset(values.unsqueeze(1), 2 * values.unsqueeze(1)), batch_size=8)
        torch.manual_seed(0)
        model = torch.nn.Linear(1, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
        """))
    monkeypatch.chdir(project)
    data = _verify(project, monkeypatch, Path("src/app/train.py"), steps=3)
    assert data["verdict"] == "equivalent", data


def test_the_folders_a_script_reaches_from_its_own_path_are_counted(tmp_path):
    from dpmigrate.verify.runs import MAX_LEVELS, levels_above

    for line, levels in [("ROOT = Path(__file__).resolve().parents[2]", 2), ("here = Path(__file__).parent", 1),
                         ("up = Path(__file__).parent.parent.parent", 2),
                         ("root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))", 2),
                         ("far = Path(__file__).parents[9]", MAX_LEVELS), ("name = 'parents[3]'", 1)]:
        folder = tmp_path / str(levels) / line[:4].strip()
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "helper.py").write_text(line + "\n")
        assert levels_above(folder) == levels, line
