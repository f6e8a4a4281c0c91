"""The command line on hostile or unlucky input: a FIFO, links in -o's folder, -o onto the sources,
a notebook, a file edited during its conversion, a temporary left by a killed run.

Each case is a bug report: the run used to hang, write through a link, overwrite a read-only source,
say "0 changed" about a notebook, or overwrite the user's edit. Expectations are literal.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_samples import CONVERTED_SCRIPT, POLICY, TORCH_SCRIPT

import dpmigrate.codemod.engine as engine
from dpmigrate.cli import main


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def run_cli(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """The real command in a real process: a hang fails the test (TimeoutExpired) instead of hanging it."""
    return subprocess.run([sys.executable, "-m", "dpmigrate", *args], cwd=cwd, capture_output=True,
                          timeout=timeout, check=False)


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith(".dpmigrate-tmp"))


# --- 1. a FIFO, or any file that is not a regular one --------------------------------------------

@pytest.mark.parametrize("mode", [[], ["--check"], ["--diff"], ["-o", "out"]], ids=["write", "check", "diff", "copy"])
def test_a_fifo_named_on_the_command_line_is_refused_with_exit_2(tmp_path, mode):
    os.mkfifo(tmp_path / "train.py")
    write(tmp_path / "other.py", TORCH_SCRIPT)
    proc = run_cli([*mode, "other.py", "train.py"], tmp_path, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.decode().splitlines() == [
        "dpmigrate: error: train.py: is a named pipe (FIFO), not a regular file; dpmigrate converts files and "
        "folders only (nothing was converted)"]
    assert (tmp_path / "other.py").read_bytes() == TORCH_SCRIPT
    assert stat.S_ISFIFO(os.lstat(tmp_path / "train.py").st_mode)
    assert not (tmp_path / "out").exists()


def test_a_device_named_on_the_command_line_is_refused_with_exit_2(tmp_path):
    proc = run_cli(["--check", "/dev/zero"], tmp_path, timeout=60)  # would be read forever
    assert proc.returncode == 2
    assert "dpmigrate: error: /dev/zero: is a character device, not a regular file" in proc.stderr.decode()


def test_a_fifo_found_in_a_folder_is_skipped_like_any_non_python_file(tmp_path):
    # Decision: a folder walk converts regular *.py files only; a FIFO named *.py is skipped silently.
    write(tmp_path / "src" / "train.py", TORCH_SCRIPT)
    os.mkfifo(tmp_path / "src" / "pipe.py")
    proc = run_cli(["src"], tmp_path, timeout=60)
    assert proc.returncode == 1
    assert (tmp_path / "src" / "train.py").read_bytes() == CONVERTED_SCRIPT
    assert "pipe.py" not in proc.stderr.decode()
    assert proc.stderr.decode().splitlines()[-1] == "1 file, 1 changed, 7 changes, 0 declined, 0 errors" + POLICY


# --- 2. -o OUT: links planted in OUT, and OUT being the sources' own folder ------------------------

def test_a_link_planted_in_the_output_folder_is_replaced_not_written_through(tmp_path, capsys):
    write(tmp_path / "src" / "train.py", TORCH_SCRIPT)
    victim = write(tmp_path / "elsewhere" / "victim.py", b"precious = 1\n")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "train.py").symlink_to(victim)
    assert main(["-o", str(tmp_path / "out"), str(tmp_path / "src")]) == 1
    assert victim.read_bytes() == b"precious = 1\n"
    copy = tmp_path / "out" / "train.py"
    assert not copy.is_symlink() and copy.read_bytes() == CONVERTED_SCRIPT
    assert leftovers(tmp_path) == []


def test_a_linked_folder_inside_the_output_folder_is_refused(tmp_path, capsys):
    write(tmp_path / "src" / "sub" / "train.py", TORCH_SCRIPT)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "sub").symlink_to(tmp_path / "elsewhere")
    assert main(["-o", str(tmp_path / "out"), str(tmp_path / "src")]) == 2
    assert list((tmp_path / "elsewhere").iterdir()) == []
    out, sub = tmp_path / "out", tmp_path / "out" / "sub"
    assert capsys.readouterr().err.splitlines()[0] == (
        f"{tmp_path / 'src' / 'sub' / 'train.py'}: error: its copy {sub / 'train.py'} was not written: {sub} is a symbolic "
        f"link (to {tmp_path / 'elsewhere'}) inside -o {out}, and copies are never written through links; "
        "remove the link or choose another -o folder")


@pytest.mark.parametrize("args", [["-o", ".", "train.py"], ["-o", ".", "."], ["-o", "src", "src"]],
                         ids=["dot-and-file", "dot-and-folder", "folder-onto-itself"])
def test_output_dir_onto_the_sources_own_folder_is_refused_and_the_source_untouched(tmp_path, args):
    folder = tmp_path / "src" if "src" in args else tmp_path
    script = write(folder / "train.py", TORCH_SCRIPT)
    script.chmod(0o444)
    proc = run_cli(args, tmp_path, timeout=60)
    assert proc.returncode == 2
    shown = "src/train.py" if "src" in args else "train.py"
    assert proc.stderr.decode().splitlines() == [
        f"dpmigrate: error: -o {args[1]}: the copy of {shown} would replace the source itself; nothing was "
        "written. Choose a folder other than the sources' own, or drop -o to convert in place"]
    assert script.read_bytes() == TORCH_SCRIPT
    assert stat.S_IMODE(script.stat().st_mode) == 0o444
    assert leftovers(tmp_path) == []


# --- 3. notebooks ---------------------------------------------------------------------------------

def code(cell_id: str, source: list[str], outputs: list | None = None, count: int = 1) -> dict:
    return {"cell_type": "code", "execution_count": count, "id": cell_id, "metadata": {}, "outputs": outputs or [],
            "source": source}


STREAM = {"name": "stdout", "output_type": "stream", "text": ["epoch 0 loss 1.0312\n", "epoch 1 loss 0.9876\n"]}
NOTEBOOK = {
    "cells": [
        {"cell_type": "markdown", "id": "m1", "metadata": {}, "source": ["# Train a regressor\n", "device = cuda"]},
        code("c1", ["%matplotlib inline\n", "import torch\n", "from torch import nn\n",
                    "from torch.utils.data import DataLoader, TensorDataset\n", "!nvidia-smi"]),
        code("c2", ['device = torch.device("cuda" if torch.cuda.is_available() else "cpu")\n',
                    "data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))\n",
                    "loader = DataLoader(data, batch_size=8, shuffle=True)"], count=2),
        code("c3", ["model = nn.Linear(4, 1).to(device)\n", "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)"],
             count=3),
        code("c4", ["%%time\n", "print('timing')\n", "torch.save(model, 'whole.pt')"], count=4),
        code("c5", ["for epoch in range(2):\n", "    for x, y in loader:\n", "        x, y = x.to(device), y.to(device)\n",
                    "        optimizer.zero_grad()\n", "        loss = nn.functional.mse_loss(model(x), y)\n",
                    "        loss.backward()\n", "        optimizer.step()\n", "        !echo step\n",
                    '    print(f"epoch {epoch} loss {loss.item():.4f}")\n',
                    'torch.save(model.state_dict(), "model.pt")\n'], outputs=[STREAM], count=5),
        code("c6", ["files = !ls\n", "model?"], count=6),
    ],
    "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
    "nbformat": 4, "nbformat_minor": 5,
}
CONVERTED_CELLS = [
    ["# Train a regressor\n", "device = cuda"],
    ["%matplotlib inline\n", "import torch\n", "from torch import nn\n",
     "from torch.utils.data import DataLoader, TensorDataset\n", "import dpmigrate.runtime.torch as dp\n", "\n",
     "dp.init()\n", "!nvidia-smi"],
    ["device = dp.device()\n", "data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))\n",
     "loader = dp.distributed_loader(DataLoader(data, batch_size=8, shuffle=True))"],
    ["model = nn.Linear(4, 1).to(device)\n", "model = dp.distributed_model(model)\n",
     "optimizer = dp.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))"],
    ["%%time\n", "print('timing')\n", "torch.save(model, 'whole.pt')"],
    ["for epoch in range(2):\n", "    for x, y in loader:\n", "        x, y = x.to(device), y.to(device)\n",
     "        optimizer.zero_grad()\n", "        loss = nn.functional.mse_loss(model(x), y)\n",
     "        loss.backward()\n", "        optimizer.step()\n", "        !echo step\n",
     '    dp.print(f"epoch {epoch} loss {loss.item():.4f}")\n', 'dp.save(model.state_dict(), "model.pt")\n'],
    ["files = !ls\n", "model?"],
]


def save_notebook(path: Path, notebook: dict) -> Path:
    return write(path, (json.dumps(notebook, indent=1, ensure_ascii=False) + "\n").encode())


def test_a_notebooks_code_cells_are_converted_as_one_script_keeping_cells_magics_and_outputs(tmp_path, capsys):
    path = save_notebook(tmp_path / "train.ipynb", NOTEBOOK)
    assert main([str(path)]) == 1
    converted = json.loads(path.read_text())
    assert [cell["source"] for cell in converted["cells"]] == CONVERTED_CELLS
    assert [{k: v for k, v in cell.items() if k != "source"} for cell in converted["cells"]] == [
        {k: v for k, v in cell.items() if k != "source"} for cell in NOTEBOOK["cells"]]
    assert {k: v for k, v in converted.items() if k != "cells"} == {k: v for k, v in NOTEBOOK.items() if k != "cells"}
    assert path.read_text().startswith('{\n "cells": [\n  {\n   "cell_type": "markdown"')  # Jupyter's indent kept
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"Rewriting {path}"
    assert (f"{path}:1:10: change rank-device: code cell 2: torch.device(\"cuda\" if torch.cuda.is_available() "
            "else \"cpu\") -> dp.device(): this rank's GPU, or the CPU") in err
    assert f"{path}:10:1: change distributed-save: code cell 5: torch.save -> dp.save: rank 0 writes atomically, " \
           "then all ranks meet (every rank must reach this line)" in err
    assert err[-1] == "1 file, 1 changed, 7 changes, 0 declined, 0 errors" + POLICY
    before = path.read_bytes()
    assert main([str(path)]) == 0  # converted notebooks are left alone, byte for byte
    assert path.read_bytes() == before


def test_a_notebook_without_a_framework_is_left_byte_identical(tmp_path):
    notebook = {"cells": [code("a", ["%load_ext autoreload\n", "import json\n", "json.dumps({})"])],
                "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = write(tmp_path / "util.ipynb", json.dumps(notebook).encode())  # not Jupyter's layout: never rewritten
    assert main([str(path)]) == 0
    assert path.read_bytes() == json.dumps(notebook).encode()


def test_a_file_named_ipynb_that_is_not_a_notebook_exits_2_and_is_untouched(tmp_path, capsys):
    path = write(tmp_path / "train.ipynb", TORCH_SCRIPT)
    assert main([str(path)]) == 2
    assert path.read_bytes() == TORCH_SCRIPT
    assert capsys.readouterr().err.splitlines()[0] == (
        f"{path}: error: is named .ipynb but is not a notebook (not JSON: Expecting value: line 1 column 1 (char 0)); "
        "rename it if it is a script")


# --- 4. a file edited while it was being converted ---------------------------------------------------

def user_edits_during_conversion(monkeypatch, edit) -> None:
    """The real engine converts; the moment it has finished, before the CLI writes, the user saves the file."""
    real = engine.convert

    def converting_while_the_user_edits(source, path, options):
        result = real(source, path, options)
        edit(Path(path))
        return result

    monkeypatch.setattr(engine, "convert", converting_while_the_user_edits)


EDITED = TORCH_SCRIPT.replace(b"lr=0.1", b"lr=0.2")


def save_like_an_editor(path: Path) -> None:
    """Write a new file and rename it over the old one (vim, VS Code): same bytes, a new inode."""
    tmp = path.with_name(path.name + "~")
    tmp.write_bytes(path.read_bytes())
    os.replace(tmp, path)


@pytest.mark.parametrize("edit", [lambda p: p.write_bytes(EDITED), save_like_an_editor,
                                  lambda p: os.utime(p, ns=(time.time_ns(), time.time_ns() + 10**9))],
                         ids=["new-bytes", "saved-by-rename", "touched"])
def test_a_file_edited_during_its_conversion_is_left_as_the_user_left_it(tmp_path, monkeypatch, capsys, edit):
    script = write(tmp_path / "train.py", TORCH_SCRIPT)
    user_edits_during_conversion(monkeypatch, edit)
    assert main([str(script)]) == 2
    expected = EDITED if script.read_bytes() != TORCH_SCRIPT else TORCH_SCRIPT
    assert script.read_bytes() == expected and expected != CONVERTED_SCRIPT
    assert capsys.readouterr().err.splitlines()[0] == (
        f"{script}: error: changed while it was being converted; left as the user left it (run dpmigrate on it again)")
    assert leftovers(tmp_path) == []


# --- 6. a temporary left by a killed conversion ---------------------------------------------------

KILLED_WRITER = """
import sys, time
from dpmigrate.runtime.atomic import atomic_write
def half(f):
    f.write(sys.argv[2].encode()[:100]); f.flush(); print("writing", flush=True); time.sleep(600)
atomic_write(sys.argv[1], half)
"""


def kill_a_writer_mid_write(target: Path) -> str:
    """A real writer of ``target`` killed (SIGKILL) while its temporary is half written; the temporary's name."""
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(target), CONVERTED_SCRIPT.decode()],
                            stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"writing\n"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    stale = leftovers(target.parent)
    assert len(stale) == 1
    return stale[0]


@pytest.mark.parametrize("content", [TORCH_SCRIPT, CONVERTED_SCRIPT], ids=["needs-converting", "already-converted"])
def test_a_later_run_removes_the_temporary_a_killed_conversion_left(tmp_path, content):
    script = write(tmp_path / "train.py", content)
    kill_a_writer_mid_write(script)
    assert main([str(script)]) == (1 if content == TORCH_SCRIPT else 0)
    assert script.read_bytes() == CONVERTED_SCRIPT
    assert leftovers(tmp_path) == []


def test_check_and_diff_leave_even_a_stale_temporary_alone(tmp_path):
    script = write(tmp_path / "train.py", CONVERTED_SCRIPT)
    stale = kill_a_writer_mid_write(script)
    assert main(["--check", str(script)]) == 0
    assert main(["--diff", str(script)]) == 0
    assert leftovers(tmp_path) == [stale]


def test_a_conversion_that_moves_a_cell_boundary_or_an_ipython_line_is_refused():
    # The engine keeps both today; this is the guard for the day a rule moves code across cells.
    from dpmigrate.findings import ConversionError
    from dpmigrate.userfiles.notebooks import _split

    held = ["!nvidia-smi"]
    joined = "import torch\n# _dpmigrate_ipython_0_\n# %% dpmigrate-cell-1\nx = 1\n"
    assert _split(joined, 2, held, "nb.ipynb") == ["import torch\n!nvidia-smi", "x = 1"]
    for moved in ["import torch\n# %% dpmigrate-cell-1\nx = 1\n",  # the IPython line was lost
                  "import torch\n# _dpmigrate_ipython_0_\n# %% dpmigrate-cell-1\n# %% dpmigrate-cell-1\nx = 1\n",  # doubled
                  "import torch\n# _dpmigrate_ipython_0_\nx = 1\n"]:  # a boundary was lost
        with pytest.raises(ConversionError, match="moved code across the notebook's cell boundaries"):
            _split(moved, 2, held, "nb.ipynb")
