"""Folders every rank creates: created without a race."""

from __future__ import annotations

import libcst as cst

from ...codemod.rule import Rule

_MAKERS = {"os.mkdir", "os.makedirs"}


class SharedFolders(Rule):
    """Make ``os.mkdir(path)`` / ``os.makedirs(path)`` tolerate a folder another rank just made.

    Why: launched on N processes, every rank runs ``if not os.path.isdir(d): os.mkdir(d)``; two ranks
    pass the test together and one dies of ``FileExistsError`` (the job then ends with it).
    ``os.makedirs(path, exist_ok=True)`` makes the folder once and lets every rank go on.
    Example:  os.mkdir('checkpoint')  ->  os.makedirs('checkpoint', exist_ok=True)
    Matched by qualified name, in files that train.
    Leaves alone: calls that already pass ``exist_ok``, and ``mkdir`` with a ``mode`` or ``dir_fd``
    (reported: make it on the main process first).
    """

    name = "shared-folders"
    about_training = False

    def visit_Module(self, node: cst.Module) -> bool:
        return self.q.is_training_script()

    def visit_Call(self, node: cst.Call) -> None:
        if not self.q.is_call_to(node, _MAKERS):
            return
        if any(a.keyword is not None and a.keyword.value == "exist_ok" for a in node.args):
            return
        if len(node.args) != 1 or node.args[0].keyword is not None or node.args[0].star:
            self.report(node, "declined", "a folder created by every rank with more than a path: one rank can fail "
                        "with FileExistsError", "create it under `with dp.main_process_first():` or pass exist_ok=True")
            return
        if not isinstance(node.func, cst.Attribute):
            return  # `from os import mkdir`: left alone rather than add an import

        def rewrite(updated: cst.Call) -> cst.Call:
            path = updated.args[0].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            exist_ok = cst.Arg(cst.Name("True"), keyword=cst.Name("exist_ok"),
                               equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")))
            return updated.with_changes(func=updated.func.with_changes(attr=cst.Name("makedirs")), args=[path, exist_ok])

        self.ctx.plan.replace(node, rewrite)
        self.report(node, "change", f"{self.code(node.func)}(...) -> os.makedirs(..., exist_ok=True): every rank "
                    "runs it, and none fails because another made the folder first")
