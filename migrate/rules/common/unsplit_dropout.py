"""Dropout while nothing splits the training data: each rank draws its own masks over the same samples."""

from __future__ import annotations

import libcst as cst

from ...codemod.rule import Rule

SPLITTING_EFFECTS = frozenset({"shard", "split-batch"})
_OFF = ("0", "0.0", "0.", "None", "False")


class UnsplitDropout(Rule):
    """Note the first dropout of a training script whose conversion splits no training data.

    Why: with nothing split, every rank trains on the batches one process would (a full batch, hand-cut batches,
    one sample broadcast to every rank: the autograd guide of issue 19's round Q), and the averaged gradient is the
    original's only if the ranks also compute alike. Dropout draws a new mask on each rank, so a step averages N
    masks of the same samples where one process drew one: alike in expectation, not the same numbers, and
    ``dpmigrate verify`` (which turns dropout off to compare) cannot show it. Said once, at the first dropout layer
    or call (the framework's ``Dropout`` classes and ``functional.dropout``, a library model with dropout inside
    such as ``vgg11()``, or a layer given ``dropout=`` other than 0), with the fix: draw the masks alike (the same
    seed on every rank) or give each rank its part of the data.
    Example (note):  x = dp.broadcast(paddle.rand([1, 12]))  and  self.drop = nn.Dropout(0.5)
                     -> dropout while nothing in this file splits the training data: ... paddle.seed(0)
    Leaves alone: files whose conversion shards or splits their data (each rank's masks then fall on its own
    samples, as one process's fall on each sample); files that seed the framework's generator (alike on every rank,
    so are the masks); files with local modules converted beside them (their data may be split there); files with
    no dropout in sight (a model built in another module); a dropout built only under a test of its own rate
    (``nn.Dropout(p) if p > 0 else None``: the rate may be 0).
    Runs after every rule that splits data (last of the rule set), reading their findings.
    """

    name = "unsplit-dropout"

    def finish(self) -> None:
        vocabulary = self.vocabulary
        if not vocabulary.dropout_calls or not self.q.is_training_script() or self.ctx.options.local_modules:
            return
        if self.ctx.generation == "static":
            return  # (Paddle's static-graph rules split data after the dygraph ones: not read here)
        if any(f.effect in SPLITTING_EFFECTS for f in self.ctx.findings):
            return
        seeds = vocabulary.random_seeds | vocabulary.random_seeds_all
        if any(self.q.is_call_to(c, seeds) for c in self.q.index.of_type(self.ctx.module, cst.Call)):
            return  # every rank seeds its generator alike: the masks are alike too
        first = next((c for c in self.q.index.of_type(self.ctx.module, cst.Call)
                      if self._drops_out(c) and not self._built_if_its_rate(c)), None)
        if first is None:
            return
        seed = vocabulary.seed_call or "the framework's seed"
        self.report(first, "note", "dropout while nothing in this file splits the training data: where the ranks "
                    "train on the same samples, this dropout still draws its own mask on each rank, so a step averages "
                    "N masks of them where one process drew one (alike in expectation, not the same numbers; "
                    "dpmigrate verify turns dropout off to compare)", f"to train exactly as one process, draw the "
                    f"masks alike: the same seed on every rank before training ({seed}(0)); or give each rank "
                    "its part of the data (dp.shard)")

    def _built_if_its_rate(self, call: cst.Call) -> bool:
        """``nn.Dropout(p) if p > 0 else None``: built only for a rate the script may set to 0 (a PTB language model
        of round S set it so): nothing to say for sure."""
        rates = set().union(*(self.q.names_in(a.value) for a in call.args))
        return bool(rates) and any(isinstance(a, (cst.If, cst.IfExp)) and self.q.names_in(a.test) & rates
                                   for a in self.q.ancestors(call))

    def _drops_out(self, call: cst.Call) -> bool:
        if self.q.is_call_to(call, self.vocabulary.dropout_calls | self.vocabulary.dropout_models):
            return True
        if not any(self.q.callee_starts_with(call, p) for p in self.vocabulary.dropout_layer_prefixes):
            return False
        return any(a.keyword is not None and a.keyword.value == "dropout" and not (
            isinstance(a.value, (cst.Integer, cst.Float, cst.Name)) and _literal(a.value) in _OFF) for a in call.args)


def _literal(value: cst.BaseExpression) -> str:
    return value.value if isinstance(value, (cst.Integer, cst.Float, cst.Name)) else ""
