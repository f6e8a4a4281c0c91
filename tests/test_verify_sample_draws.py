"""Augmentation by a library's transforms does not make verify doubt a correct conversion.

The original draws a random flip for the samples of its batch in one order, each rank for its share in another:
before the harness keyed a transform's draws by the sample's index, verify said "inputs-differ" for the Paddle
audit's correct conversion of a script with ``RandomHorizontalFlip`` and ``RandomCrop`` (0.011 after one step).
A script of our own through ``paddle.vision.transforms`` on PIL images (read in Paddle's reading thread, and in
worker processes): equivalent with the split proven, the harness saying what it did. Draws the script's own
``__getitem__`` makes are not keyed: ``fixtures/paddle/random_samples_seeded`` (a Dataset ignoring its index,
seeded alike, its streams parted at the sharded loader's first pass) must still be found to read samples of its
own (inputs-differ), as its ``execute.json`` says.
"""

from __future__ import annotations

import textwrap

import pytest
from verify_cases import explain, verify

pytestmark = pytest.mark.slow

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

KEYED = "augmentation keyed by the sample's index (paddle.vision transforms: alike in both runs)"


def _equivalent_and_split(data: dict) -> None:
    assert data["verdict"] == "equivalent", explain(data)
    check = data["comparison"]["data"]
    assert check["observed"] > 0 and check["split"] == check["observed"], explain(data)


@pytest.mark.parametrize("workers", ["0", "2"])
def test_paddle_vision_transforms_are_augmented_alike_in_both_runs(tmp_path, monkeypatch, workers):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(PADDLE).replace("shuffle=True)", f"shuffle=True, num_workers={workers})"))
    data = verify(tmp_path, monkeypatch, script, steps=4)
    _equivalent_and_split(data)
    if workers == "0":  # (a worker process records nothing)
        assert KEYED in data["harness"], data["harness"]
