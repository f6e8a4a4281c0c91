"""Keras calls every worker must make, found under a rank condition."""

from __future__ import annotations

from ...codemod import patterns as m
from ...codemod.ranks import RankAnalysis
from ...codemod.rule import Rule
from ._keras import KerasFile, owner_name

_ALL_WORKERS = ("save", "save_weights", "fit", "evaluate", "predict", "train_on_batch", "test_on_batch")


class KerasRankDivergence(Rule):
    """Report ``model.save``/``save_weights``/``fit``/``evaluate``/``predict`` of a Keras model under a rank condition.

    Why: under ``MultiWorkerMirroredStrategy`` these run collectives (saving included: the opposite
    of torch's rank-0 save), so a call on the chief only leaves the others waiting: the job aborts
    with a collective mismatch or hangs. Only file writes are chief-only, and ``dp.save`` /
    ``ModelCheckpoint`` already do that.
    Example (error):  if dp.is_main_process():
                          model.save(path)        # every worker must call it
    Reported as errors even in files otherwise left unchanged (strategies written by hand).
    Leaves alone: the code itself; the fix needs the author's intent.
    """

    name = "keras-rank-divergent-code"
    checks_only = True

    def finish(self) -> None:
        keras = self.ctx.analysis(KerasFile)
        ranks = self.ctx.analysis(RankAnalysis)
        for call in self.q.findall(self.ctx.module, m.Call(func=m.Attribute(attr=m.OneOf(*map(m.Name, _ALL_WORKERS))))):
            name = owner_name(call)
            if name not in keras.model_names:
                continue
            guard = ranks.rank_condition(call)
            if guard is None:
                continue
            method = call.func.attr.value
            fix = (f"call it on every worker, outside the condition: dp.save({name}, path) writes on the chief only"
                   if method.startswith("save") else "call it on every worker, outside the condition")
            self.report(call, "error", f"{name}.{method}(...) runs collectives every worker must join under the "
                        f"strategy, but it is under `{ranks.describe(guard)}`: the other workers never call it and the "
                        "job hangs", fix)
