"""``dpmigrate verify --batch per-device`` (issue 32, blind spot 3): the conversion users get by default is checked.

Converted per device, each of N ranks reads the script's batch b, so a step of the job trains on N * b samples; its
reference is the original on one process with every batch size multiplied by N (:mod:`dpmigrate.verify.harness.
batch_scale`), exact for mean losses without batch statistics. A right conversion in each framework is equivalent, a
hand conversion whose Keras workers read b / N does different work, and a script whose batches are cut by hand has
no reference: inconclusive, with the way out. These scripts are ours (the shuffling ones from the shares tests).
"""

from __future__ import annotations

import pytest
from test_verify_shares import PADDLE, TORCH, _tf, _verify

HAND_CUT = '''
    import torch

    torch.manual_seed(0)
    x = torch.randn(64, 3)
    y = x.sum(1, keepdim=True)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for start in range(0, 64, 8):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[start:start + 8]), y[start:start + 8]).backward()
        opt.step()
'''


def _verify_per_device(tmp_path, monkeypatch, original: str, converted: str | None = None, *args: str) -> dict:
    return _verify(tmp_path, monkeypatch, original, converted, ("--batch", "per-device", "--steps", "7"), args)


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "tensorflow", "paddle"])
def test_the_per_device_conversion_trains_like_the_original_with_an_n_times_larger_batch(tmp_path, monkeypatch,
                                                                                        framework):
    original = {"torch": TORCH, "tensorflow": _tf(broken=False), "paddle": PADDLE}[framework]
    data = _verify_per_device(tmp_path, monkeypatch, original, None, "--batch-size", "8")
    assert data["verdict"] == "equivalent", (data["headline"], data["details"])
    assert "--batch per-device" in data["conversion"], data["conversion"]
    assert any(c.startswith("batch x2 (the per-device reference)") for c in data["harness"]), data["harness"]
    check = data["comparison"]["data"]
    assert check["split"] == check["observed"] == 7 and check["sizes"] == [16, [8, 8]], check  # 8 a rank, 16 a step
    assert "disjoint" in data["shares"], data["shares"]


@pytest.mark.slow
def test_a_per_device_conversion_that_leaves_the_keras_batch_global_does_half_the_work(tmp_path, monkeypatch):
    """Each worker of this hand conversion reads b / N (the dataset's batch split over the workers), not b."""
    broken = _tf(broken=True).replace(", seed=1000 + dp.rank()", "")
    data = _verify_per_device(tmp_path, monkeypatch, _tf(broken=False), broken, "--batch-size", "8")
    assert data["verdict"] == "diverges", (data["headline"], data["details"])
    assert data["comparison"]["data"]["sizes"] == [16, [4, 4]], data["comparison"]["data"]


@pytest.mark.slow
def test_batches_cut_by_hand_have_no_per_device_reference_and_say_so(tmp_path, monkeypatch):
    data = _verify_per_device(tmp_path, monkeypatch, HAND_CUT)
    assert data["verdict"] == "inconclusive" and data["exit_code"] == 3, data["headline"]
    assert "no batch size of the original could be multiplied by 2" in data["headline"], data["headline"]


class _Changes:
    def __init__(self):
        self.said: list[str] = []

    def changed(self, what: str) -> None:
        self.said.append(what)


def test_a_batch_size_given_or_defaulted_is_multiplied_and_said_and_other_arguments_are_left_alone():
    from dpmigrate.verify.harness import batch_scale

    def make(sampler, batch_size=1, drop_last=False):
        return sampler, batch_size, drop_last

    changes = _Changes()
    scaled = batch_scale._scale_parameter(make, "batch_size", 4, changes, "BatchSampler", default=1)
    assert scaled("s", 8) == ("s", 32, False) and scaled("s", batch_size=3, drop_last=True) == ("s", 12, True)
    assert scaled("s") == ("s", 4, False)  # the default, scaled too
    assert scaled("s", None) == ("s", None, False)  # no batch: nothing to scale
    assert changes.said == ["batch x4 (the per-device reference): BatchSampler"] * 3


def test_verify_checks_the_per_device_conversion_unless_asked_for_the_global_one():
    from dpmigrate.verify.cli import _per_device

    assert _per_device(("--batch", "per-device")) and _per_device(("--sync-batchnorm",))
    assert not _per_device(("--batch", "global", "--sync-batchnorm"))
