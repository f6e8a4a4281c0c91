"""Checkpoints written once, atomically, by rank 0."""

from __future__ import annotations

import libcst as cst

from ._base import Rule
from ._rank import RankAnalysis


class DistributedSave(Rule):
    """Replace ``torch.save(obj, path)`` with ``dp.save(obj, path)``.

    Why: launched on N processes, every rank would write the same file at once (a torn checkpoint).
    ``dp.save`` writes on rank 0 only, atomically (temporary file, then rename), and then all ranks
    meet, so none reads the file before it is complete. The wrapped model's ``state_dict()`` has no
    ``module.`` prefix, so the checkpoint still loads in the original script.
    Example:  torch.save(model.state_dict(), "mnist_cnn.pt")  ->  dp.save(model.state_dict(), "mnist_cnn.pt")
    Unsafe when: only some ranks reach the line; ``dp.save`` is a meeting point, every rank must
    call it (the ``rank-divergent-code`` check reports a save under a rank condition).
    Leaves alone: a ``torch.save`` already under a rank condition (``if rank == 0:``), reported.
    """

    name = "distributed-save"

    def visit_Call(self, node: cst.Call) -> None:
        if not self.q.is_call_to(node, {"torch.save"}):
            return
        guard = self._ranks().rank_condition(node)
        if guard is not None:
            self.report(
                node, "declined",
                f"torch.save is already under a rank condition (`if {self.code(guard.test)}:`); dp.save must be "
                "reached by every rank, so this one is left as it is",
                "keep it (only that rank writes, not atomically), or call dp.save(...) on every rank without the condition",
            )
            return
        self.ctx.plan.replace(node, lambda updated: updated.with_changes(
            func=cst.Attribute(cst.Name(self.ctx.alias), cst.Name("save"))))
        self.ctx.plan.needs_runtime_import = True
        self.report(node, "change", "torch.save -> dp.save: rank 0 writes atomically, then all ranks meet "
                    "(every rank must reach this line)")

    def _ranks(self) -> RankAnalysis:
        if "ranks" not in self.ctx.facts:
            self.ctx.facts["ranks"] = RankAnalysis(self.q)
        return self.ctx.facts["ranks"]
