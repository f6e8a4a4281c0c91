"""What the high-level API (``paddle.Model``) does per rank that a script may rely on: reported with the fix."""

from __future__ import annotations

import libcst as cst

from ...codemod.calls import argument
from ...codemod.rule import Rule
from ._analyses import HighLevelModels

_CALLBACKS = {  # callbacks deciding on a monitored figure, and where the monitor is given
    "EarlyStopping": (0, "monitor"), "ReduceLROnPlateau": (0, "monitor"),
}
_PREFIXES = ("paddle.callbacks.", "paddle.hapi.callbacks.")


class PaddleHighLevelChecks(Rule):
    """Decline a ``paddle.Model`` set-up that trains differently on N ranks: a summed loss, a callback on the loss.

    Why: (measured with Paddle 3.3.1 under a launcher) ``evaluate`` returns each rank's own loss (the metrics are
    gathered over the ranks), so ``EarlyStopping('loss')`` / ``ReduceLROnPlateau('loss')`` decide per rank: one
    rank stops (or lowers its rate) while the others go on, and the job hangs in the next step (or the ranks
    train with different rates). And ``prepare(loss=CrossEntropyLoss(reduction="sum"))`` under ``--batch global``
    sums B/N samples per rank while DataParallel averages the ranks' gradients: every step moves 1/N as far
    (Adam hides it; SGD shows it), silently.
    Example (declined):  paddle.callbacks.EarlyStopping("loss", patience=1)
    fix: monitor a metric the API gathers over the ranks ("acc"), or stop after a fixed number of epochs.
    Leaves alone: callbacks monitoring a metric; a summed loss under ``--batch per-device`` (each rank sums B
    samples, as the original did, and the average of the sums has the original's scale).
    """

    name = "paddle-high-level-checks"
    generations = ("dygraph",)

    def finish(self) -> None:
        high_level = self.ctx.analysis(HighLevelModels)
        if not high_level.constructions:
            return
        for call in self.q.index.of_type(self.ctx.module, cst.Call):
            name = next((n for p in _PREFIXES for n in _CALLBACKS if self.q.is_call_to(call, {p + n})), None)
            if name is not None:
                self._callback(call, name)
        if self.ctx.options.batch == "global":
            for prepare in high_level.of("prepare"):
                self._summed_loss(prepare.call)

    def _callback(self, call: cst.Call, name: str) -> None:
        position, keyword = _CALLBACKS[name]
        monitor = argument(call, position, keyword)
        value = monitor.value if monitor is not None else None
        if value is not None and not (isinstance(value, cst.SimpleString) and "loss" in value.evaluated_value):
            return  # a metric (gathered over the ranks) or a name it cannot read: left as it is
        self.report(call, "declined", f"{name} monitors the evaluation loss, which paddle.Model computes on each "
                    "rank's own share of the data under a launcher: the ranks can decide differently (one stops or "
                    "lowers its learning rate while the others go on), and the job hangs or the ranks drift apart",
                    f"monitor a metric the high-level API gathers over the ranks ({name}(\"acc\", ...) with "
                    "paddle.metric.Accuracy()), or train a fixed number of epochs")

    def _summed_loss(self, prepare: cst.Call) -> None:
        loss = argument(prepare, 1, "loss")
        if loss is None or not isinstance(loss.value, cst.Call):
            return
        reduction = argument(loss.value, 99, "reduction")
        if reduction is None or not (isinstance(reduction.value, cst.SimpleString)
                                     and reduction.value.evaluated_value == "sum"):
            return
        self.report(loss.value, "declined", "--batch global: this loss sums over each rank's B/N samples and "
                    "paddle.Model's DataParallel averages the ranks' gradients, so every step moves 1/N as far as the "
                    "original's sum over B", "use reduction=\"mean\" (with the learning rate retuned for a mean), or "
                    "convert with --batch per-device (each rank then sums B samples, as the original did)")
