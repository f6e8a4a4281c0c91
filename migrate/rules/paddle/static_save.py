"""Static graph: programs and inference models are written by rank 0 only."""

from __future__ import annotations

import libcst as cst

from ...codemod.ranks import RankAnalysis
from ...codemod.rule import Rule
from .graph_mode import stands_down

_INFERENCE = frozenset({
    "paddle.static.save_inference_model", "paddle.static.io.save_inference_model", "paddle.fluid.io.save_inference_model",
})
_SAVES = _INFERENCE | {  # Paddle 2.x static scripts still call fluid's savers
    "paddle.static.save", "paddle.fluid.io.save_persistables", "paddle.fluid.io.save_params", "paddle.fluid.save",
}


class StaticSave(Rule):
    """Run ``paddle.static.save`` / ``save_inference_model`` (and fluid's savers) on the main process only, then meet.

    Why: launched on N processes every rank would write the same files at once (a torn checkpoint). The
    parameters are the same on every rank, so rank 0 writes them; the ranks then meet (``dp.barrier()``)
    so none reads the files before they are complete. Neither save runs a collective, so only rank 0
    calling it cannot hang the job.
    Example:  paddle.static.save(main_program, "out/mlp")
           -> if dp.is_main_process():
                  paddle.static.save(main_program, "out/mlp")
              dp.barrier()
    PIR (Paddle 3's default) writes an inference model as ``<prefix>.json`` + ``.pdiparams``, not
    ``.pdmodel``: reported, since loaders that look for ``.pdmodel`` will not find it.
    Leaves alone: a save already under a rank condition (reported), or inside a larger expression (declined).
    """

    name = "static-save"
    generations = ("static",)

    def visit_Call(self, node: cst.Call) -> None:
        names = self.q.qualified_names(node.func) & _SAVES if self.q.is_call_to(node, _SAVES) else set()
        if not names or stands_down(self.ctx):
            return
        what = self.code(node.func)
        if names & _INFERENCE:
            self.report(node, "note", f"{what} under PIR (Paddle 3's default) writes <prefix>.json and .pdiparams, "
                        "not .pdmodel (Paddle 2's format)", "a loader that needs .pdmodel (Paddle Inference before "
                        "3.0, Paddle Lite): export in a separate one-process run with FLAGS_enable_pir_api=0")
        ranks = self.ctx.analysis(RankAnalysis)
        guard = ranks.rank_condition(node)
        if guard is not None:
            self.report(node, "note", f"{what} is already under a rank condition (`{ranks.describe(guard)}`): left as it is")
            return
        statement = self.q.statement_of(node)
        if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
                and isinstance(statement.body[0], cst.Expr) and statement.body[0].value is node):
            self.report(node, "declined", f"{what} is part of a larger statement", f"call {what}(...) on a line of its "
                        f"own under `if {self.ctx.alias}.is_main_process():`, followed by dp.barrier()")
            return
        self.ctx.plan.replace(statement, self._guarded)
        self.ctx.plan.insert_after(statement, self.statement("{dp}.barrier()\n"))
        self.report(node, "change", f"{what} on the main process only, then dp.barrier(): one writer, and no rank "
                    "reads the files before they are complete")

    def _guarded(self, updated: cst.SimpleStatementLine) -> cst.If:
        template = self.statement("if {dp}.is_main_process():\n    pass\n")
        inner = updated.with_changes(leading_lines=[])
        return template.with_changes(leading_lines=updated.leading_lines, body=template.body.with_changes(body=[inner]))
