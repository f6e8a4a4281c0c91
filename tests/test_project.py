"""A project: helper modules of a script left unchanged stay unchanged too (issue 8, defect 6)."""

from __future__ import annotations

import shutil
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


PROJECTS = Path(__file__).resolve().parent.parent / "fixtures" / "projects"
PROJECT = PROJECTS / "two_modules"
# expected outputs that wait for a change outside the CLI and the engine, which the reason names
WAITING: dict[str, str] = {}  # project name -> why it cannot convert as expected yet (a strict xfail)


def _copy(folder: Path, to: Path) -> Path:
    shutil.copytree(folder, to, ignore=shutil.ignore_patterns("__pycache__"))
    return to


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def _projects() -> list:
    return [pytest.param(folder, id=folder.name, marks=[pytest.mark.xfail(strict=True, reason=WAITING[folder.name])]
                         if folder.name in WAITING else [])
            for folder in sorted(p for p in PROJECTS.iterdir() if (p / "before").is_dir())]


@pytest.mark.parametrize("project", _projects())
def test_a_project_named_by_its_entry_script_converts_to_its_expected_files(project, tmp_path, update_fixtures):
    """``fixtures/projects/<name>/before`` -> ``after`` with only ``main.py`` named, as a user runs it; the local
    modules it reads are converted or left as they are (``pytest --update-fixtures`` rewrites ``after``)."""
    converted = _copy(project / "before", tmp_path / "p")
    main([str(converted / "main.py")])
    if update_fixtures:
        shutil.rmtree(project / "after", ignore_errors=True)
        _copy(converted, project / "after")
    assert _files(converted) == _files(project / "after")
    for name, data in _files(converted).items():
        compile(data, name, "exec")
    main([str(converted / "main.py")])  # a second run changes nothing
    assert _files(converted) == _files(project / "after")


@pytest.mark.parametrize("name, module, function", [
    ("two_modules", "data.py", "build_loaders()"), ("namespace_package", "src/data.py", "make_loaders()")])
def test_the_module_that_builds_the_training_loader_is_read_with_a_note_saying_why(name, module, function, tmp_path,
                                                                                   capsys):
    project = _copy(PROJECTS / name / "before", tmp_path / "p")
    main([str(project / "main.py")])
    out = capsys.readouterr().err
    assert (f"{project / module}:1:1: note detect-framework: read as a local module of {project / 'main.py'}, which "
            f"trains on what {function} returns: converted with it so that it is sharded") in out
    assert "dp.distributed_loader(DataLoader(" in (project / module).read_text()


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
        torch.save(model.state_dict(), root + "/model.pt")
        """)
    main([str(tmp_path / "main.py")])
    converted = (tmp_path / "main.py").read_text()
    assert 'with dp.main_process_first():\n    root = training_set("dataset")\n' in converted


def test_only_training_files_and_the_local_modules_they_import_are_parsed(tmp_path, monkeypatch):
    from dpmigrate.local import modules as local_modules

    (tmp_path / "util.py").write_text("import os\nVALUE = 1\n")  # no framework, nothing local: read, not parsed
    (tmp_path / "helpers.py").write_text("def f():\n    return 2\n")
    (tmp_path / "train.py").write_text("import torch\nimport helpers\n")
    parsed, whole = [], []
    imports, real = local_modules.import_statements, local_modules.parse
    monkeypatch.setattr(local_modules, "import_statements",
                        lambda path, source: parsed.append(Path(path).name) or imports(path, source))
    monkeypatch.setattr(local_modules, "parse", lambda path, source: whole.append(Path(path).name) or real(path, source))
    found = local_modules.scan([str(tmp_path / n) for n in ("util.py", "helpers.py", "train.py")])
    assert sorted(parsed) == ["helpers.py", "train.py"] and found.names == ("helpers",)
    assert whole == []  # (only a module that may download is parsed whole: helpers.py names no download)
