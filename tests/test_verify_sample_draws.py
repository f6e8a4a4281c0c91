"""Augmentation drawn per sample in ``__getitem__`` does not make verify doubt a correct conversion.

The original draws a random flip for the samples of its batch in one order, each rank for its share in another:
before the harness keyed a sample's draws by its index, verify said "inputs-differ" for the Paddle audit's
correct conversion of a script with ``RandomHorizontalFlip`` and ``RandomCrop`` (0.011 after one step; torch's
jitter below: 0.043). Scripts of our own: torch drawing from Python's ``random``, NumPy and torch in the main
process and in DataLoader workers; Paddle through ``paddle.vision.transforms`` on PIL images (its reading
thread). Each must be equivalent with the split proven, and the harness must say what it did.
"""

from __future__ import annotations

import textwrap

import pytest
from verify_cases import explain, verify

pytestmark = pytest.mark.slow

TORCH = '''
    import random
    import sys

    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset


    class Jittered(Dataset):
        def __init__(self):
            g = torch.Generator().manual_seed(0)
            self.x = torch.rand(128, 6, generator=g)
            self.y = self.x.sum(1, keepdim=True)

        def __len__(self):
            return len(self.x)

        def __getitem__(self, i):
            x = self.x[i].flip(0) if random.random() < 0.5 else self.x[i]
            x = x * float(np.random.uniform(0.9, 1.1)) + 0.01 * torch.randn(6)
            return x, self.y[i]


    torch.manual_seed(0)
    model = torch.nn.Linear(6, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = DataLoader(Jittered(), batch_size=16, shuffle=True, num_workers=int(sys.argv[1]))
    for epoch in range(2):
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
'''

PADDLE = '''
    import numpy as np
    import paddle
    from paddle.vision import transforms as T
    from PIL import Image


    class Flipped(paddle.io.Dataset):
        def __init__(self):
            rng = np.random.RandomState(0)
            self.x = (rng.rand(64, 8, 8, 3) * 255).astype("uint8")
            self.y = rng.randint(0, 2, (64, 1)).astype("int64")
            self.t = T.Compose([T.RandomHorizontalFlip(0.5), T.RandomCrop(8, padding=2)])

        def __getitem__(self, i):
            image = self.t(Image.fromarray(self.x[i]))
            return (np.asarray(image, "float32") / 255).transpose(2, 0, 1).copy(), self.y[i]

        def __len__(self):
            return 64


    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Flatten(), paddle.nn.Linear(192, 2))
    opt = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    loader = paddle.io.DataLoader(Flipped(), batch_size=16, shuffle=True)
    for epoch in range(2):
        for x, y in loader:
            loss = paddle.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.clear_grad()
'''

KEYED = "random draws per sample keyed by its index (augmentation alike in both runs)"


def _equivalent_and_split(data: dict) -> None:
    assert data["verdict"] == "equivalent", explain(data)
    check = data["comparison"]["data"]
    assert check["observed"] > 0 and check["split"] == check["observed"], explain(data)


@pytest.mark.parametrize("workers", ["0", "2"])
def test_torch_samples_drawn_from_three_generators_are_augmented_alike_in_both_runs(tmp_path, monkeypatch, workers):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TORCH))
    data = verify(tmp_path, monkeypatch, script, workers, steps=4)
    _equivalent_and_split(data)
    if workers == "0":  # (a worker process records nothing)
        assert KEYED in data["harness"], data["harness"]


def test_paddle_vision_transforms_in_the_reading_thread_are_augmented_alike_in_both_runs(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(PADDLE))
    data = verify(tmp_path, monkeypatch, script, steps=4)
    _equivalent_and_split(data)
    assert KEYED in data["harness"], data["harness"]
