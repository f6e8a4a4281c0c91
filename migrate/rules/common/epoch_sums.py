"""Sums a sharded training loop adds up over the epoch and the script reports after it: which, and how to reduce them.

Why: ``total_loss += loss`` in the loop, then ``print("epoch", e, total_loss)`` (FCCDN_paddle, issue 19 audit): once
the loader is sharded, each rank adds up only its share of the epoch's batches, so the main process printed about
1/N of the original's figure (4.24 for 8.29) with nothing said. Summed over the ranks after the loop, the figure is
the original's again; divided by the number of batches (``len(loader)``, or the loop's index), it is averaged over
the ranks instead (each rank has as many batches). A sum whose readers divide it by anything else, or that is not
reset before the loop in the same block (kept across epochs), is left as it is.
"""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.loaders import Loop
from ...codemod.rule import Rule


def epoch_sums(rule: Rule, loop: Loop, exclude: set[str]) -> dict[str, str]:
    """{name: "sum" | "mean"} of the sums to all-reduce after ``loop``."""
    q = rule.q
    block = q.parent(loop.node)
    siblings = list(block.body) if isinstance(block, (cst.IndentedBlock, cst.Module)) else []
    if loop.node not in siblings:
        return {}
    index = siblings.index(loop.node)
    added = [a.target.value for a in q.findall(loop.node.body, m.AugAssign(target=m.Name(), operator=m.AddAssign()))]
    assigned_in_loop = q.assigned_names(loop.node) - set(added)
    candidates = [n for n in dict.fromkeys(added) if n not in exclude and n not in assigned_in_loop
                  and any(n in _reset_names(s) for s in siblings[:index])]
    indices = _index_names(loop.node)
    found: dict[str, str] = {}
    reads = {name: _reads_after(q, siblings[index + 1:], name) for name in candidates}
    for name in candidates:
        ops = {_divided_how(q, read, loop, set(candidates), indices) for read in reads[name]}
        if len(ops) == 1 and None not in ops:
            found[name] = ops.pop()
    changed = True
    while changed:  # `total / batches`: a count divides a sum only if both are reduced
        changed = False
        for name in list(found):
            for read in reads[name]:
                parent = q.parent(read)
                if (isinstance(parent, cst.BinaryOperation) and parent.right is read and isinstance(parent.left, cst.Name)
                        and parent.left.value not in found):
                    del found[name]
                    changed = True
                    break
    return found


def _reset_names(statement: cst.CSTNode) -> set[str]:
    """``total = 0`` / ``total, n = 0, 0`` / ``total: float = 0.0`` as a statement of its own."""
    names: set[str] = set()
    for small in statement.body if isinstance(statement, cst.SimpleStatementLine) else ():
        targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else \
            [small.target] if isinstance(small, cst.AnnAssign) else []
        for target in targets:
            elements = [e.value for e in target.elements] if isinstance(target, cst.Tuple) else [target]
            names.update(e.value for e in elements if isinstance(e, cst.Name))
    return names


def _reads_after(q, statements: list[cst.CSTNode], name: str) -> list[cst.Name]:
    """Reads of ``name`` in the statements after the loop, up to the first that assigns it anew."""
    reads: list[cst.Name] = []
    for statement in statements:
        if name in _reset_names(statement):
            break
        for node in q.index.of_type(statement, cst.Name):
            parent = q.parent(node)
            if node.value == name and not (isinstance(parent, cst.Attribute) and parent.attr is node):
                reads.append(node)
    return reads


def _index_names(loop: cst.For) -> set[str]:
    """``i`` in ``for i, (x, y) in enumerate(loader):``: after the loop, the last batch's index on this rank."""
    target = loop.target
    if isinstance(target, cst.Tuple) and target.elements and isinstance(target.elements[0].value, cst.Name) and \
            m.matches(loop.iter, m.Call(func=m.Name("enumerate"))):
        return {target.elements[0].value.value}
    return set()


def _divided_how(q, read: cst.Name, loop: Loop, sums: set[str], indices: set[str]) -> str | None:
    parent = q.parent(read)
    if not (isinstance(parent, cst.BinaryOperation) and parent.left is read and isinstance(parent.operator, cst.Divide)):
        return "sum"
    right = parent.right
    if isinstance(right, (cst.Integer, cst.Float)) or (isinstance(right, cst.Name) and right.value in sums):
        return "sum"
    if m.matches(right, m.Call(func=m.Name("len"), args=[m.Arg(m.Name(loop.variable))])):
        return "mean"  # the number of this rank's batches: every rank has as many
    names = {n.value for n in q.index.of_type(right, cst.Name)}
    if names and names <= indices:
        return "mean"  # (i + 1): this rank's number of batches
    return None
