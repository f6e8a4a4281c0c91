"""shared-random-data: data drawn once without a seed is broadcast from rank 0 (a public regression example diverged)."""

from rule_testing import convert_text, findings_of

SCRIPT = """
import torch
{seed}
TARGET = torch.randn(3, 1) * 5


def batch():
    x = torch.randn(8, 3)
    return x, x @ TARGET


def main():
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(10):
        x, y = batch()
        opt.zero_grad(); (model(x) - y).pow(2).mean().backward(); opt.step()


main()
"""


def test_a_target_drawn_once_without_a_seed_is_rank_0s_on_every_rank():
    result = convert_text(SCRIPT.format(seed=""))
    converted = result.output.decode()
    assert "TARGET = dp.broadcast(torch.randn(3, 1) * 5)" in converted
    assert "    x = torch.randn(8, 3)\n" in converted  # a fresh batch per step stays per rank
    assert len(findings_of(result, "shared-random-data", "change")) == 1


def test_a_seeded_script_is_left_alone():
    result = convert_text(SCRIPT.format(seed="torch.manual_seed(0)"))
    assert "broadcast" not in result.output.decode()
