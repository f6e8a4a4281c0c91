"""main-process-output beyond tqdm and images: files, copies, exports, stdout, custom progress bars (issue 8)."""

import textwrap

import pytest
from rule_testing import assert_rule_converts, convert_text, findings_of

HEADER = "import json\nimport shutil\nimport sys\nimport torch\n"
TRAINS = "opt.zero_grad(); model(x).sum().backward(); opt.step()\n"


def _guarded(statement: str) -> str:
    return "if dp.is_main_process():\n" + textwrap.indent(statement, "    ")


@pytest.mark.parametrize("statement", [
    'shutil.copyfile("last.pt", "best.pt")\n',
    'sys.stdout.write("epoch done\\n")\n',
    "progress_bar(step, total, msg)\n",
    'with open("metrics.json", "w") as f:\n    json.dump(stats, f)\n',
])
def test_each_output_is_written_by_the_main_process_only(statement):
    assert_rule_converts(
        "main-process-output",
        HEADER + TRAINS + statement,
        HEADER + "import dpmigrate.runtime.torch as dp\n\n" + TRAINS + _guarded(statement),
    )


def test_an_onnx_export_writes_the_plain_model_once():
    assert_rule_converts(
        "main-process-output",
        HEADER + TRAINS + 'torch.onnx.export(model, x, "m.onnx")\n',
        HEADER + "import dpmigrate.runtime.torch as dp\n\n" + TRAINS
        + _guarded('torch.onnx.export(dp.unwrap(model), x, "m.onnx")\n'),
    )


@pytest.mark.parametrize("statement", [
    'with open("log.txt") as f:\n    lines = f.read()\n',  # reading
    'with open("ckpt.pt", "wb") as f:\n    torch.save(model, f)\n',  # the save rule decides
    'best = shutil.copyfile("a", "b")\n',  # its value is kept
    'with open("out.txt", "w") as f:\n    ' + TRAINS,  # it trains
])
def test_reads_saves_kept_values_and_training_blocks_are_left_to_run_everywhere(statement):
    result = convert_text(HEADER + TRAINS + statement, select=("main-process-output",))
    assert "is_main_process" not in result.output.decode()


def test_tensorboard_writers_are_reported_with_the_fix():
    result = convert_text(
        "import torch\nfrom torch.utils.tensorboard import SummaryWriter\nwriter = SummaryWriter('runs')\n" + TRAINS
    )
    [note] = findings_of(result, "main-process-output", "note")
    assert "TensorBoard" in note.message and "dp.is_main_process()" in note.fix


# --- issue 18: clean-up after a save, and files one rank writes that every rank reads --------------------------------

CLEAN_UP = """
import glob
import os
import torch
import matplotlib.pyplot as plt
from PIL import Image

model = torch.nn.Linear(3, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in torch.utils.data.DataLoader(range(8), batch_size=2):
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
path = "ckpt_3.pt"
torch.save(model.state_dict(), path)
for old in glob.glob("ckpt_*.pt"):
    if old != path:
        os.remove(old)
plt.plot([1, 2])
plt.savefig("curve.png")
picture = Image.open("curve.png")
"""


def test_files_removed_after_a_save_are_removed_by_the_main_process_only():
    converted = convert_text(CLEAN_UP).output.decode()
    assert "    if old != path:\n        if dp.is_main_process():\n            os.remove(old)\n" in converted


def test_a_file_the_main_process_writes_and_every_rank_reads_back_has_a_barrier_between():
    converted = convert_text(CLEAN_UP).output.decode()
    assert 'if dp.is_main_process():\n    plt.savefig("curve.png")\ndp.barrier()\npicture = Image.open("curve.png")\n' \
        in converted


def test_a_wrapped_model_called_in_a_block_only_the_main_process_runs_is_called_unwrapped():
    # DDP's forward broadcasts buffers: called on rank 0 alone it waits for the others (the job died, audit D6)
    converted = convert_text("""
        import torch
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x in torch.utils.data.DataLoader(range(8), batch_size=2):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
        with torch.no_grad():
            with open("predictions.txt", "w") as f:
                f.write(str(model(torch.ones(4, 4)).tolist()))
    """).output.decode()
    assert "f.write(str(dp.unwrap(model)(torch.ones(4, 4)).tolist()))" in converted
    assert "    if dp.is_main_process():\n        with open(\"predictions.txt\", \"w\") as f:" in converted
