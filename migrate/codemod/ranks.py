"""Which expressions depend on the rank, and which calls every rank must reach (collectives).

One analysis per file (``ctx.analysis(RankAnalysis)``), shared by the rules that must not make a
rank-guarded save collective, that keep output on the main process, and the divergence check. A
condition is rank-dependent when it calls a rank query (the framework's, e.g. ``dist.get_rank()``,
or the runtime's ``dp.is_main_process()``...), reads a rank variable of the launchers
(``os.environ["RANK"]``), names one by a usual name (``rank``, ``args.local_rank``,
``is_master``...), or reads a variable assigned from any of these. The framework's rank queries and
collectives come from its vocabulary; the words and launcher variables are the same everywhere.
"""

from __future__ import annotations

import libcst as cst

from . import patterns as m
from .query import Query

RANK_WORDS = {
    "rank", "local_rank", "global_rank", "node_rank", "world_rank", "is_main_process",
    "is_local_main_process", "is_master", "is_main", "main_process", "is_chief", "master_process",
    "is_rank_zero", "is_rank0",
}
RANK_VARIABLES = {"RANK", "LOCAL_RANK", "SLURM_PROCID", "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK", "PADDLE_TRAINER_ID"}


class RankAnalysis:
    """Rank-dependence of expressions and collective-ness of calls in one module."""

    def __init__(self, ctx) -> None:
        query: Query = ctx.query
        self.q = query
        self.vocabulary = query.vocabulary
        self.rank_calls = self.vocabulary.all_rank_calls
        self.collectives = self.vocabulary.all_collectives
        self.tainted: set[str] = set()
        assignments = query.findall(query.module, m.Assign() | m.AnnAssign())
        changed = True
        while changed:
            changed = False
            for assign in assignments:
                if assign.value is None or not self.depends_on_rank(assign.value):
                    continue
                targets = [t.target for t in assign.targets] if isinstance(assign, cst.Assign) else [assign.target]
                for target in targets:
                    if isinstance(target, cst.Name) and target.value not in self.tainted:
                        self.tainted.add(target.value)
                        changed = True
        self.collective_functions = self._collective_functions()

    def depends_on_rank(self, expression: cst.CSTNode) -> bool:
        for node in self.q.findall(expression, m.Call() | m.Name() | m.Attribute() | m.SimpleString()):
            if isinstance(node, cst.Call) and self.q.is_call_to(node, self.rank_calls):
                return True
            if isinstance(node, cst.Name) and (node.value in RANK_WORDS or node.value in self.tainted):
                return True
            if isinstance(node, cst.Attribute) and node.attr.value in RANK_WORDS:
                return True
            if isinstance(node, cst.SimpleString) and node.evaluated_value in RANK_VARIABLES:
                return True
        return False

    def rank_condition(self, node: cst.CSTNode) -> cst.If | cst.IfExp | cst.BooleanOperation | None:
        """The innermost rank-dependent condition ``node`` runs under, or None.

        ``if rank == 0: node`` (body or else), ``a if rank == 0 else node``, and the short circuit
        ``rank == 0 and node`` / ``rank != 0 or node`` (the right side runs on some ranks only).
        """
        index = self.q.index
        for ancestor in self.q.ancestors(node):
            if isinstance(ancestor, cst.FunctionDef):
                return None
            if isinstance(ancestor, (cst.If, cst.IfExp)):
                if not index.contains(ancestor.test, node) and self.depends_on_rank(ancestor.test):
                    return ancestor
            elif isinstance(ancestor, cst.BooleanOperation):
                if index.contains(ancestor.right, node) and self.depends_on_rank(ancestor.left):
                    return ancestor
        return None

    def condition_code(self, condition: cst.CSTNode) -> cst.CSTNode:
        """The part of a condition found by :meth:`rank_condition` that tests the rank."""
        return condition.left if isinstance(condition, cst.BooleanOperation) else condition.test

    def describe(self, condition: cst.CSTNode) -> str:
        """``if rank == 0:`` for an ``if``; ``rank == 0 and ...`` / ``... if rank == 0 else ...`` otherwise."""
        code = self.q.module.code_for_node(self.condition_code(condition))
        if isinstance(condition, cst.If):
            return f"if {code}:"
        if isinstance(condition, cst.IfExp):
            return f"... if {code} else ..."
        return f"{code} {condition.operator.__class__.__name__.lower()} ..."

    def has_collective(self, node: cst.CSTNode) -> bool:
        """``node`` calls a collective, directly or through one of the script's functions."""
        return any(self.collective(call) for call in self.q.findall(node, m.Call()))

    def collective(self, call: cst.Call) -> str | None:
        """What the call is, when every rank must reach it (directly or inside a function it calls)."""
        direct = self._direct_collective(call)
        if direct is not None:
            return direct
        if isinstance(call.func, cst.Name) and call.func.value in self.collective_functions:
            return f"{call.func.value}() (it calls {self.collective_functions[call.func.value]})"
        return None

    def _collective_functions(self) -> dict[str, str]:
        found: dict[str, str] = {}
        functions = self.q.module_functions()
        changed = True
        while changed:
            changed = False
            for name, function in functions.items():
                if name in found:
                    continue
                for call in self.q.findall(function.body, m.Call()):
                    what = self._direct_collective(call) or found.get(getattr(call.func, "value", None))
                    if what and self.rank_condition(call) is None:
                        found[name] = what
                        changed = True
                        break
        return found

    def _direct_collective(self, call: cst.Call) -> str | None:
        for name in sorted(self.q.index.qualified_names_among(call.func, self.collectives)):
            if name in self.collectives:
                return self.vocabulary.short_name(name)
        return None
