"""A plateau scheduler stepped with each rank's own value (issue 19 audit round I: the ReduceOnPlateau example of
Paddle's API docs). Each rank lowered its learning rate on its own data: rank 0 ended at 0.125, rank 1 at 0.25,
with different weights, and nothing said so. The step now reads ``dp.all_reduce(value)``.

The fixtures ``paddle/plateau_step_loss`` (stepped per batch with the loss tensor) and ``torch/plateau_scheduler``
(per epoch, with a float) are executed against one process by the fixture tests; here, the same conversions with
this rule left out diverge, so those fixtures do test it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from rule_testing import convert_text, findings_of

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

PADDLE = """\
    import paddle
    net = paddle.nn.Linear(4, 1)
    scheduler = paddle.optimizer.lr.ReduceOnPlateau(learning_rate=0.1)
    other = paddle.optimizer.lr.StepDecay(learning_rate=0.1, step_size=2)
    opt = paddle.optimizer.SGD(learning_rate=scheduler, parameters=net.parameters())
    loader = paddle.io.DataLoader(paddle.io.TensorDataset([paddle.ones([8, 4])]), batch_size=2)
    for epoch in range(3):
        for (x,) in loader:
            loss = net(x).mean()
            loss.backward()
            opt.step()
            opt.clear_grad()
            {step}
        other.step()
    """


def _paddle(step: str):
    return convert_text(textwrap.dedent(PADDLE).format(step=step))


def test_a_step_every_rank_reaches_reads_the_mean_over_the_ranks():
    for step, after in [("scheduler.step(loss)", "scheduler.step(dp.all_reduce(loss))"),
                        ("scheduler.step(metrics=float(loss))", "scheduler.step(metrics=dp.all_reduce(float(loss)))"),
                        ("if epoch % 2 == 0:\n                scheduler.step(loss)", "scheduler.step(dp.all_reduce(loss))")]:
        result = _paddle(step)
        [change] = findings_of(result, "plateau-metric", "change")
        assert after in result.output.decode() and "other.step()" in result.output.decode()
        assert "mean over the ranks" in change.message
        assert convert_text(result.output.decode()).output == result.output  # a second run changes nothing


def test_a_step_under_a_test_of_this_ranks_data_or_rank_is_declined_with_the_fix():
    result = _paddle("if loss < 0.5:\n                scheduler.step(loss)")
    [declined] = findings_of(result, "plateau-metric", "declined")
    assert "under `if loss < 0.5`" in declined.message and "dp.all_reduce(loss)" in declined.fix
    assert "scheduler.step(loss)" in result.output.decode()
    result = _paddle("if args.local_rank == 0:\n                scheduler.step(loss)")
    [declined] = findings_of(result, "plateau-metric", "declined")
    assert "runs on some ranks only" in declined.message


def test_a_torch_scheduler_kept_in_an_attribute_is_found_by_its_qualified_name():
    result = convert_text(textwrap.dedent("""\
        import torch
        from torch.optim.lr_scheduler import ReduceLROnPlateau as Plateau


        class Trainer:
            def __init__(self, model, loader):
                self.model, self.loader = model, loader
                self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
                self.scheduler = Plateau(self.optimizer)

            def epoch(self):
                total = 0.0
                for x, y in self.loader:
                    self.optimizer.zero_grad()
                    loss = torch.nn.functional.mse_loss(self.model(x), y)
                    loss.backward()
                    self.optimizer.step()
                    total += loss.item()
                self.scheduler.step(total)
        """))
    assert "self.scheduler.step(dp.all_reduce(total))" in result.output.decode()
    [change] = findings_of(result, "plateau-metric", "change")
    assert "`self.scheduler.step` reads dp.all_reduce(total)" in change.message


@pytest.mark.slow
@pytest.mark.parametrize("fixture, steps", [("paddle/plateau_step_loss", 12), ("torch/plateau_scheduler", 30)])
def test_without_the_rule_the_fixture_diverges_from_one_process(fixture, steps, tmp_path):
    script = tmp_path / "train.py"
    script.write_text((FIXTURES / fixture / "before.py").read_text())
    converted = subprocess.run([sys.executable, "-m", "dpmigrate", "--batch", "global", "--ignore", "plateau-metric",
                                "-o", str(tmp_path / "ignored"), str(script)], capture_output=True, text=True, timeout=120)
    assert converted.returncode == 1 and "plateau-metric" not in converted.stderr, converted.stderr  # 1: changed
    proc = subprocess.run([sys.executable, "-m", "dpmigrate", "verify", "-n", "2", "--steps", str(steps), "--to-end", "0",
                           "--against",
                           str(tmp_path / "ignored" / "train.py"), str(script)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 1 and "diverges after step" in proc.stderr, proc.stdout[-2000:] + proc.stderr[-3000:]
