"""Static graph under PIR (Paddle 3's default program representation): what breaks, reported."""

from __future__ import annotations

import libcst as cst

from ...codemod import patterns as m
from ...codemod.rule import Rule


class StaticPir(Rule):
    """Report ``program.clone(for_test=True)``: under PIR it raises ``TypeError`` (measured, Paddle 3.3.1).

    Why: PIR's ``Program.clone`` takes no ``for_test``; the script fails on Paddle 3 before and after
    conversion, and it is not a conversion's to rewrite (``for_test`` also switches dropout and batch
    norm to inference). The old program IR (``FLAGS_enable_pir_api=0``) accepts it, but on CPU
    Paddle 3.3.1's static all-reduce fails there, so it is no way to run the converted script on 2 CPU
    processes. Runs on every static-graph file, converted or not.
    Example:  test_program = main_program.clone(for_test=True)  ->  (unchanged) note: TypeError under PIR
    Leaves alone: the line itself, and ``clone()`` without ``for_test`` (PIR accepts it).
    """

    name = "static-pir"
    checks_only = True
    generations = ("static",)

    def visit_Call(self, node: cst.Call) -> None:
        if not m.matches(node.func, m.Attribute(attr=m.Name("clone"))):
            return
        for arg in node.args:
            if arg.keyword is not None and arg.keyword.value == "for_test" and not m.matches(arg.value, m.Name("False")):
                self.report(node, "note", "Program.clone(for_test=True) raises TypeError under PIR, Paddle 3's "
                            "default (measured on 3.3.1): this line fails there before and after conversion",
                            "on Paddle 2.x it runs as it is; on Paddle 3 build the evaluation program separately "
                            "(a program_guard with the same network and no minimize) or evaluate in dygraph")
