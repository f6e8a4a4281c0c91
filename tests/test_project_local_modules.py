"""Local modules, as ``dpmigrate main.py`` reads them (issue 18): a folder without ``__init__.py``, a framework
that comes only through a local module (conversion and ``dpmigrate launch``), weights downloaded by a local class's
constructor, and ``-o`` copies that carry the modules they import.

The projects are ``fixtures/projects/<name>`` (``test_project.py`` checks their conversions); the slow tests train
them with ``dpmigrate verify`` (the original on one process, the ``--batch global`` conversion on two) or run
their ``-o`` copies. This process never imports a framework: the runs are subprocesses.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from verify_cases import explain, verify

import dpmigrate.launch
from dpmigrate.cli import main
from dpmigrate.launch import cli as launch_cli

PROJECTS = Path(__file__).resolve().parent.parent / "fixtures" / "projects"


def _copy(name: str, to: Path, side: str = "before") -> Path:
    shutil.copytree(PROJECTS / name / side, to, ignore=shutil.ignore_patterns("__pycache__"))
    return to


def _write(folder: Path, **files: str) -> None:
    """``name="text"`` writes ``folder/name.py`` (``**{"src/data": ...}`` writes ``src/data.py``)."""
    for name, text in files.items():
        path = folder / f"{name}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())


# --- a helper module in a folder without __init__.py -------------------------------------------------------------


HOGWILD = """
    import torch
    import torch.multiprocessing as mp
    from src.train import train

    if __name__ == "__main__":
        model = torch.nn.Linear(2, 1)
        model.share_memory()
        workers = [mp.Process(target=train, args=(model,)) for _ in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    """

TRAIN = """
    import torch
    from torch.utils.data import DataLoader, TensorDataset


    def train(model):
        loader = DataLoader(TensorDataset(torch.ones(8, 2), torch.ones(8, 1)), batch_size=4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    """


@pytest.mark.parametrize("name", ["namespace_package", "two_modules"])
def test_a_loop_over_a_loader_a_local_module_shards_is_not_declined(tmp_path, capsys, name):
    project = _copy(name, tmp_path / "p")
    if name == "two_modules":  # `from data import build_loaders` rather than `import data`
        main_py = (project / "main.py").read_text().replace("import data\n", "from data import build_loaders\n")
        (project / "main.py").write_text(main_py.replace("data.build_loaders(", "build_loaders("))
    main([str(project / "main.py")])
    assert "declined coverage" not in capsys.readouterr().err


def test_a_helper_in_a_folder_without_init_of_a_script_left_alone_is_left_alone_with_it(tmp_path, capsys):
    _write(tmp_path, main=HOGWILD, **{"src/train": TRAIN})
    before = (tmp_path / "src" / "train.py").read_bytes()
    assert main([str(tmp_path)]) == 0
    assert (tmp_path / "src" / "train.py").read_bytes() == before
    assert f"{tmp_path / 'src' / 'train.py'}:1:1: declined detect-framework: a helper module of {tmp_path / 'main.py'}" \
        in capsys.readouterr().err


def test_a_folder_without_init_named_like_a_framework_is_not_a_local_module(tmp_path):
    from dpmigrate.local.modules import scan

    _write(tmp_path, main="import torch.nn\nimport torch\n", **{"torch/nn": "X = 1\n"})  # the installed one wins
    assert scan([str(tmp_path / "main.py")]).names == ()


@pytest.mark.slow
def test_the_namespace_package_project_trains_on_two_ranks_like_the_original(tmp_path, monkeypatch):
    project = _copy("namespace_package", tmp_path / "p")
    data = verify(tmp_path, monkeypatch, project / "main.py", "--save", str(tmp_path / "rig.pt"), steps=8)
    assert data["verdict"] == "equivalent", explain(data)
    check = data["comparison"]["data"]
    assert check["observed"] > 0 and check["split"] == check["observed"], explain(data)


# --- a framework that comes only through a local module ---------------------------------------------------------


def test_a_script_whose_framework_comes_through_a_local_module_is_converted_for_it(tmp_path, capsys):
    project = _copy("framework_through_module", tmp_path / "p")
    assert main([str(project / "main.py")]) == 1
    err = capsys.readouterr().err
    converted = (project / "main.py").read_text()
    assert "import dpmigrate.runtime.tensorflow as dp" in converted and "    dp.init()\n" in converted
    assert (f"{project / 'main.py'}:4:1: note detect-framework: imports no framework itself: TensorFlow comes through "
            "its local module setup_mod, so it is converted as a TensorFlow script") in err
    assert "imports no" not in err.replace("imports no framework itself", "")
    assert (project / "setup_mod.py").read_bytes() == (PROJECTS / "framework_through_module" / "before" /
                                                       "setup_mod.py").read_bytes()


def test_a_helper_that_trains_nothing_itself_stays_as_it_is_whatever_its_local_modules_use(tmp_path, capsys):
    _write(tmp_path, setup_mod="import tensorflow as tf\n\ndef describe(model):\n    return model.summary()\n",
           report="import setup_mod\n\nprint('report', setup_mod.describe)\n",
           main="import setup_mod\n\nmodel = setup_mod.build()\nmodel.fit(setup_mod.data())\n")
    before = (tmp_path / "report.py").read_bytes()
    main([str(tmp_path)])
    assert (tmp_path / "report.py").read_bytes() == before
    assert "report.py" not in capsys.readouterr().err
    assert "dpmigrate.runtime.tensorflow" in (tmp_path / "main.py").read_text()


def test_a_script_importing_a_framework_itself_keeps_it_whatever_its_local_modules_use(tmp_path):
    _write(tmp_path, logs="import tensorflow as tf\n\ndef write(step, value):\n    tf.summary.scalar('loss', value, step)\n",
           main="""
           import torch
           import logs

           model = torch.nn.Linear(2, 1)
           opt = torch.optim.SGD(model.parameters(), lr=0.1)
           opt.zero_grad(); model(torch.ones(4, 2)).sum().backward(); opt.step()
           logs.write(0, 1.0)
           """)
    main([str(tmp_path / "main.py")])
    assert "import dpmigrate.runtime.torch as dp" in (tmp_path / "main.py").read_text()


def test_a_script_whose_local_modules_use_two_frameworks_is_left_whole_and_says_so(tmp_path, capsys):
    _write(tmp_path, a="import torch\n", b="import paddle\n",
           main="import a\nimport b\n\nmodel = a.build()\nmodel.fit(b.data())\n")
    assert main([str(tmp_path / "main.py")]) == 0
    assert "declined detect-framework: imports paddle and torch (through a, b): a file mixing frameworks" \
        in capsys.readouterr().err


@pytest.mark.parametrize("files, expected", [
    ({"setup_mod": "import tensorflow as tf\n"}, "tensorflow"),
    ({"src/setup": "from paddle import nn\n"}, "paddle"),  # a folder without __init__.py
    ({"pkg/__init__": "from .core import build\n", "pkg/core": "import torch\n"}, "torch"),  # a package's module
    ({"setup_mod": "import helpers\n", "helpers": "import dpmigrate.runtime.torch as dp\n"}, "torch"),  # converted
])
def test_launch_finds_the_framework_a_script_trains_with_through_its_local_modules(tmp_path, files, expected):
    _write(tmp_path, **files)
    importer = {"src/setup": "from src.setup import build\n", "pkg/__init__": "import pkg\n"}
    (tmp_path / "main.py").write_text(next((v for k, v in importer.items() if k in files), "import setup_mod\n"))
    assert launch_cli.detect_framework(tmp_path / "main.py") == expected


def test_launch_names_the_local_modules_that_bring_two_frameworks(tmp_path, capsys):
    _write(tmp_path, a="import torch\n", b="import tensorflow\n", main="import a, b\n")
    assert dpmigrate.launch.main(["-n", "2", "--dry-run", str(tmp_path / "main.py")]) == 2
    assert "main.py imports tensorflow and torch (through a, b); pass --framework" in capsys.readouterr().err


def test_launch_runs_a_script_that_trains_through_its_local_module_with_that_framework(tmp_path, capsys):
    project = _copy("framework_through_module", tmp_path / "p")
    assert dpmigrate.launch.main(["-n", "2", "--dry-run", str(project / "main.py")]) == 0
    assert capsys.readouterr().out.startswith("# dpmigrate launch: tensorflow, ranks 0-1 of 2")


@pytest.mark.slow
def test_the_framework_through_module_project_trains_on_two_workers_like_the_original(tmp_path, monkeypatch):
    project = _copy("framework_through_module", tmp_path / "p")
    data = verify(tmp_path, monkeypatch, project / "main.py", steps=8)
    assert data["verdict"] == "equivalent", explain(data)
    check = data["comparison"]["data"]
    assert check["observed"] > 0 and check["split"] == check["observed"], explain(data)


# --- weights downloaded in a local class's constructor ----------------------------------------------------------


def test_a_local_class_whose_constructor_downloads_is_known_by_its_module_and_name(tmp_path):
    from dpmigrate.local.modules import scan

    _write(tmp_path, nets="""
        import numpy as np
        import torch
        import torchvision.models as zoo


        class Plain(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.scale = np.average([1.0, 2.0], weights=[1, 3])  # `weights=`, but not a model zoo's


        class Backbone(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.body = self._pretrained()

            def _pretrained(self):
                return zoo.resnet18(weights="DEFAULT")


        class Head(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.trunk = Backbone()
        """, main="import torch\nimport nets\n")
    assert scan([str(tmp_path / "main.py")]).downloading == ("nets.Backbone", "nets.Head")


def test_a_local_class_whose_constructor_downloads_is_built_on_the_main_process_first(tmp_path, capsys):
    project = _copy("pretrained_in_constructor", tmp_path / "p")
    main([str(project / "main.py")])
    assert "    with dp.main_process_first():\n        net = LeafNet()\n" in (project / "main.py").read_text()
    assert "change download-main-process-first: LeafNet(...), which downloads in its own module, runs under " \
           "dp.main_process_first()" in capsys.readouterr().err


# --- -o copies carry the local modules they import --------------------------------------------------------------


def test_copies_of_a_script_carry_the_local_modules_it_imports_unchanged(tmp_path, capsys):
    project = _copy("unchanged_modules", tmp_path / "p")
    os.chmod(project / "Scaling.py", 0o640)
    out = tmp_path / "out"
    assert main(["-o", str(out), str(project / "main.py")]) == 1
    for name in ("SquaresDataset.py", "Scaling.py"):  # Scaling.py is imported by SquaresDataset.py, not by main.py
        assert (out / name).read_bytes() == (project / name).read_bytes(), name
    assert (out / "main.py").read_bytes() == (PROJECTS / "unchanged_modules" / "after" / "main.py").read_bytes()
    assert (out / "Scaling.py").stat().st_mode & 0o777 == 0o640
    err = capsys.readouterr().err
    assert (f"Copying {project / 'Scaling.py'} -> {out / 'Scaling.py'} (unchanged: a local module of "
            f"{project / 'main.py'})") in err
    assert "1 file, 1 changed" in err  # the copies are not files the run converted


@pytest.mark.parametrize("name, module", [("two_modules", "data.py"), ("namespace_package", "src/data.py")])
def test_a_local_module_the_conversion_changed_is_copied_converted(tmp_path, name, module):
    project = _copy(name, tmp_path / "p")
    main(["-o", str(tmp_path / "out"), str(project / "main.py")])
    assert (tmp_path / "out" / module).read_bytes() == (PROJECTS / name / "after" / module).read_bytes()
    assert (project / module).read_bytes() == (PROJECTS / name / "before" / module).read_bytes()


def test_a_module_copy_is_never_written_through_a_link_in_the_output_folder(tmp_path, capsys):
    _write(tmp_path / "p", main="import torch\nfrom src.data import rows\n\nprint(torch.tensor(rows()))\n",
           **{"src/data": "def rows():\n    return [1, 2]\n"})
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "src").symlink_to(elsewhere)
    assert main(["-o", str(tmp_path / "out"), str(tmp_path / "p" / "main.py")]) == 2
    assert list(elsewhere.iterdir()) == []
    assert f"{tmp_path / 'p' / 'src' / 'data.py'}: " in capsys.readouterr().err
    assert (tmp_path / "out" / "main.py").exists()


def test_a_local_module_that_is_a_file_of_the_run_is_written_once_as_converted(tmp_path):
    project = _copy("unchanged_modules", tmp_path / "p")
    (project / "Scaling.py").write_text("import torch\n\nCENTRE = 1.0\n\n\ndef centred(values):\n"
                                        "    torch.save(values, 'centred.pt')\n    return values - CENTRE\n")
    main(["-o", str(tmp_path / "out"), str(project / "main.py"), str(project / "Scaling.py")])
    assert "dp.save(values, 'centred.pt')" in (tmp_path / "out" / "Scaling.py").read_text()


@pytest.mark.slow
def test_the_copy_of_a_script_runs_from_its_folder_alone_unlaunched_and_on_two_ranks(tmp_path):
    project = _copy("unchanged_modules", tmp_path / "p")
    out = tmp_path / "out"
    main(["-o", str(out), "--batch", "global", str(project / "main.py")])
    shutil.rmtree(project)  # nothing of the original project left to import from
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PYTHONPATH")}
    for argv in ([sys.executable, "main.py"],
                 [sys.executable, "-m", "dpmigrate.launch", "-n", "2", "--timeout", "120", "--log-dir",
                  str(tmp_path / "logs"), "main.py", "--save", "launched.pt"]):
        done = subprocess.run(argv, cwd=out, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (out / "squares.pt").exists() and (out / "launched.pt").exists()


# --- a helper module a converted script imports -----------------------------------------------------------------


def test_a_helper_module_that_saves_is_converted_with_the_script_and_a_module_of_models_is_left_alone(tmp_path, capsys):
    project = _copy("checkpoint_helper", tmp_path / "p")
    nets = (project / "nets.py").read_bytes()
    assert main([str(project / "main.py")]) == 1
    err = capsys.readouterr().err
    assert (f"{project / 'stopping.py'}:1:1: note detect-framework: read as a local module of {project / 'main.py'}, "
            "which imports it: converted with it, as the changes below say") in err
    assert f"{project / 'stopping.py'}:14:13: change distributed-save: torch.save -> dp.save" in err
    assert "            dp.save(model.state_dict(), self.path)\n" in (project / "stopping.py").read_text()
    assert (project / "nets.py").read_bytes() == nets and "nets.py" not in err
    assert main([str(project / "main.py")]) == 0  # a second run changes nothing, in either file


def test_a_helper_of_a_script_that_is_left_alone_is_not_converted(tmp_path, capsys):
    _write(tmp_path, main="import torch.multiprocessing as mp\nimport torch\nfrom ckpt import keep\n\n"
                          "def train(rank):\n    m = torch.nn.Linear(2, 1)\n    o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                          "    m(torch.ones(1, 2)).sum().backward()\n    o.step()\n    keep(m)\n\n"
                          "if __name__ == '__main__':\n    mp.spawn(train, nprocs=2)\n",
           ckpt="import torch\n\ndef keep(m):\n    torch.save(m.state_dict(), 'm.pt')\n")
    before = (tmp_path / "ckpt.py").read_bytes()
    main([str(tmp_path / "main.py")])
    assert (tmp_path / "ckpt.py").read_bytes() == before
    assert "ckpt.py" not in capsys.readouterr().err


@pytest.mark.slow
def test_the_checkpoint_helper_project_trains_on_two_ranks_like_the_original(tmp_path, monkeypatch):
    project = _copy("checkpoint_helper", tmp_path / "p")
    data = verify(tmp_path, monkeypatch, project / "main.py", "--save", str(tmp_path / "best.pt"), steps="all")
    assert data["verdict"] == "equivalent", explain(data)
    check = data["comparison"]["data"]
    assert check["observed"] > 0 and check["split"] == check["observed"], explain(data)


def test_a_data_set_drawn_in_a_helper_module_is_shared_unless_the_script_seeds_it_first(tmp_path, capsys):
    project = _copy("random_dataset_module", tmp_path / "p")
    main([str(project / "main.py")])
    assert "        self.pairs = dp.broadcast([(torch.rand(5), torch.rand(1)) for _ in range(count)])\n" in \
        (project / "synth.py").read_text()
    assert f"{project / 'synth.py'}:9:24: change shared-random-data" in capsys.readouterr().err
    seeded = _copy("random_dataset_module", tmp_path / "s")
    script = seeded / "main.py"
    seed = ("    loader = DataLoader(", "    torch.manual_seed(0)\n    loader = DataLoader(")
    script.write_text(script.read_text().replace(*seed))
    synth = (seeded / "synth.py").read_bytes()
    main([str(script)])
    assert (seeded / "synth.py").read_bytes() == synth  # every rank draws the same after the seed: nothing to share
    assert "synth.py" not in capsys.readouterr().err


@pytest.mark.slow
def test_the_random_dataset_module_project_trains_on_two_ranks_like_the_original(tmp_path, monkeypatch):
    project = _copy("random_dataset_module", tmp_path / "p")
    data = verify(tmp_path, monkeypatch, project / "main.py", "--save", str(tmp_path / "j.pt"), steps="all")
    assert data["verdict"] == "equivalent", explain(data)  # before: inputs-differ (each rank drew its own data set)
    check = data["comparison"]["data"]
    assert check["observed"] > 0 and check["split"] == check["observed"], explain(data)
