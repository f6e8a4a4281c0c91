"""Progress bars and sample images once, from the main process."""

from __future__ import annotations

import libcst as cst

from ...codemod.ranks import RankAnalysis
from ...codemod.rule import Rule

PROGRESS_BARS = {"tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.std.tqdm", "tqdm.trange", "tqdm.auto.trange"}


class MainProcessOutput(Rule):
    """Show progress bars and write sample images on the main process only.

    Why: launched on N processes, N progress bars fight over one terminal and N processes write the
    same image file at once.
    Example:  for x, y in tqdm(train_loader):
           -> for x, y in tqdm(train_loader, disable=not dp.is_main_process()):
              vutils.save_image(fake, path)
           -> if dp.is_main_process():
                  vutils.save_image(fake, path)
    Matched by qualified name (``tqdm.tqdm``; image writers from the framework's vocabulary, e.g.
    ``torchvision.utils.save_image``), in files that train.
    Leaves alone: progress bars that already pass ``disable=``; image writes that are not a
    statement of their own, or already under a rank condition.
    """

    name = "main-process-output"

    def visit_Module(self, node: cst.Module) -> bool:
        return self.q.is_training_script()

    def visit_Call(self, node: cst.Call) -> None:
        if self.q.is_call_to(node, PROGRESS_BARS):
            if any(a.keyword is not None and a.keyword.value == "disable" for a in node.args):
                return
            if node.args:
                self.ctx.plan.replace(node, self._disabled_off_main)
            self.report(node, "change", "progress bar shown by the main process only (disable=not dp.is_main_process())")
        elif self.q.is_call_to(node, self.vocabulary.image_writers):
            self._image(node)

    def _disabled_off_main(self, updated: cst.Call) -> cst.Call:
        disable = cst.Arg(
            cst.UnaryOperation(cst.Not(), self.dp("is_main_process()")),
            keyword=cst.Name("disable"),
            equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
        )
        last = updated.args[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
        return updated.with_changes(args=[*updated.args[:-1], last, disable])

    def _image(self, node: cst.Call) -> None:
        statement = self.q.statement_of(node)
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            return
        if self.ctx.analysis(RankAnalysis).rank_condition(node) is not None:
            return
        self.ctx.plan.group([statement], self._guarded)
        self.report(node, "change", "image written by the main process only (under `if dp.is_main_process():`)")

    def _guarded(self, statements):
        first = statements[0]
        return cst.If(
            test=self.dp("is_main_process()"),
            body=cst.IndentedBlock(body=[first.with_changes(leading_lines=())]),
            leading_lines=first.leading_lines,
        )
