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


PADDLE = """
import paddle

net = paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.BatchNorm1D(8), paddle.nn.Linear(8, 1))
opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters())
for x in paddle.io.DataLoader(paddle.io.TensorDataset([paddle.ones([8, 4])]), batch_size=4):
    loss = net(x[0]).mean()
    loss.backward()
    opt.step()
    opt.clear_grad()
"""
HAPI = """
import paddle

net = paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.BatchNorm1D(8), paddle.nn.Linear(8, 1))
model = paddle.Model(net)
model.prepare(paddle.optimizer.SGD(learning_rate=0.1, parameters=net.parameters()), paddle.nn.MSELoss())
model.fit(paddle.io.TensorDataset([paddle.ones([8, 4]), paddle.ones([8, 1])]), batch_size=4)
"""


def test_paddle_sync_batchnorm_goes_through_the_strategy():
    result = convert_text(PADDLE, batch="global", sync_batchnorm=True)
    assert "dp.init(dp.Strategy(sync_batchnorm=True))\n" in result.output.decode()
    [note] = findings_of(result, "batch-norm", "note")
    assert "BatchNorm1D) synchronised over the ranks when launched" in note.message


def test_a_paddle_model_that_distributes_itself_is_declined_with_the_manual_conversion():
    result = convert_text(HAPI, batch="global", sync_batchnorm=True)
    [declined] = findings_of(result, "batch-norm", "declined")
    assert declined.line == 5 and "paddle.Model(...) wraps its network" in declined.message
    assert "convert_sync_batchnorm(net) before paddle.Model(net)" in declined.fix
