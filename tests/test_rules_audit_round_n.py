"""Issue 19, audit round N: shapes of real Paddle scripts the conversion got wrong, each as our own script.

- an OCR tutorial's CTC loss built its length tensors from the batch-size constant in ``forward``
  (``paddle.full(shape=[BATCH_SIZE], ...)``) while ``paddle.Model.fit(batch_size=BATCH_SIZE)`` read the batches:
  under ``--batch global`` (the mode ``dpmigrate verify`` converts with) only fit's argument became
  ``dp.per_rank_batch_size(BATCH_SIZE)``, and both ranks failed in the loss ("X=[8] vs Y=[16]") with nothing said.
  The other reads that size a tensor on every batch (in ``forward``, or in a loop: a GAN's labels) are declined
  with the fix; a set-up outside any loop is left alone.
"""

from __future__ import annotations

from rule_testing import convert_text, findings_of

SHAPED_BY_THE_BATCH = """\
    import paddle

    BATCH_SIZE = 8


    class WeightedLoss(paddle.nn.Layer):
        def forward(self, pred, label):
            weights = paddle.full(shape=[BATCH_SIZE], fill_value=1.0, dtype="float32")
            return paddle.mean(weights * ((pred - label) ** 2).squeeze(-1))


    data = paddle.io.TensorDataset([paddle.rand([BATCH_SIZE * 4, 4]), paddle.rand([BATCH_SIZE * 4, 1])])
    model = paddle.Model(paddle.nn.Linear(4, 1))
    model.prepare(paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters()), WeightedLoss())
    model.fit(data, batch_size=BATCH_SIZE, epochs=1, verbose=0, drop_last=True)
    """

GAN_LABELS = """\
    import paddle

    def train(args, generator, discriminator, loader):
        opt = paddle.optimizer.Adam(parameters=discriminator.parameters())
        for real in loader:
            real_label = paddle.full([args.batch_size, 1], 1.0)
            loss = paddle.nn.functional.binary_cross_entropy_with_logits(discriminator(real), real_label)
            loss.backward()
            opt.step()
            opt.clear_grad()

    def main(args):
        loader = paddle.io.DataLoader(paddle.io.TensorDataset([paddle.rand([64, 4])]), batch_size=args.batch_size,
                                      drop_last=True)
        train(args, None, paddle.nn.Linear(4, 1), loader)
    """


def test_the_global_batch_sizing_a_tensor_in_forward_is_declined_with_the_fix():
    result = convert_text(SHAPED_BY_THE_BATCH, batch="global")
    [declined] = findings_of(result, "paddle-global-batch-size", "declined")
    assert (declined.line, declined.col) == (8, 38) and "`BATCH_SIZE` sizes a tensor here (paddle.full(...))" in declined.message
    assert "dp.per_rank_batch_size(BATCH_SIZE) here" in declined.fix
    # the data set's size outside any loop is a set-up, not a batch: left alone
    assert "paddle.rand([BATCH_SIZE * 4, 4])" in result.output.decode()
    assert not findings_of(convert_text(SHAPED_BY_THE_BATCH), "paddle-global-batch-size", "declined")  # per-device


def test_the_global_batch_sizing_labels_in_a_training_loop_is_declined():
    result = convert_text(GAN_LABELS, batch="global")
    [declined] = findings_of(result, "paddle-global-batch-size", "declined")
    assert declined.line == 6 and "`args.batch_size` sizes a tensor here" in declined.message
    assert "batch_size=dp.per_rank_batch_size(args.batch_size)" in result.output.decode()
