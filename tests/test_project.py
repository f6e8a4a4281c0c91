"""A project: helper modules of a script left unchanged stay unchanged too (issue 8, defect 6)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

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


PROJECT = Path(__file__).resolve().parent.parent / "fixtures" / "projects" / "two_modules"


def _copy(folder: Path, to: Path) -> Path:
    to.mkdir()
    for path in folder.glob("*.py"):
        (to / path.name).write_bytes(path.read_bytes())
    return to


def test_a_script_converts_the_local_module_that_builds_its_training_loader(tmp_path, capsys):
    project = _copy(PROJECT / "before", tmp_path / "p")
    main([str(project / "main.py")])
    captured = capsys.readouterr()
    for name in ("main.py", "data.py"):
        assert (project / name).read_bytes() == (PROJECT / "after" / name).read_bytes(), name
        compile((project / name).read_bytes(), name, "exec")
    assert f"{project / 'data.py'}:1:1: note detect-framework: read as a local module of {project / 'main.py'}" \
        in captured.out + captured.err
    main([str(project / "main.py")])  # a second run changes nothing
    for name in ("main.py", "data.py"):
        assert (project / name).read_bytes() == (PROJECT / "after" / name).read_bytes(), name


@pytest.mark.slow
def test_the_converted_two_module_project_trains_like_the_original_on_two_ranks(tmp_path):
    from test_fixtures_execute import _assert_same_parameters, _python

    original = _copy(PROJECT / "before", tmp_path / "original")
    converted = _copy(PROJECT / "before", tmp_path / "converted")
    assert main(["--batch", "global", str(converted / "main.py")]) == 1
    _python(["main.py", "--batch-size", "32", "--save", str(tmp_path / "a.pt")], original)
    _python(["-m", "dpmigrate.launch", "-n", "2", "--log-dir", str(tmp_path / "logs"), "--timeout", "120",
             "main.py", "--batch-size", "32", "--save", str(tmp_path / "b.pt")], converted)
    _assert_same_parameters(tmp_path / "a.pt", tmp_path / "b.pt")
    unlaunched = _copy(PROJECT / "after", tmp_path / "unlaunched")
    _python(["main.py", "--batch-size", "32", "--save", str(tmp_path / "c.pt")], unlaunched)
    _assert_same_parameters(tmp_path / "a.pt", tmp_path / "c.pt")


def test_a_call_to_a_local_function_that_downloads_runs_on_the_main_process_first(tmp_path, capsys):
    _project(tmp_path, data="""
        import os
        import urllib.request


        def fetch(folder):
            if not os.path.exists(folder):
                os.makedirs(folder)
                urllib.request.urlretrieve("https://example.com/set.tgz", os.path.join(folder, "set.tgz"))
            return folder


        def training_set(folder):
            return fetch(folder)
        """, main="""
        import torch
        from data import training_set

        root = training_set("dataset")
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        opt.zero_grad(); model(torch.ones(4, 2)).sum().backward(); opt.step()
        """)
    main([str(tmp_path / "main.py")])
    converted = (tmp_path / "main.py").read_text()
    assert 'with dp.main_process_first():\n    root = training_set("dataset")\n' in converted


def test_only_files_that_may_use_a_framework_are_read_for_local_imports(tmp_path, monkeypatch):
    from dpmigrate import project

    (tmp_path / "util.py").write_text("import helpers\nVALUE = 1\n")
    (tmp_path / "helpers.py").write_text("def f():\n    return 2\n")
    (tmp_path / "train.py").write_text("import torch\nimport helpers\n")
    read = []
    real = project.local_imports
    monkeypatch.setattr(project, "local_imports", lambda path, source: read.append(Path(path).name) or real(path, source))
    names = project.local_module_names([str(tmp_path / n) for n in ("util.py", "helpers.py", "train.py")])
    assert read == ["train.py"] and names == ("helpers",)
