"""Issue 19, audit round P: a shape of real Paddle scripts the report said nothing about, as our own script.

- a course's MNIST notes fed the training loop from a generator of their own (``train_loader = load_data('train')``,
  a nested ``data_generator`` shuffling with ``random.shuffle``) and built a ``paddle.io.DataLoader`` later only to
  print one batch's shapes. Any DataLoader in the file turned the notes about hand-made batches off, so the loop got
  none: only the summary said nothing was split. A DataLoader that only evaluates no longer does.
"""

from __future__ import annotations

from rule_testing import convert_text, findings_of

GENERATOR_AND_A_PEEK = """\
    import random

    import numpy as np
    import paddle


    def load_data(count):
        images = np.arange(count * 4, dtype="float32").reshape(count, 4)
        labels = np.arange(count, dtype="float32").reshape(count, 1)
        order = list(range(count))

        def data_generator():
            random.shuffle(order)
            for start in range(0, count, 8):
                picked = order[start:start + 8]
                yield images[picked], labels[picked]
        return data_generator


    model = paddle.nn.Linear(4, 1)
    train_loader = load_data(64)
    opt = paddle.optimizer.SGD(learning_rate=0.001, parameters=model.parameters())
    for epoch in range(2):
        for batch_id, (x, y) in enumerate(train_loader()):
            loss = paddle.mean((model(paddle.to_tensor(x)) - paddle.to_tensor(y)) ** 2)
            loss.backward()
            opt.step()
            opt.clear_grad()

    peek = paddle.io.DataLoader(paddle.io.TensorDataset([paddle.rand([8, 4])]), batch_size=4)
    for batch in peek:
        print(batch[0].shape)
        break
    """


def test_a_generator_fed_loop_is_noted_even_with_a_dataloader_that_only_evaluates():
    result = convert_text(GENERATOR_AND_A_PEEK)
    [note] = findings_of(result, "paddle-manual-batching", "note")
    assert note.line == 24 and "every rank draws the same batches" in note.message and "no speed-up" in note.message
