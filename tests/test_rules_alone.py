"""Each rule on its own (``Options(select=(rule,))``): its expected output holds only its own edits,
and it needs no other rule to have run (shared facts are analyses, not other rules' results)."""

from __future__ import annotations

import pytest
from rule_testing import IMPORT, assert_rule_converts, convert_text

SCRIPT = '''\
import torch
from torch.utils.data import DataLoader, TensorDataset

device = torch.device("cuda")
data = TensorDataset(torch.randn(8, 2), torch.randn(8, 1))
loader = DataLoader(data, batch_size=4)
model = torch.nn.Linear(2, 1).to(device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in loader:
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
print("done")
torch.save(model.state_dict(), "m.pt")
'''

CASES = {
    "init-runtime": ("device = torch.device", "dp.init()\ndevice = torch.device"),
    "rank-device": ('device = torch.device("cuda")', "device = dp.device()"),
    "distributed-model": (
        "model = torch.nn.Linear(2, 1).to(device)\n",
        "model = torch.nn.Linear(2, 1).to(device)\nmodel = dp.distributed_model(model)\n",
    ),
    "distributed-optimizer": (
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)",
        "opt = dp.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))",
    ),
    "shard-training-loader": (
        "loader = DataLoader(data, batch_size=4)", "loader = dp.distributed_loader(DataLoader(data, batch_size=4))"),
    "distributed-save": ('torch.save(model.state_dict(), "m.pt")', 'dp.save(model.state_dict(), "m.pt")'),
    "main-process-print": ('print("done")', 'dp.print("done")'),
}


@pytest.mark.parametrize("rule", sorted(CASES))
def test_one_rule_alone_makes_only_its_own_edit(rule):
    old, new = CASES[rule]
    expected = SCRIPT.replace(old, new)
    lines = expected.splitlines(keepends=True)
    lines.insert(2, IMPORT)  # after the imports, as AddImportsVisitor puts it
    assert_rule_converts(rule, SCRIPT, "".join(lines))


def test_global_batch_size_alone_needs_no_sharding_rule_to_have_run():
    old = "loader = DataLoader(data, batch_size=4)"
    new = "loader = DataLoader(data, batch_size=dp.per_rank_batch_size(4))"
    lines = SCRIPT.replace(old, new).splitlines(keepends=True)
    lines.insert(2, IMPORT)
    assert_rule_converts("global-batch-size", SCRIPT, "".join(lines), batch="global")


def test_ignoring_a_rule_leaves_its_sites_and_runs_the_others():
    result = convert_text(SCRIPT, ignore=("main-process-print",))
    assert 'print("done")' in result.output.decode() and "dp.print" not in result.output.decode()
    assert "dp.save(" in result.output.decode()
    assert "main-process-print" not in {f.rule for f in result.findings}


def test_a_check_selected_alone_still_reports_and_changes_nothing():
    source = "import torch.distributed as dist\nif dist.get_rank() == 0:\n    dist.barrier()\n"
    result = convert_text(source, select=("rank-divergent-code",))
    assert result.output.decode() == source
    assert [(f.rule, f.severity) for f in result.findings if f.severity == "error"] == [("rank-divergent-code", "error")]
