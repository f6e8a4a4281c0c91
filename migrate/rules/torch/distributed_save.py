"""Checkpoints written once, atomically, by rank 0."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.calls import argument
from ...codemod.models import Models
from ...codemod.ranks import RankAnalysis
from ...codemod.rule import Rule


class DistributedSave(Rule):
    """Replace ``torch.save(obj, path)`` with ``dp.save(obj, path)``.

    Why: launched on N processes, every rank would write the same file at once (a torn checkpoint).
    ``dp.save`` writes on rank 0 only, atomically (temporary file, then rename), and then all ranks
    meet, so none reads the file before it is complete. The wrapped model's ``state_dict()`` has no
    ``module.`` prefix, so the checkpoint still loads in the original script.
    Example:  torch.save(model.state_dict(), "mnist_cnn.pt")  ->  dp.save(model.state_dict(), "mnist_cnn.pt")
    Unsafe when: only some ranks reach the line; ``dp.save`` is a meeting point, every rank must
    call it (the ``rank-divergent-code`` check reports a save under a rank condition).
    ``with open(path, "wb") as f: torch.save(obj, f)`` becomes ``dp.save(obj, path)`` (every rank
    opening the file for writing would truncate it under rank 0).
    A whole model (``torch.save(model, path)``, or the model as a value of a dict, list or tuple
    written out in the call: ``{"model": model, "epoch": epoch}``) becomes ``dp.save`` too: once
    converted, ``model`` holds the DDP wrapper, and ``dp.save`` saves the module inside it
    (``dp.unwrap``), so ``torch.load`` gives back the model's own class, with no process group needed.
    Leaves alone (declined): a ``torch.save`` already under a rank condition (``if rank == 0:``);
    a wrapped model deeper inside what is saved (``{"models": [model]}``, ``{model}``: ``dp.save``
    looks one level deep only, the wrapper would be pickled); a save into a file opened with other
    statements in the same ``with``.
    """

    name = "distributed-save"

    def visit_Call(self, node: cst.Call) -> None:
        if not self.q.is_call_to(node, self.vocabulary.save_calls):
            return
        ranks = self.ctx.analysis(RankAnalysis)
        guard = ranks.rank_condition(node)
        if guard is not None:
            self.report(
                node, "declined",
                f"torch.save is already under a rank condition (`{ranks.describe(guard)}`); dp.save must be "
                "reached by every rank, so this one is left as it is",
                "keep it (only that rank writes, not atomically), or call dp.save(...) on every rank without the condition",
            )
            return
        saved_arg = argument(node, 0, "obj")
        saved = saved_arg.value if saved_arg is not None else None
        wrapped = set(self.ctx.analysis(Models).wrapped)
        buried = _buried_models(saved, wrapped)
        if buried:
            self.report(
                node, "declined",
                f"torch.save pickles the model object `{buried[0]}` nested inside {self.code(saved)}; once converted "
                "it is the DDP wrapper, and dp.save unwraps a model only when it is the saved object or a value "
                "of the saved dict, list or tuple itself",
                f"save {buried[0]}.state_dict() instead (load it with load_state_dict), or put dp.unwrap({buried[0]}) "
                "where the model is saved, then use dp.save",
            )
            return
        whole = _whole_models(saved, wrapped)
        opened = self._opened_file(node)
        if opened is not None:
            self._save_to_path(node, *opened, whole=whole)
            return
        self.ctx.plan.replace(node, lambda updated: updated.with_changes(func=self._dp_save(), args=_path_keyword(updated)))
        self.report(node, "change", "torch.save -> dp.save: rank 0 writes atomically, then all ranks meet "
                    "(every rank must reach this line)" + _unwrapped_note(whole))

    def _dp_save(self) -> cst.Attribute:
        return self.dp_attribute("save")

    def _opened_file(self, node: cst.Call):
        """``with open(path, "wb") as f: torch.save(obj, f)``: (the with statement, path), else None."""
        file_arg = argument(node, 1, "f")
        if file_arg is None or not isinstance(file_arg.value, cst.Name):
            return None
        handle = file_arg.value.value
        for ancestor in self.q.ancestors(node):
            if isinstance(ancestor, cst.With):
                for item in ancestor.items:
                    if m.matches(item, m.WithItem(m.Call(func=m.Name("open"), args=[m.Arg(keyword=None), m.ZeroOrMore()]),
                                                  asname=m.AsName(m.Name(handle)))):
                        return ancestor, item.item.args[0].value
        return None

    def _save_to_path(self, node: cst.Call, with_statement: cst.With, path: cst.BaseExpression, whole: list[str]) -> None:
        body = with_statement.body
        alone = (
            len(with_statement.items) == 1
            and isinstance(body, cst.IndentedBlock)
            and len(body.body) == 1
            and m.matches(body.body[0], m.SimpleStatementLine(body=[m.Expr(m.Call())]))
            and body.body[0].body[0].value is node
        )
        if not alone:
            self.report(
                node, "declined",
                "torch.save writes into a file that every rank opens for writing (`with open(...) as f:`)",
                f"save by path on every rank instead: dp.save(obj, {self.code(path)})",
            )
            return

        def rewrite(updated: cst.With) -> cst.SimpleStatementLine:
            save = updated.body.body[0].body[0].value
            handle = argument(save, 1, "f")
            target = updated.items[0].item.args[0].value
            args = [a.with_changes(value=target) if a is handle else a for a in save.args]  # other arguments kept
            call = save.with_changes(func=self._dp_save(), args=_path_keyword(save.with_changes(args=args)))
            inner = updated.body.body[0]
            return cst.SimpleStatementLine([cst.Expr(call)], leading_lines=_comments_kept(updated),
                                           trailing_whitespace=inner.trailing_whitespace)

        self.ctx.plan.replace(with_statement, rewrite)
        self.report(node, "change", f"with open(...) as f: torch.save(obj, f) -> dp.save(obj, {self.code(path)}): "
                    "rank 0 writes atomically, then all ranks meet" + _unwrapped_note(whole))


def _comments_kept(with_statement: cst.With) -> list[cst.EmptyLine]:
    """The lines above the one-line save that replaces ``with_statement``: every comment it held.

    Its own leading lines, then the comment after ``with ...:``, the lines above the save and those
    under it at the block's indentation, in that order; the save's own end-of-line comment stays on it.
    """
    block = with_statement.body
    header = block.header.comment
    moved = [cst.EmptyLine(comment=header)] if header is not None else []
    moved += [line for line in [*block.body[0].leading_lines, *block.footer] if line.comment is not None]
    return [*with_statement.leading_lines, *(line.with_changes(indent=True) for line in moved)]


def _container_values(node: cst.CSTNode | None) -> list[cst.BaseExpression]:
    """The values written out in a dict, list, tuple or set display (``**``/``*`` parts are not values)."""
    if isinstance(node, cst.Dict):
        return [e.value for e in node.elements if isinstance(e, cst.DictElement)]
    if isinstance(node, (cst.List, cst.Tuple, cst.Set)):
        return [e.value for e in node.elements if isinstance(e, cst.Element)]
    return []


def _is_model(node: cst.CSTNode, models: set[str]) -> bool:
    return isinstance(node, cst.Name) and node.value in models


def _whole_models(saved: cst.BaseExpression | None, models: set[str]) -> list[str]:
    """Models saved whole where ``dp.save`` unwraps them: the saved object, or a value of its dict, list or tuple."""
    if _is_model(saved, models):
        return [saved.value]
    if isinstance(saved, cst.Set):
        return []
    return [v.value for v in _container_values(saved) if _is_model(v, models)]


def _buried_models(saved: cst.BaseExpression | None, models: set[str]) -> list[str]:
    """Models saved whole where ``dp.save`` does not look: deeper displays, or a set (it pickles the wrapper)."""
    found: list[str] = []

    def walk(node, depth):
        for value in _container_values(node):
            if _is_model(value, models) and (depth > 0 or isinstance(node, cst.Set)):
                found.append(value.value)
            walk(value, depth + 1)

    walk(saved, 0)
    return found


def _unwrapped_note(whole: list[str]) -> str:
    if not whole:
        return ""
    names = ", ".join(f"`{name}`" for name in dict.fromkeys(whole))
    return (f"; the whole model {names} is saved unwrapped (dp.unwrap: its own class, not the DDP wrapper), "
            "once, by rank 0, so torch.load needs no process group")


def _path_keyword(call: cst.Call) -> list[cst.Arg]:
    """``torch.save``'s ``f=`` is the runtime's ``path=`` (the contract's name in every backend)."""
    return [a.with_changes(keyword=cst.Name("path")) if a.keyword is not None and a.keyword.value == "f" else a
            for a in call.args]
