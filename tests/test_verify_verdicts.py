"""``dpmigrate verify``'s verdicts beyond equivalent and diverges: inconclusive (exit 3) and nothing to verify.

Weights that match prove nothing when no input was seen (batches cut by hand from a tensor into a model of raw
tensors: every rank may read all the data) or when only one step ran (every rank starts it from the same weights
however they were made): such runs were "equivalent" with exit 0 (issue 32's fourth blind spot). A script that the
converter leaves as it is, because it distributes itself, has no conversion to check: "nothing to verify", not
"diverges, unsynchronised: wrap the model" (its seventh). The verdicts' order decides a run over many scripts.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from dpmigrate.verify.cli import main
from dpmigrate.verify.report import EXIT_CODES, worst

RAW_TENSORS = '''
    """A linear fit with raw tensors and batches cut by hand: no DataLoader, no nn.Module."""
    import torch

    torch.manual_seed(0)
    x = torch.randn(256, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]])
    w = torch.zeros(4, 1, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.01)
    for epoch in range(2):
        for i in range(0, 256, 32):
            opt.zero_grad()
            loss = ((x[i:i + 32] @ w - y[i:i + 32]) ** 2).mean()
            loss.backward()
            opt.step()
'''

ONE_STEP = '''
    """One full batch, one epoch: a single optimizer step in all."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = x.sum(1, keepdim=True)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for xb, yb in DataLoader(TensorDataset(x, y), batch_size=64):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(xb), yb).backward()
        opt.step()
'''

BY_HAND = {
    "torch": '''
        """Written for DDP by hand."""
        import os
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        if "RANK" in os.environ:
            dist.init_process_group("gloo")
        model = DistributedDataParallel(torch.nn.Linear(4, 1)) if dist.is_initialized() else torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(3):
            opt.zero_grad()
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
    ''',
    "paddle": '''
        """Written for Fleet by hand."""
        import paddle
        from paddle.distributed import fleet

        fleet.init(is_collective=True)
        model = fleet.distributed_model(paddle.nn.Linear(4, 1))
        opt = fleet.distributed_optimizer(paddle.optimizer.SGD(parameters=model.parameters()))
        loss = model(paddle.ones([2, 4])).sum()
        loss.backward()
        opt.step()
    ''',
    "tensorflow": '''
        """Written for a tf.distribute strategy by hand."""
        import tensorflow as tf

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        with strategy.scope():
            model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
            model.compile("sgd", "mse")
        model.fit(tf.ones([8, 4]), tf.ones([8, 1]), epochs=1)
    ''',
}

TORCH_PROCESSES = '''
    """Hogwild: the script starts its own training processes."""
    import torch
    import torch.multiprocessing as mp


    def train(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        opt.zero_grad()
        model(torch.ones(2, 4)).sum().backward()
        opt.step()


    if __name__ == "__main__":
        model = torch.nn.Linear(4, 1)
        model.share_memory()
        workers = [mp.Process(target=train, args=(model,)) for _ in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
'''


def _verify(tmp_path, monkeypatch, body, *extra):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(body).lstrip())
    report = tmp_path / "verify.json"
    code = main([str(script), "--timeout", "240", "--to-end", "0", "--report", "json", "--report-file", str(report), *extra])
    data = json.loads(report.read_text())
    assert data["exit_code"] == code, data
    return data


def test_the_verdicts_order_puts_a_divergence_first_and_inconclusive_above_equivalent():
    assert worst(["equivalent", "inconclusive", "nothing to verify"]) == "inconclusive"
    assert worst(["inconclusive", "error"]) == "error"
    assert worst(["error", "diverges", "equivalent"]) == "diverges"
    assert worst([]) == "equivalent"
    assert EXIT_CODES == {"equivalent": 0, "nothing to verify": 0, "inconclusive": 3, "error": 2, "diverges": 1}


@pytest.mark.parametrize("framework", sorted(BY_HAND))
def test_a_script_distributed_by_hand_has_nothing_to_verify_and_nothing_runs(tmp_path, monkeypatch, framework):
    data = _verify(tmp_path, monkeypatch, BY_HAND[framework])
    assert data["verdict"] == "nothing to verify" and data["exit_code"] == 0, data
    assert "written for data parallelism by hand" in data["headline"], data["headline"]
    assert data["original_seconds"] is None and data["comparison"] is None  # neither run was started


def test_a_script_that_starts_its_own_processes_has_nothing_to_verify(tmp_path, monkeypatch):
    data = _verify(tmp_path, monkeypatch, TORCH_PROCESSES)
    assert data["verdict"] == "nothing to verify", data
    assert "starts its own processes" in data["headline"], data["headline"]


@pytest.mark.slow
def test_matching_weights_with_no_input_seen_are_inconclusive_not_equivalent(tmp_path, monkeypatch):
    data = _verify(tmp_path, monkeypatch, RAW_TENSORS)
    assert data["verdict"] == "inconclusive" and data["exit_code"] == 3, data["headline"]
    assert data["comparison"]["max_difference"] < 1e-6 and data["comparison"]["data"]["observed"] == 0
    assert "no input was seen" in data["headline"]


@pytest.mark.slow
def test_one_step_in_all_is_inconclusive(tmp_path, monkeypatch):
    data = _verify(tmp_path, monkeypatch, ONE_STEP)
    assert data["verdict"] == "inconclusive" and data["exit_code"] == 3, data["headline"]
    assert data["comparison"]["steps"] == 1 and data["comparison"]["data"]["split"] == 1
    assert "one step proves little" in data["headline"]
