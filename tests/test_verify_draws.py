"""``dpmigrate verify`` sees ranks that draw the same random numbers during training (issue 32, blind spot 1).

A script that seeds its generator once and draws noise every step (a GAN's latents, noise on the inputs) gives every
rank the same noise when the ranks' generators are alike during training: the step then averages N copies of one
rank's draws. The harness keeps, per step, a digest of each global generator's state after the step; equal on every
rank, for a generator that advanced, means the same draws. These scripts are ours. The runtime parts the ranks'
streams at a sharded training loader's first pass (issue 31; before 2026-12-07 it left them alike, as ``dp.init()``
shared them), so the broken form realigns them itself at every step, as a script that reseeds alike inside its loop
would; the plain conversion and a script that seeds ranks other than 0 apart both draw their own.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from dpmigrate.verify import draws, dumps
from dpmigrate.verify.cli import main

TORCH_NOISE = '''
    """Noise on every batch, from torch's generator, which the script seeds once."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    {runtime}
    torch.manual_seed(0)
    x = torch.randn(256, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    model = {model}
    opt = {opt}
    {reseed}
    for epoch in range(2):
        for xb, yb in {loader}:
            {align}
            noisy = xb + 0.1 * torch.randn_like(xb)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(noisy), yb).backward()
            opt.step()
'''

NUMPY_NOISE = '''
    """Random label flips from NumPy's generator, seeded once, in a helper the loop calls."""
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    {runtime}
    np.random.seed(3)
    torch.manual_seed(0)
    x = torch.randn(256, 4)
    y = (x.sum(1) > 0).float().unsqueeze(1)


    def smoothed(labels):
        flips = torch.from_numpy(np.random.rand(len(labels), 1) < 0.1).float()
        return (labels - flips).abs()


    model = {model}
    opt = {opt}
    {reseed}
    for epoch in range(2):
        for xb, yb in {loader}:
            {align}
            opt.zero_grad()
            torch.nn.functional.binary_cross_entropy_with_logits(model(xb), smoothed(yb)).backward()
            opt.step()
'''

PLAIN = {"runtime": "", "align": "pass", "model": "torch.nn.Linear(4, 1)",
         "opt": "torch.optim.SGD(model.parameters(), lr=0.01)", "reseed": "",
         "loader": "DataLoader(TensorDataset(x, y), batch_size=32)"}
CONVERTED = {"runtime": "import dpmigrate.runtime.torch as dp\ndp.init()",
             "model": "dp.distributed_model(torch.nn.Linear(4, 1))",
             "opt": "dp.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.01))",
             "loader": "dp.distributed_loader(DataLoader(TensorDataset(x, y), batch_size=16))", "align": "pass"}
ALIGN = {"torch": "torch.set_rng_state(dp.broadcast(torch.get_rng_state()))",  # rank 0's state, every step
         "numpy": "np.random.set_state(dp.broadcast(np.random.get_state()))"}


def _write(tmp_path, name, template, **parts):
    body = textwrap.dedent(template)
    for key, value in parts.items():  # (multi-line values keep the template line's indentation: none here)
        body = body.replace("{" + key + "}", value)
    path = tmp_path / name
    path.write_text(body.lstrip())
    return path


def _verify(tmp_path, monkeypatch, script, against):
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "verify.json"
    code = main([str(script), "--timeout", "240", "--to-end", "0", "--report", "json", "--report-file", str(report),
                 "--against", str(against)])
    data = json.loads(report.read_text())
    assert data["exit_code"] == code, data
    return data


def _causes(data):
    return {c["kind"]: c["message"] for c in data["comparison"]["causes"]}


@pytest.mark.slow
@pytest.mark.parametrize("template, generator", [(TORCH_NOISE, "torch"), (NUMPY_NOISE, "numpy")])
def test_ranks_seeded_alike_draw_the_same_noise_and_are_caught(tmp_path, monkeypatch, template, generator):
    script = _write(tmp_path, "train.py", template, **PLAIN)
    alike = _write(tmp_path, "alike.py", template, **{**CONVERTED, "align": ALIGN[generator]}, reseed="")
    data = _verify(tmp_path, monkeypatch, script, alike)
    assert data["verdict"] == "diverges", data["headline"]
    causes = _causes(data)
    assert "same-random-draws" in causes, causes
    assert f"{generator}'s generator at steps 2, 3" in causes["same-random-draws"], causes


@pytest.mark.slow
@pytest.mark.parametrize("template, seed", [(TORCH_NOISE, "torch.manual_seed(1000 + dp.rank())"),
                                            (NUMPY_NOISE, "np.random.seed(1000 + dp.rank())"),
                                            (TORCH_NOISE, ""), (NUMPY_NOISE, "")],
                         ids=["torch-by-the-script", "numpy-by-the-script", "torch-by-the-runtime", "numpy-by-the-runtime"])
def test_ranks_seeded_apart_for_training_draw_their_own(tmp_path, monkeypatch, template, seed):
    script = _write(tmp_path, "train.py", template, **PLAIN)
    reseed = f"if dp.rank() > 0:\n    {seed}" if seed else ""  # "": the conversion as dpmigrate writes it
    apart = _write(tmp_path, "apart.py", template, **CONVERTED, reseed=reseed)
    data = _verify(tmp_path, monkeypatch, script, apart)
    # one process draws noise for 32 samples, each rank for its 16: the weights cannot match, and verify says why
    assert "same-random-draws" not in _causes(data), data["headline"]
    assert data["comparison"]["ranks_disagree"] is None


def _record(rank, steps, trace):
    return dumps.Record(rank=rank, world_size=2, framework="torch", parameters=[], snapshots=[], steps=3, optimizers=1,
                        inputs=[], stop="steps", batchnorm=[], changes=[], random_steps=steps, random_trace=trace)


def test_same_draws_need_the_same_generator_advanced_into_the_same_state_on_every_rank():
    drew = {str(s): {"torch": f"o{s}", "numpy": f"n{s}"} for s in (1, 2, 3, 4, 5)}  # the original, every step
    one = _record(0, [1, 2, 3, 4, 5], drew)
    one.steps = 5
    ranks = [_record(0, [1, 2, 3, 4, 5], {"1": {"torch": "a"}, "2": {"torch": "b", "numpy": "x"}, "3": {"numpy": "y"},
                                            "4": {"torch": "c", "numpy": "w"}, "5": {"torch": "e", "numpy": "v"}}),
             _record(1, [1, 2, 3, 4, 5], {"1": {"torch": "a"}, "2": {"torch": "b", "numpy": "z"}, "3": {"numpy": "y"},
                                            "4": {"torch": "d", "numpy": "w"}, "5": {"torch": "e", "numpy": "v"}})]
    # step 1 is not told apart from the model's initialisation; torch's states differ at 4, numpy's at 2
    assert draws.same_draws(one, ranks) == {"numpy": [3, 4, 5], "torch": [2, 5]}
    assert draws.same_draws(_record(0, [], {}), ranks) == {}  # the original drew nothing in its steps
    assert draws.same_draws(one, ranks[:1]) == {}  # one rank has nobody to repeat


def test_a_shuffle_at_each_epoch_alike_on_every_rank_is_no_same_noise():
    # batches cut by hand from one permutation per epoch (4 steps an epoch): the ranks must draw it alike
    epochs = {str(s): {"numpy": f"p{s}"} for s in (5, 9, 13)}
    one = _record(0, [5, 9, 13], epochs)
    one.steps = 14
    ranks = [_record(r, [5, 9, 13], epochs) for r in (0, 1)]
    assert draws.same_draws(one, ranks) == {}
