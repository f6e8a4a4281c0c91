"""The reference of a ``--batch per-device`` conversion: the original on 1 process with every batch N times larger.

Converted with ``--batch per-device`` (dpmigrate's default), each of N ranks reads the script's batch ``b``: one
step of the job trains on ``N * b`` samples, as the original would with its batch size multiplied by N (for a mean
loss; batch statistics are each rank's own). So ``dpmigrate verify --batch per-device`` runs the original with
``DPMIGRATE_VERIFY_BATCH_SCALE=N``, and this module multiplies the batch sizes the frameworks are given:

- torch: ``BatchSampler`` (what ``DataLoader(batch_size=...)`` builds, or the script's own);
- Paddle: ``paddle.io.BatchSampler`` (``DataLoader(batch_size=...)``'s, or the script's own);
- TensorFlow: ``Dataset.batch`` and ``padded_batch``, and ``Model.fit``'s ``batch_size`` (32 when not given) for
  arrays.

Batches the script cuts by hand (``x[i:i + bs]``) are not scaled: the comparison then finds the ranks' samples
are not the original's batch, and says so. Each scaling is listed in the record's changes.
"""

from __future__ import annotations

import functools
import inspect
import os

ENV = "DPMIGRATE_VERIFY_BATCH_SCALE"


def factor() -> int:
    """N when this run is a per-device reference, else 1."""
    value = os.environ.get(ENV, "")
    return int(value) if value.isdigit() and int(value) > 1 else 1


def _scale_parameter(function, parameter: str, n: int, recorder, what: str, default=None):
    """``function`` with its ``parameter`` (a positive int, or ``default`` when not given) multiplied by ``n``."""
    signature = inspect.signature(function)

    @functools.wraps(function)
    def scaled(*args, **kwargs):
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:  # the framework will say what is wrong
            return function(*args, **kwargs)
        size = bound.arguments.get(parameter, default)
        if isinstance(size, int) and not isinstance(size, bool) and size > 0:
            bound.arguments[parameter] = size * n
            recorder.changed(f"batch x{n} (the per-device reference): {what}")
        return function(*bound.args, **bound.kwargs)

    return scaled


def install_torch(torch, recorder) -> None:
    n = factor()
    if n > 1:
        data = torch.utils.data
        data.BatchSampler.__init__ = _scale_parameter(data.BatchSampler.__init__, "batch_size", n, recorder,
                                                      "BatchSampler")


def install_paddle(paddle, recorder) -> None:
    n = factor()
    if n > 1:
        io = paddle.io
        io.BatchSampler.__init__ = _scale_parameter(io.BatchSampler.__init__, "batch_size", n, recorder,
                                                    "BatchSampler", default=1)


def install_tensorflow(tf, recorder) -> None:
    n = factor()
    if n > 1:
        from tensorflow.python.data.ops import dataset_ops

        for name in ("batch", "padded_batch"):
            setattr(dataset_ops.DatasetV2, name, _scale_parameter(getattr(dataset_ops.DatasetV2, name), "batch_size",
                                                                  n, recorder, f"Dataset.{name}"))


def install_keras_fit(model_class, tf, recorder) -> None:
    """``fit``'s ``batch_size`` for arrays (a dataset, generator or ``Sequence`` brings its own batches)."""
    n = factor()
    if n <= 1 or model_class is None:
        return
    fit = model_class.fit
    signature = inspect.signature(fit)

    @functools.wraps(fit)
    def scaled_fit(self, *args, **kwargs):
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:
            return fit(self, *args, **kwargs)
        x = bound.arguments.get("x")
        if hasattr(x, "shape") or isinstance(x, (list, tuple, dict)):
            size = bound.arguments.get("batch_size") or 32
            bound.arguments["batch_size"] = size * n
            recorder.changed(f"batch x{n} (the per-device reference): Model.fit(batch_size={size * n})")
        return fit(*bound.args, **bound.kwargs)

    model_class.fit = scaled_fit
