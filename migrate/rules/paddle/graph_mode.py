"""Which of Paddle's two modes trains a file: a dygraph loop, a static program, or both (then nothing is guessed).

Why: ``paddle.enable_static()`` is a run-time switch, not a program. Real scripts call it under an option
(``if args.static: paddle.enable_static()``) or keep a ``to_static`` branch; taken as a marker, it made a
dygraph file "static", every dygraph rule was skipped, and ``paddle.save`` was still rewritten while the
summary claimed a split (issue 19). So the vocabulary's static markers are what builds or runs a program
(``paddle.static.data``, ``Executor``, ``program_guard``...), never the switch, and this module tells how the
file trains: a dygraph loop (``loss.backward()``, ``opt.step()`` of an optimizer given ``parameters=``,
``paddle.Model.fit``) or a static program (``optimizer.minimize(loss)`` run by an ``Executor``).
"""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.calls import argument
from ...codemod.query import is_main_guard, optimizer_class
from ...codemod.rule import Rule
from ._analyses import HIGH_LEVEL_MODEL
from .static_common import executor_runs, minimize_calls

SWITCHES = frozenset({"paddle.enable_static", "paddle.framework.enable_static", "paddle.base.framework.enable_static"})


class GraphModes:
    """How the file trains: ``dygraph`` (calls), ``static`` (``minimize`` calls run by an executor), the switches."""

    def __init__(self, ctx) -> None:
        q = ctx.query
        self.q = q
        self.switches: list[cst.Call] = [
            c for c in q.index.of_type(ctx.module, cst.Call) if q.is_call_to(c, SWITCHES)] if q.index.possible(SWITCHES) else []
        self.static = [call for call, _, _ in minimize_calls(q)] if any(True for _ in executor_runs(q)) else []
        self.dygraph = self._dygraph_training(ctx)

    def _dygraph_training(self, ctx) -> list[cst.Call]:
        """``x.backward()``, ``opt.step()`` on an optimizer built with ``parameters=``, a high-level ``fit``."""
        q = self.q
        stepped = set()
        for call in q.index.of_type(ctx.module, cst.Call):
            if optimizer_class(q, call) and argument(call, 1, "parameters") is not None:
                statement = q.statement_of(call)
                if isinstance(statement, cst.SimpleStatementLine):
                    for assign in q.findall(statement, m.Assign()):
                        stepped |= {t.target.value for t in assign.targets if isinstance(t.target, cst.Name)}
        found = []
        for call in q.findall(ctx.module, m.Call(func=m.Attribute(attr=m.Name()))):
            method, owner = call.func.attr.value, call.func.value
            if method == "backward" and not call.args:
                found.append(call)
            elif method == "step" and isinstance(owner, cst.Name) and owner.value in stepped:
                found.append(call)
            elif method in ("fit", "train_batch") and q.index.possible(HIGH_LEVEL_MODEL):
                found.append(call)
        return found

    @property
    def both(self) -> bool:
        """The file trains in dygraph and builds a static training program: which runs is chosen at run time."""
        return bool(self.static and self.dygraph)

    def conditional(self, switch: cst.Call) -> cst.CSTNode | None:
        """The ``if`` (or the function) ``switch`` runs under, when it does not run unconditionally."""
        for ancestor in self.q.ancestors(switch):
            if isinstance(ancestor, (cst.If, cst.IfExp, cst.FunctionDef, cst.Try)) and not (
                    isinstance(ancestor, cst.If) and is_main_guard(ancestor)):
                return ancestor
        return None


class PaddleGraphMode(Rule):
    """Say which mode was converted when a file switches modes, and convert nothing when it trains in both.

    Why: a dygraph file that calls ``paddle.enable_static()`` only under an option is converted as the dygraph
    script it trains as (a note names the switch: with it on, the script runs another program, which this
    conversion does not cover). A file that trains in both modes (a dygraph loop and an ``Executor`` running
    a minimized program, chosen at run time) is declined: its static half is left as it is (the static rules
    stand down), so nothing is distributed by halves.
    Example (note):  if STATIC:
                         paddle.enable_static()   ->  (unchanged) note: converted as dygraph ...
    Leaves alone: the code; files whose switch runs unconditionally before a static program (plain static).
    """

    name = "paddle-graph-mode"
    generations = ("dygraph", "static")

    def finish(self) -> None:
        modes = self.ctx.analysis(GraphModes)
        if modes.both:
            where = self.ctx.positions
            self.report(
                modes.static[0], "declined",
                f"this file trains in dygraph (line {where[modes.dygraph[0]].start.line}: "
                f".{modes.dygraph[0].func.attr.value}()) and in static graph (line {where[modes.static[0]].start.line}: "
                "minimize, run by an Executor), one after the other or as chosen at run time: the conversion does not "
                "distribute one mode by halves, so neither was distributed; launched as it is, every rank trains its own "
                "copy and writes the same files",
                "split it into a dygraph script and a static-graph script and convert each one (dpmigrate FILE); or run "
                "this file on one process",
            )
            return
        if self.ctx.generation != "dygraph":
            return
        for switch in modes.switches:
            guard = modes.conditional(switch)
            how = f"runs only under `{self._head(guard)}`" if guard is not None else "is called"
            self.report(
                switch, "note",
                f"paddle.enable_static() {how}, but this file trains in dygraph (backward()/step()) and builds no "
                "static program: it was converted as dygraph; with the switch on, it would run in static graph mode, "
                "which this conversion does not cover",
            )

    def _head(self, node: cst.CSTNode) -> str:
        if isinstance(node, cst.If):
            return f"if {self.code(node.test)}:"
        if isinstance(node, cst.FunctionDef):
            return f"def {node.name.value}(...):"
        return self.code(node).splitlines()[0]


def stands_down(ctx) -> bool:
    """The static rules convert nothing in a file that trains in both modes (:class:`PaddleGraphMode` declines it)."""
    return ctx.analysis(GraphModes).both
