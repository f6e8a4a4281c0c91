"""batch-norm: a training script's batch normalisation layers are named in a note (issue 18): launched, each rank
normalises over its own share of the batch, which verify measures as a difference (1e-1 relative on a CNN)."""

from rule_testing import convert_text, findings_of

NET = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3)
        self.bn1 = nn.BatchNorm2d(8)
        self.head = nn.Sequential(nn.Linear(8, 4), nn.BatchNorm1d(4))

model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in torch.utils.data.DataLoader(range(8), batch_size=2):
    opt.zero_grad()
    model(x).sum().backward()
    opt.step()
"""


def test_the_layers_are_named_once_with_the_share_each_rank_normalises():
    [note] = findings_of(convert_text(NET, batch="global"), "batch-norm", "note")
    assert "batch normalisation (bn1, BatchNorm1d)" in note.message and "B/N samples" in note.message
    assert "--sync-batchnorm" in note.fix


def test_sync_batchnorm_puts_the_strategy_in_init_and_says_where_it_runs():
    result = convert_text(NET, batch="global", sync_batchnorm=True)
    [note] = findings_of(result, "batch-norm", "note")
    assert "batch normalisation (bn1, BatchNorm1d) synchronised over the ranks when launched" in note.message
    assert "on GPUs" in note.message and "stops at dp.distributed_model" in note.message
    assert "dp.init(dp.Strategy(sync_batchnorm=True))\n" in result.output.decode()
    assert "nn.BatchNorm2d(8)" in result.output.decode()  # the runtime converts the layers, not the codemod


def test_a_file_that_only_defines_a_model_gets_no_note():
    assert not findings_of(convert_text(NET.split("model = Net()")[0]), "batch-norm")
