"""``dpmigrate verify``'s shares pass (issue 32, blind spot 2): with the script's shuffling on, each rank reads its own
share of every epoch.

The weight comparison turns shuffling off, so ranks that shuffle each their own way before taking their part read
disjoint parts there and overlapping ones in the real run. The pass runs the conversion once more with shuffling on
and checks the ranks' sample fingerprints over the first epoch. Each framework has a right conversion (the one
dpmigrate makes: equivalent, the shares said disjoint) and, for torch and TensorFlow, a broken one whose shuffle is
seeded by the rank (equal weights with shuffling off, overlapping shares with it on). These scripts are ours.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from dpmigrate.verify import dumps, shares
from dpmigrate.verify.cli import main


def _record(batches: list[list[str] | None], source: str = "loader") -> dumps.Record:
    inputs = [None if b is None else dumps.Inputs(source, {"0": b}) for b in batches]
    return dumps.Record(rank=0, world_size=1, framework="torch", parameters=[], snapshots=[], steps=len(batches),
                        optimizers=1, inputs=inputs, stop="steps", batchnorm=[], changes=[])


ORIGINAL = _record([["a", "b"], ["c", "d"], ["e", "f"], ["a", "b"], ["c", "d"]])  # a 3-step epoch, then again


def test_the_original_s_first_epoch_ends_where_its_first_batch_comes_again():
    assert shares.first_epoch(ORIGINAL) == 3
    assert shares.first_epoch(_record([["a", "b"], ["c", "d"], ["e", "f"]])) is None
    assert shares.first_epoch(_record([["a"], ["a", "b"], ["a"]])) == 2  # the whole batch, in order, not one sample
    assert shares.first_epoch(_record([["z"], ["z"]], source="model")) is None  # a model's inputs are not the data


def test_disjoint_shares_covering_the_epoch_pass_and_say_so():
    found = shares.check(ORIGINAL, [_record([["f"], ["a"], ["d"], ["x"]]), _record([["c"], ["e"], ["b"], ["y"]])])
    assert found.cause is None and found.epoch_complete and found.steps == 3
    assert (found.distinct, found.original, found.overlap, found.per_rank) == (6, 6, 0, [3, 3])
    assert "disjoint" in found.line and "6 different samples" in found.line


def test_a_sample_on_two_ranks_is_overlapping_shares_with_the_count():
    found = shares.check(ORIGINAL, [_record([["f"], ["a"], ["d"]]), _record([["a"], ["e"], ["f"]])])
    assert found.cause is not None and found.cause.kind == "overlapping-shares"
    assert found.overlap == 2 and found.distinct == 4
    assert "2 of the 4 samples read in the first epoch (3 steps)" in found.cause.message


def test_a_sampler_s_padding_is_allowed_once_the_epoch_is_complete_but_not_within_it():
    padded = [_record([["a"], ["b"], ["c"]]), _record([["d"], ["e"], ["a"]])]  # epoch of 5 on 2 ranks: 1 repeated
    original = _record([["a", "b"], ["c", "d"], ["e"], ["a", "b"]])
    found = shares.check(original, padded)
    assert found.cause is None and "1 read twice" in found.line
    unfinished = shares.check(_record([["a", "b"], ["c", "d"], ["e", "f"]]), padded)  # no epoch seen: no padding
    assert unfinished.cause is not None and unfinished.cause.kind == "overlapping-shares"


def test_ranks_that_read_fewer_different_samples_than_the_epoch_leave_samples_out():
    found = shares.check(ORIGINAL, [_record([["a"], ["b"], ["c"]]), _record([["d"], ["e"], ["x"]])])
    assert found.cause is None  # x for f: shuffled, drop_last leaves out other samples than unshuffled; as many
    short = shares.check(ORIGINAL, [_record([["a"], ["b"], None]), _record([["d"], ["e"], None])])
    assert short.steps == 2 and short.cause is not None and short.cause.kind == "uncovered-samples"


def test_steps_whose_inputs_were_made_by_a_model_are_not_the_data():
    found = shares.check(ORIGINAL, [_record([["a"]] * 3, source="model"), _record([["a"]] * 3, source="model")])
    assert found.cause is None and found.steps == 0 and "not proven" in found.line


TORCH = '''
    import argparse

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=16)
    opts = parser.parse_args()
    torch.manual_seed(0)
    features = torch.randn(96, 5)
    targets = features @ torch.arange(1.0, 6.0).unsqueeze(1)
    loader = DataLoader(TensorDataset(features, targets), batch_size=opts.batch_size, shuffle=True)
    model = nn.Linear(5, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(3):
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
'''

TORCH_SEEDED_BY_RANK = '''
    import argparse

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    import dpmigrate.runtime.torch as dp

    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=16)
    opts = parser.parse_args()
    dp.init()
    torch.manual_seed(0)
    features = torch.randn(96, 5)
    targets = features @ torch.arange(1.0, 6.0).unsqueeze(1)
    data = TensorDataset(features, targets)
    sampler = DistributedSampler(data, num_replicas=dp.world_size(), rank=dp.rank(), shuffle=True, seed=dp.rank())
    loader = DataLoader(data, batch_size=dp.per_rank_batch_size(opts.batch_size), sampler=sampler)
    model = dp.distributed_model(nn.Linear(5, 1))
    optimizer = dp.distributed_optimizer(torch.optim.SGD(model.parameters(), lr=0.05))
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
'''

TENSORFLOW = '''
    import argparse

    import numpy as np
    import tensorflow as tf
    {runtime}
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=16)
    opts = parser.parse_args()
    {init}
    rng = np.random.default_rng(0)
    features = rng.normal(size=(96, 5)).astype("float32")
    targets = features @ np.arange(1.0, 6.0, dtype="float32")[:, None]
    data = tf.data.Dataset.from_tensor_slices((features, targets)).shuffle(96{seed}).batch(opts.batch_size)
    {scope}
    model = tf.keras.Sequential([tf.keras.Input((5,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
    {wrap}
    model.fit(data, epochs=3, verbose=0)
'''

PADDLE = '''
    import argparse

    import numpy as np
    import paddle
    from paddle.io import DataLoader, TensorDataset

    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=16)
    opts = parser.parse_args()
    paddle.seed(0)
    features = paddle.randn([96, 5])
    targets = paddle.matmul(features, paddle.arange(1.0, 6.0).unsqueeze(1))
    loader = DataLoader(TensorDataset([features, targets]), batch_size=opts.batch_size, shuffle=True)
    model = paddle.nn.Linear(5, 1)
    optimizer = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    for epoch in range(3):
        for x, y in loader:
            loss = paddle.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()
'''


def _tf(broken: bool) -> str:
    if not broken:
        return TENSORFLOW.format(runtime="", init="", seed="", scope="", wrap="")
    return TENSORFLOW.format(  # a hand conversion that seeds each worker's shuffle with its rank
        runtime="import dpmigrate.runtime.tensorflow as dp", init="dp.init()\n    dp.enter_scope()",
        seed=", seed=1000 + dp.rank()", scope="", wrap="model = dp.distributed_model(model)")


def _verify(tmp_path, monkeypatch, original: str, converted: str | None = None, flags: tuple[str, ...] = ("--steps", "12"),
            args: tuple[str, ...] = ("--batch-size", "16")) -> dict:
    """``dpmigrate verify`` of ``original`` (against a ``converted`` one when given) on 2 processes; its JSON report."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(textwrap.dedent(original))
    against = []
    if converted is not None:
        (tmp_path / "hand").mkdir()
        (tmp_path / "hand" / "train.py").write_text(textwrap.dedent(converted))
        against = ["--against", str(tmp_path / "hand" / "train.py")]
    report = tmp_path / "verify.json"
    code = main(["train.py", *against, *flags, "-n", "2", "--to-end", "0", "--timeout", "300", "--report", "json",
                 "--report-file", str(report), "--", *args])
    data = json.loads(report.read_text())
    assert data["exit_code"] == code, data
    return data


def _causes(data: dict) -> list[str]:
    return [c["kind"] for c in (data["comparison"] or {}).get("causes", [])]


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "tensorflow", "paddle"])
def test_dpmigrates_conversion_of_a_shuffling_script_reads_disjoint_shares_of_every_epoch(tmp_path, monkeypatch,
                                                                                         framework):
    original = {"torch": TORCH, "tensorflow": _tf(broken=False), "paddle": PADDLE}[framework]
    data = _verify(tmp_path, monkeypatch, original)
    assert data["verdict"] == "equivalent", (data["headline"], data["shares"], data["details"])
    assert data["shares"].startswith("shuffled: the ranks' shares of the first epoch (6 steps) are disjoint"), data
    assert "96 different samples as the original's epoch (48 + 48 samples)" in data["shares"], data
    assert any(change.startswith("shuffling off") for change in data["harness"]), data["harness"]


@pytest.mark.slow
@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_a_shuffle_seeded_by_the_rank_matches_with_shuffling_off_and_is_caught_with_it_on(tmp_path, monkeypatch,
                                                                                         framework):
    original, broken = {"torch": (TORCH, TORCH_SEEDED_BY_RANK), "tensorflow": (_tf(False), _tf(True))}[framework]
    data = _verify(tmp_path, monkeypatch, original, broken)
    assert data["verdict"] == "diverges" and _causes(data) == ["overlapping-shares"], (data["headline"], data["shares"])
    assert "the weights match with shuffling off" in data["headline"], data["headline"]
    check = data["comparison"]["data"]
    assert check["split"] == check["observed"] == 12  # the unshuffled comparison alone saw a right split


def test_a_rank_that_reads_a_sample_twice_in_the_window_leaves_the_shares_unjudged():
    """A batch peeked at before training, or repeat() before shuffle: one process reads repeats there too."""
    found = shares.check(_record([["a", "b"], ["c", "d"], ["e", "f"]]),
                         [_record([["a", "x"], ["a"], ["d"]]), _record([["x"], ["e"], ["f"]])])
    assert found.cause is None and found.line.startswith("shuffled: rank 0 read a sample twice"), found.line


def test_repeats_the_script_reads_by_design_leave_the_shares_unjudged_wherever_they_land():
    """repeat() before shuffle: the same job reads a repeat on one rank, the next on two; neither is a verdict."""
    original = _record([["a", "b"], ["c", "d"], ["e", "f"]])
    across = [_record([["a"], ["c"], ["e"]]), _record([["b"], ["a"], ["f"]])]  # a repeat on the other rank
    assert shares.check(original, across).cause is not None  # without the note: taken for overlapping shares
    across[1].repeats = ["Dataset.shuffle after repeat()"]
    found = shares.check(original, across)
    assert found.cause is None and "not judged" in found.line and "Dataset.shuffle after repeat()" in found.line


SAMPLERS = """
import sys
from dpmigrate.verify.harness import repeats

class Notes:
    def __init__(self):
        self.repeats = {}
    def repeats_samples(self, what):
        self.repeats.setdefault(what)

notes = Notes()
if sys.argv[1] == "tensorflow":
    import tensorflow as tf
    repeats.install_tensorflow(notes)
    tf.data.Dataset.range(8).shuffle(8).repeat()  # shuffled within each epoch: no note
    assert not notes.repeats, notes.repeats
    tf.data.Dataset.range(8).map(lambda x: x + 1).repeat().batch(2).shuffle(4)
else:
    io = __import__("torch.utils.data" if sys.argv[1] == "torch" else "paddle.io", fromlist=["x"])
    repeats.install_samplers(io, notes)
    list(iter(io.RandomSampler(list(range(8)))))  # a permutation: no note
    assert not notes.repeats, notes.repeats
    list(iter(io.RandomSampler(list(range(8)), replacement=True, num_samples=8)))
    list(iter(io.WeightedRandomSampler([1.0] * 8, 8)))
print(sorted(notes.repeats))
"""


@pytest.mark.parametrize("framework, noted", [
    ("torch", ["RandomSampler(replacement=True)", "WeightedRandomSampler(replacement=True)"]),
    ("paddle", ["RandomSampler(replacement=True)", "WeightedRandomSampler(replacement=True)"]),
    ("tensorflow", ["Dataset.shuffle after repeat()"]),
])
def test_the_harness_notes_the_data_idioms_that_repeat_samples_and_not_a_plain_shuffle(framework, noted):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", SAMPLERS, framework], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == repr(noted)


# The executed fixtures that shuffle keep their verdict with the shares pass on: their execute.json's "shares" says
# what the pass must find, checked by the fixture's own verify (tests/verify_cases.py), one verify per fixture.
