"""Dygraph checkpoints written once, atomically, by rank 0; inference models exported once."""

from __future__ import annotations

import libcst as cst

from ...codemod.calls import argument
from ...codemod.models import Models
from ...codemod.ranks import RankAnalysis
from ...codemod.rule import Rule
from .graph_mode import stands_down

JIT_SAVE = {"paddle.jit.save", "paddle.jit.api.save"}


class PaddleDistributedSave(Rule):
    """Replace ``paddle.save(obj, path)`` with ``dp.save(obj, path)``; export ``paddle.jit.save`` once.

    Why: launched on N processes, every rank would write the same file at once (a torn checkpoint).
    ``dp.save`` writes on rank 0 only, atomically (a temporary file, then a rename), and then all ranks
    meet, so none reads it before it is complete. ``fleet.distributed_model``'s ``state_dict()`` has the
    layer's own keys, so the checkpoint loads into the original single-card script.
    Example:  paddle.save(model.state_dict(), "mlp.pdparams")  ->  dp.save(model.state_dict(), "mlp.pdparams")
              paddle.jit.save(model, "infer/mlp", input_spec=spec)
           -> if dp.is_main_process():
                  paddle.jit.save(dp.unwrap(model), "infer/mlp", input_spec=spec)
              dp.barrier()
    ``paddle.jit.save`` traces the layer itself (``dp.unwrap``: not the DataParallel wrapper) on the main
    process; the barrier keeps the other ranks from loading it before it is written.
    Unsafe when: only some ranks reach the line (``dp.save`` and the barrier are meeting points; the
    ``rank-divergent-code`` check reports such saves).
    Leaves alone (declined): a save already under a rank condition (``if rank == 0:``); a whole wrapped
    model (``paddle.save(model, ...)``: save its ``state_dict()``); a ``paddle.jit.save`` that is not a
    statement of its own; ``paddle.jit.save`` in static-graph files and anything in fluid files (the static
    rules). ``paddle.save`` of a static program's ``state_dict()`` becomes ``dp.save`` too (it works in static mode).
    """

    name = "paddle-distributed-save"
    generations = ("dygraph", "static")

    def visit_Call(self, node: cst.Call) -> None:
        if self.ctx.generation == "static" and stands_down(self.ctx):
            return
        if self.q.is_call_to(node, self.vocabulary.save_calls):
            self._save(node)
        elif self.q.is_call_to(node, JIT_SAVE) and self.ctx.generation == "dygraph":
            self._jit_save(node)

    def _guarded(self, node: cst.Call, what: str) -> bool:
        ranks = self.ctx.analysis(RankAnalysis)
        guard = ranks.rank_condition(node)
        if guard is None:
            return False
        self.report(node, "declined",
                    f"{what} is already under a rank condition (`{ranks.describe(guard)}`); dp.save must be reached "
                    "by every rank, so this one is left as it is",
                    "keep it (only that rank writes, not atomically), or call dp.save(...) on every rank without "
                    "the condition")
        return True

    def _save(self, node: cst.Call) -> None:
        if self._guarded(node, "paddle.save"):
            return
        saved = argument(node, 0, "obj")
        wrapped = set(self.ctx.analysis(Models).wrapped)
        if saved is not None and _names_a_model(saved.value, wrapped):
            self.report(node, "declined",
                        f"paddle.save pickles the Layer object `{self.code(saved.value)}`; once converted it is the "
                        "DataParallel wrapper",
                        "save its parameters instead: dp.save(model.state_dict(), path) (load with set_state_dict)")
            return
        self.ctx.plan.replace(node, lambda updated: updated.with_changes(func=self.dp_attribute("save")))
        self.report(node, "change", "paddle.save -> dp.save: rank 0 writes atomically, then all ranks meet "
                    "(every rank must reach this line)")

    def _jit_save(self, node: cst.Call) -> None:
        if self._guarded(node, "paddle.jit.save"):
            return
        statement = self.q.statement_of(node)
        if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1
                and isinstance(statement.body[0], cst.Expr) and statement.body[0].value is node):
            self.report(node, "declined", "paddle.jit.save inside a larger statement: every rank would export it",
                        f"export it in a statement of its own under `if {self.ctx.alias}.is_main_process():`, then dp.barrier()")
            return
        layer = argument(node, 0, "layer")
        wrapped = set(self.ctx.analysis(Models).wrapped)
        if layer is not None and isinstance(layer.value, cst.Name) and layer.value.value in wrapped:
            self.ctx.plan.replace(layer, lambda updated: updated.with_changes(value=self.dp_call("unwrap", updated.value)))
        self.ctx.plan.group([statement], self.main_process_only)
        self.ctx.plan.insert_after(statement, self.statement("{dp}.barrier()\n"))
        self.report(node, "change", "paddle.jit.save exported by the main process only (the layer itself, "
                    "dp.unwrap), then all ranks meet (dp.barrier())")



def _names_a_model(value: cst.BaseExpression, models: set[str]) -> bool:
    """The saved object is a wrapped model, or a dict/list/tuple display holding one."""
    if isinstance(value, cst.Name):
        return value.value in models
    if isinstance(value, cst.Dict):
        return any(isinstance(e, cst.DictElement) and _names_a_model(e.value, models) for e in value.elements)
    if isinstance(value, (cst.List, cst.Tuple, cst.Set)):
        return any(isinstance(e, cst.Element) and _names_a_model(e.value, models) for e in value.elements)
    return False
