"""Optimizer-only models and closure optimizers on real 2-process gloo jobs (issue 8, item 2).

The job (tests/jobs/torch_unseeded.py) builds an unseeded model: every rank draws different weights.
``dp.distributed_optimizer`` must give every rank rank 0's starting state (parameters and the random
buffer of the module holding them) when no DDP wrapper did, and ``step(closure)`` (LBFGS) must average
the closure's gradients and loss. The single-process oracle starts from what rank 0 started from and
takes the global batch; the 2-rank job takes half of it on each rank.
"""

import subprocess
import sys
import textwrap

import pytest
from test_torch_distributed import clean_env, launch, run_single

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow

JOB = "torch_unseeded.py"


def load(path):
    return torch.load(path, weights_only=True)


def assert_states(expected, actual, atol):
    assert expected.keys() == actual.keys()
    for key in expected:
        difference = (expected[key] - actual[key]).abs().max().item()
        assert difference <= atol, f"{key}: largest difference {difference:.3g} > {atol}"


def test_an_unseeded_optimizer_only_model_starts_and_stays_equal_on_every_rank(tmp_path):
    launch(JOB, "--optimizer", "sgd", "--wrap-model", "no", "--dump", "job", cwd=tmp_path)
    built = [load(tmp_path / f"job.pre.rank{r}.pt") for r in (0, 1)]
    started = [load(tmp_path / f"job.start.rank{r}.pt") for r in (0, 1)]
    final = [load(tmp_path / f"job.final.rank{r}.pt") for r in (0, 1)]
    # unseeded: the ranks built different weights and a different buffer (what the runtime must fix)
    assert not torch.equal(built[0]["0.weight"], built[1]["0.weight"])
    assert not torch.equal(built[0]["1.scale"], built[1]["1.scale"])
    assert_states(built[0], started[0], atol=0)  # rank 0 kept its own values...
    assert_states(started[0], started[1], atol=0)  # ...and rank 1 took them, buffer included
    assert_states(final[0], final[1], atol=0)

    run_single(JOB, "--optimizer", "sgd", "--init-from", "job.start.rank0.pt", "--dump", "single", cwd=tmp_path)
    single = load(tmp_path / "single.final.rank0.pt")
    assert not torch.equal(single["0.weight"], started[0]["0.weight"])  # training moved the weights
    assert_states(single, final[0], atol=1e-5)


@pytest.mark.alone  # times how fast a lost, late or frozen rank ends the job: run one at a time
def test_a_rank_that_built_a_different_model_fails_with_a_message_instead_of_hanging(tmp_path):
    proc = launch(JOB, "--width-on-rank1", "12", "--dump", "job", cwd=tmp_path, check=False, timeout=120,
                  env=clean_env(DPMIGRATE_TIMEOUT="30"))
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "rank 1 holds a different model than rank 0" in output, output[-3000:]
    assert ("parameter #0 (in the optimizer's order) is shape (12, 8) float32 on rank 1 "
            "but shape (16, 8) float32 on rank 0") in output


@pytest.mark.parametrize("wrap_model", ["yes", "no"])
def test_lbfgs_with_a_closure_on_two_ranks_matches_one_process(tmp_path, wrap_model):
    """Averaged closure gradients and loss: the ranks agree on every LBFGS decision, as 1 process."""
    common = ["--optimizer", "lbfgs", "--seed", "0", "--steps", "8"]
    launch(JOB, *common, "--wrap-model", wrap_model, "--dump", "job", cwd=tmp_path, timeout=240)
    run_single(JOB, *common, "--dump", "single", cwd=tmp_path)
    final = [load(tmp_path / f"job.final.rank{r}.pt") for r in (0, 1)]
    assert_states(final[0], final[1], atol=0)
    single = load(tmp_path / "single.final.rank0.pt")
    assert not torch.equal(single["0.weight"], load(tmp_path / "single.start.rank0.pt")["0.weight"])
    assert_states(single, final[0], atol=1e-5)
    # step(closure) returned the loss averaged over the ranks: the global batch's loss, on both ranks
    losses = [load(tmp_path / f"job.losses.rank{r}.pt") for r in (0, 1)]
    assert torch.equal(losses[0], losses[1])
    assert torch.allclose(losses[0], load(tmp_path / "single.losses.rank0.pt"), rtol=0, atol=1e-5)


def test_a_whole_wrapped_model_saved_by_dp_save_loads_as_the_plain_module_without_a_process_group(tmp_path):
    launch(JOB, "--wrap-model", "yes", "--buffer", "no", "--steps", "3", "--dump", "job", "--save-whole", "whole",
           cwd=tmp_path)
    reader = textwrap.dedent("""
        import sys
        import torch
        model = torch.load("whole.pt", weights_only=False)
        checkpoint = torch.load("whole.dict.pt", weights_only=False)
        assert not torch.distributed.is_initialized()
        print(type(model).__module__, type(model).__qualname__)
        print(type(checkpoint).__qualname__, type(checkpoint["model"]).__qualname__, checkpoint["step"])
        torch.save({"whole": model.state_dict(), "dict": checkpoint["model"].state_dict()}, "read.pt")
    """)
    done = subprocess.run([sys.executable, "-c", reader], cwd=tmp_path, env=clean_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["torch.nn.modules.container Sequential", "dict Sequential 3"]
    read = load(tmp_path / "read.pt")
    assert_states(load(tmp_path / "job.final.rank0.pt"), read["whole"], atol=0)
    assert_states(load(tmp_path / "job.final.rank0.pt"), read["dict"], atol=0)
