"""A project: helper modules of a script left unchanged stay unchanged too (issue 8, defect 6)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from dpmigrate.cli import main

HOGWILD_MAIN = """
import torch
import torch.multiprocessing as mp
from train import train


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(2, 1)

    def forward(self, x):
        return self.fc(x)


if __name__ == "__main__":
    model = Net()
    model.share_memory()
    workers = [mp.Process(target=train, args=(r, model)) for r in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
"""

TRAIN_MODULE = """
import torch
from torch.utils.data import DataLoader, TensorDataset

from data import make_data


def train(rank, model):
    loader = DataLoader(make_data(), batch_size=8, shuffle=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    print("worker", rank, "done")
"""

DATA_MODULE = """
import torch
from torch.utils.data import TensorDataset


def make_data():
    loader = torch.utils.data.DataLoader(TensorDataset(torch.ones(8, 2), torch.ones(8, 1)), batch_size=4)
    print("made", len(loader))
    return loader.dataset
"""


def _project(folder: Path, **files: str) -> dict[str, bytes]:
    written = {}
    for name, text in files.items():
        data = textwrap.dedent(text).lstrip().encode()
        (folder / f"{name}.py").write_bytes(data)
        written[name] = data
    return written


def test_the_helpers_of_a_script_left_alone_are_left_alone_with_it(tmp_path, capsys):
    before = _project(tmp_path, main=HOGWILD_MAIN, train=TRAIN_MODULE, data=DATA_MODULE)
    code = main([str(tmp_path)])
    captured = capsys.readouterr()
    out = captured.out + captured.err
    for name, data in before.items():
        assert (tmp_path / f"{name}.py").read_bytes() == data, name
    assert code == 0  # nothing was rewritten
    assert f"{tmp_path / 'train.py'}:1:1: declined detect-framework: a helper module of {tmp_path / 'main.py'}" in out
    assert f"{tmp_path / 'data.py'}:1:1: declined detect-framework: a helper module of {tmp_path / 'main.py'}" in out


def test_a_training_module_alone_is_converted_without_init_at_import(tmp_path, capsys):
    _project(tmp_path, train=TRAIN_MODULE, data=DATA_MODULE)
    main([str(tmp_path / "train.py")])
    converted = (tmp_path / "train.py").read_text()
    assert "dp.distributed_loader(" in converted and "dp.print(" in converted
    assert "dp.init()" not in converted  # importing a module of functions must not join a job
