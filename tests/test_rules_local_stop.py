"""local-stop: a break decided by this rank's own loss is declined with the all-ranks fix (a public regression example)."""

from rule_testing import convert_text, findings_of

LOOP = """
import torch
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(100):
    opt.zero_grad()
    loss = model(torch.randn(4, 2)).pow(2).mean()
    loss.backward()
    opt.step()
    if {condition}:
        break
"""


def test_a_break_on_the_loss_is_declined_with_the_fix():
    [declined] = findings_of(convert_text(LOOP.format(condition="loss.item() < 1e-3")), "local-stop", "declined")
    assert "`loss`" in declined.message and "dp.all_reduce(loss)" in declined.fix


def test_a_break_on_a_flag_or_the_loop_counter_is_left_alone():
    for condition in ("args.dry_run", "step > 10"):
        assert findings_of(convert_text(LOOP.format(condition=condition)), "local-stop") == [], condition
