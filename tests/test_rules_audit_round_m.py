"""Issue 19, audit round M: shapes of real Paddle scripts the conversion reported wrongly, each as our own script.

- an IMDB classifier built its DataLoaders in a function (``def get_data_loader(mode): ... return loader``) and
  handed the returned loader to ``paddle.Model.fit`` with no ``batch_size``: under ``--batch global`` (the mode
  ``dpmigrate verify`` converts with) the report declined the ``fit`` for "the default batch size of 1", while
  the same report had sharded that loader and scaled its own batch size, and ``fit`` ignores ``batch_size`` for a
  DataLoader. The training was right; the report said a site was left undone that was done.
- the same classifier, prepared with a loss and no metric, evaluated a DataLoader in ``fit(train, eval_loader)``:
  left whole (its loss is then exact), with a note calling that correct; but ``paddle.Model`` gathers every
  rank's outputs, and printed "Eval samples: 256" for 128 (measured on 2 ranks). The note now says so.
"""

from __future__ import annotations

from rule_testing import convert_text, findings_of

RETURNED_LOADER = """\
    import numpy as np
    import paddle


    class Reviews(paddle.io.Dataset):
        def __init__(self, n):
            self.x = np.arange(n * 4, dtype="float32").reshape(n, 4)
            self.y = (np.arange(n) % 2).astype("int64").reshape(n, 1)

        def __getitem__(self, i):
            return self.x[i], self.y[i]

        def __len__(self):
            return len(self.x)


    def get_data_loader(n):
        loader = paddle.io.DataLoader(Reviews(n), batch_size=8, shuffle=True, drop_last=True)
        return loader


    train_loader = get_data_loader(64)
    model = paddle.Model(paddle.nn.Linear(4, 2))
    model.prepare(paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters()), paddle.nn.CrossEntropyLoss())
    model.fit(train_loader, epochs=1, verbose=0)
    model.fit(Reviews(32), epochs=1, verbose=0)
    """


def test_fit_on_a_loader_a_function_returns_is_not_declined_for_its_batch_size():
    result = convert_text(RETURNED_LOADER, batch="global")
    [scaled] = findings_of(result, "paddle-global-batch-size", "change")
    assert scaled.line == 18 and "dp.per_rank_batch_size(8)" in result.output.decode()
    # only the fit on a Dataset, whose batch size is fit's own default of 1, is declined
    [declined] = findings_of(result, "paddle-global-batch-size", "declined")
    assert declined.line == 26 and "default batch size of 1" in declined.message


NO_METRIC = """\
    import paddle

    train_set = paddle.io.TensorDataset([paddle.rand([64, 4]), paddle.randint(0, 2, [64, 1])])
    test_set = paddle.io.TensorDataset([paddle.rand([32, 4]), paddle.randint(0, 2, [32, 1])])
    train_loader = paddle.io.DataLoader(train_set, batch_size=8, shuffle=True)
    test_loader = paddle.io.DataLoader(test_set, batch_size=8)
    predict_loader = paddle.io.DataLoader(test_set, batch_size=8)
    model = paddle.Model(paddle.nn.Linear(4, 2))
    model.prepare(paddle.optimizer.Adam(parameters=model.parameters()), paddle.nn.CrossEntropyLoss())
    model.fit(train_loader, test_loader, epochs=1)
    model.predict(predict_loader)
    """


def test_an_evaluation_loader_left_whole_says_paddle_counts_its_samples_on_every_rank():
    result = convert_text(NO_METRIC)
    notes = {f.line: f.message for f in findings_of(result, "paddle-shard-training-loader", "note")}
    assert "left whole, every rank evaluates all of it" in notes[6]
    assert "'Eval samples' count it prints is about N times the loader's (its loss is exact)" in notes[6]
    assert "left whole" in notes[7] and "Eval samples" not in notes[7]  # predict gathers no count

