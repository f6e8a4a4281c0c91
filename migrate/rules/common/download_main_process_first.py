"""Download datasets once per node, not once per rank at the same time."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.rule import Rule

_DOWNLOAD = m.Call(args=[m.ZeroOrMore(), m.Arg(m.Name("True"), keyword=m.Name("download")), m.ZeroOrMore()])


class DownloadMainProcessFirst(Rule):
    """Wrap statements that download a dataset (``download=True``) in ``with dp.main_process_first():``.

    Why: N ranks downloading into the same directory at once corrupt each other's files. The main
    process of each node runs the block first; the others then find the files in place.
    Example:  dataset1 = datasets.MNIST('../data', train=True, download=True, transform=transform)
           -> with dp.main_process_first():
                  dataset1 = datasets.MNIST('../data', train=True, download=True, transform=transform)
    Consecutive download statements share one block.
    Unsafe when: the statement is reached by only some ranks (the block is a meeting point).
    Leaves alone: downloads inside an expression that is not a whole statement of its own line
    (e.g. on the same line as an ``if``), reported.
    """

    name = "download-main-process-first"

    def finish(self) -> None:
        statements = []
        for call in self.q.findall(self.ctx.module, _DOWNLOAD):
            statement = self.q.statement_of(call)
            if not isinstance(statement, cst.SimpleStatementLine):
                self.report(call, "declined", "dataset download inside a compound statement's header",
                            "download it in a statement of its own inside `with dp.main_process_first():`")
                continue
            if not any(s is statement for s in statements):
                statements.append(statement)
                self.report(call, "change", "download=True runs under dp.main_process_first(): "
                            "downloaded once per node, the other ranks wait for it")
        for run in self._runs(statements):
            self.ctx.plan.group(run, self._with_block)

    def _runs(self, statements):
        """Group statements that follow each other in the same block."""
        runs: list[list[cst.BaseStatement]] = []
        for statement in statements:
            block = self.q.block_of(statement)
            body = list(block.body)
            index = next(i for i, s in enumerate(body) if s is statement)
            previous = runs[-1][-1] if runs else None
            if previous is not None and index > 0 and body[index - 1] is previous:
                runs[-1].append(statement)
            else:
                runs.append([statement])
        return runs

    def _with_block(self, statements):
        first = statements[0]
        body = [first.with_changes(leading_lines=())] + list(statements[1:])
        return cst.With(
            items=[cst.WithItem(self.dp("main_process_first()"))],
            body=cst.IndentedBlock(body=body),
            leading_lines=first.leading_lines,
        )
