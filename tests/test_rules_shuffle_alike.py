"""Hand-cut batches after an unseeded shuffle: made alike on every rank, or declined (torch and Paddle alike).

Measured before the change with ``dpmigrate verify``: a torch script shuffling a NumPy table each epoch and
slicing batches from it got the note "every rank reads all the data, which is correct" while each rank cut
other batches (a 1.06x update); the Paddle twin was declined. The executed proofs (weights equal to the
original's, 0.0) are the fixtures ``torch/shuffled_hand_batches`` and ``paddle/manual_batches_shuffled``.
"""

from __future__ import annotations

import pytest
from rule_testing import convert_text, findings_of

TORCH = """
import numpy as np
import torch
data = np.ones((40, 5), dtype=np.float32)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for epoch in range(3):
    {shuffle}
    for k in range(0, len(data), 10):
        rows = torch.from_numpy(data[k:k + 10])
        loss = model(rows[:, :4]).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""

PADDLE = """
import random
import numpy as np
import paddle
data = np.ones((40, 5), dtype=np.float32)
rows = list(range(40))
model = paddle.nn.Linear(4, 1)
opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
for epoch in range(3):
    {shuffle}
    batches = [data[k:k + 10] for k in range(0, len(data), 10)]
    for batch in batches:
        loss = model(paddle.to_tensor(batch[:, :4])).sum()
        loss.backward()
        opt.step()
        opt.clear_grad()
"""

ALIGNED = {
    "numpy shuffle": ("np.random.shuffle(data)", "np.random.set_state(dp.broadcast(np.random.get_state()))"),
    "numpy permutation": ("data = data[np.random.permutation(len(data))]",
                          "np.random.set_state(dp.broadcast(np.random.get_state()))"),
    "python shuffle": ("random.shuffle(rows)", "random.setstate(dp.broadcast(random.getstate()))"),
}


@pytest.mark.parametrize("shuffle,aligned", ALIGNED.values(), ids=ALIGNED.keys())
@pytest.mark.parametrize("framework", ["torch", "paddle"])
def test_an_unseeded_shuffle_is_made_alike_just_before_it(framework, shuffle, aligned):
    source = (TORCH if framework == "torch" else PADDLE).format(shuffle=shuffle)
    if framework == "torch":
        source = "import random\n" + source
    result = convert_text(source)
    text = result.output.decode()
    assert f"    {aligned}\n    {shuffle}\n" in text  # the line right before the shuffle, in the epoch loop
    rule = "manual-batching" if framework == "torch" else "paddle-manual-batching"
    assert not findings_of(result, rule, "declined")
    [note] = findings_of(result, rule, "note")
    assert "correct" in note.message and "no speed-up" in note.message
    assert any("shuffles alike on every rank" in f.message for f in findings_of(result, rule, "change"))


def test_torch_randperm_on_the_cpu_generator_is_made_alike():
    source = TORCH.replace("for k in range(0, len(data), 10):", "for k in torch.randperm(4).tolist():").format(
        shuffle="pass")
    text = convert_text(source).output.decode()
    assert "torch.set_rng_state(dp.broadcast(torch.get_rng_state()))\n    for k in torch.randperm(4)" in text


def test_a_seeded_shuffle_is_left_as_it_is():
    result = convert_text("import numpy as np\nnp.random.seed(0)\n" + TORCH.format(shuffle="np.random.shuffle(data)"))
    assert b"set_state" not in result.output
    [note] = findings_of(result, "manual-batching", "note")
    assert "correct" in note.message


DECLINED = {
    "torch: a shuffle called by its bare name": (TORCH, "from numpy.random import shuffle\n", "shuffle(data)",
                                                 "manual-batching"),
    "torch: randperm on a device's generator": (TORCH, "", "order = torch.randperm(40, device='cuda')",
                                                "manual-batching"),
    "paddle: paddle.randperm": (PADDLE, "", "order = paddle.randperm(40)", "paddle-manual-batching"),
    "paddle: batches picked with np.random.randint": (PADDLE, "", "pick = np.random.randint(0, 40, 10)",
                                                      "paddle-manual-batching"),
}


@pytest.mark.parametrize("template,prefix,shuffle,rule", DECLINED.values(), ids=DECLINED.keys())
def test_a_shuffle_that_cannot_be_made_alike_is_declined(template, prefix, shuffle, rule):
    result = convert_text(prefix + template.format(shuffle=shuffle))
    [declined] = findings_of(result, rule, "declined")
    assert "N different batches" in declined.message and "dp.shard" in declined.fix
    assert b"set_state" not in result.output and b"set_rng_state" not in result.output
