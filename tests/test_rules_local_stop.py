"""local-stop: a break decided by this rank's own loss is declined with the all-ranks fix (a public regression example)."""

import pytest
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


def test_a_break_on_the_loss_tests_the_mean_over_the_ranks():
    result = convert_text(LOOP.format(condition="loss.item() < 1e-3"))
    assert "    if dp.all_reduce(loss).item() < 1e-3:\n        break\n" in result.output.decode()
    [change] = findings_of(result, "local-stop", "change")
    assert "every rank stops at the same step" in change.message


def test_a_test_an_and_could_short_circuit_is_declined_with_the_fix():
    result = convert_text(LOOP.format(condition="step > 3 and loss.item() < 1e-3"))
    assert "all_reduce" not in result.output.decode()
    [declined] = findings_of(result, "local-stop", "declined")
    assert "`loss`" in declined.message and "dp.all_reduce(loss)" in declined.fix


def test_a_break_on_a_flag_or_the_loop_counter_is_left_alone():
    for condition in ("args.dry_run", "step > 10"):
        assert findings_of(convert_text(LOOP.format(condition=condition)), "local-stop") == [], condition


def test_a_counter_the_loop_steps_by_one_is_the_same_on_every_rank():
    # `step += 1` then `if step >= 40: break` needs no all-reduce (audit D7: it got one, with a wrong reason)
    from rule_testing import convert_text, findings_of

    result = convert_text("""
        import torch
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = torch.utils.data.DataLoader(range(8), batch_size=2)
        step = 0
        while True:
            for x in loader:
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
                step += 1
                if step >= 40:
                    break
    """)
    assert not findings_of(result, "local-stop") and "all_reduce" not in result.output.decode()


SIZE_STOP = '''\
    import numpy as np
    import paddle
    batch_size = 32
    loader = paddle.io.DataLoader(dataset, batch_size=batch_size, shuffle=True)
    model = paddle.nn.Linear(4, 1)
    opt = paddle.optimizer.SGD(parameters=model.parameters())
    for {target} in {iterable}:
        data = np.array(data)
        if data.shape[1] < batch_size:
            break
        model(paddle.to_tensor(data[:4].T)).mean().backward()
        opt.step()
        opt.clear_grad()
    '''


@pytest.mark.parametrize("target,iterable", [("step, data", "enumerate(loader())"), ("data", "loader()")])
def test_a_break_on_the_size_of_this_ranks_batch_is_declined_not_all_reduced(target, iterable):
    """An awesome-DeepLearning LSTM script (issue 19 audit): the rule made `dp.all_reduce(data).shape[1]` of a
    (5, B) array, which failed on 2 ranks; under --batch global the test stopped every rank at the first step."""
    for batch in ("per-device", "global"):
        result = convert_text(SIZE_STOP.format(target=target, iterable=iterable), batch=batch)
        assert "all_reduce" not in result.output.decode()
        [declined] = findings_of(result, "local-stop", "declined")
        assert "size of this rank's batch" in declined.message and "drop_last=True" in declined.fix
