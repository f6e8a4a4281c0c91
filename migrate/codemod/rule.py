"""What every rule shares: the context it reads and writes, and small helpers to report and rewrite.

A rule is a libcst visitor over the *original* module, driven by the file's one ``TreeIndex``
(``visit_<Type>`` methods only; metadata and the index are built once for all rules). It never
mutates the tree: it records edits in ``ctx.plan`` and findings with ``self.report``. What several
rules need to know (which loaders train, which names are models, where ``dp.init()`` goes, which
names hold the rank) is an *analysis*, computed once per file from the tree alone and asked for
with ``ctx.analysis(Kind)``: no rule depends on another having run, so one rule can run alone.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, ClassVar, TypeVar

import libcst as cst
from libcst.metadata import MetadataWrapper

from ..findings import Finding, Options, Severity
from .plan import Plan
from .positions import Positions
from .printing import ModulePrint
from .query import Query
from .vocabulary import Vocabulary

AnalysisT = TypeVar("AnalysisT")


@dataclasses.dataclass
class Context:
    """One conversion: the parsed input, the framework's vocabulary, the user's options, the edits."""

    wrapper: MetadataWrapper
    path: str
    options: Options
    query: Query
    alias: str = "dp"  # the name the converted file binds the runtime to
    generation: str | None = None  # the file's API generation, as detection found it ("static", "fluid"...)
    plan: Plan = dataclasses.field(default_factory=Plan)
    findings: list[Finding] = dataclasses.field(default_factory=list)
    _analyses: dict[type, Any] = dataclasses.field(default_factory=dict)
    _printed: ModulePrint | None = None
    _positions: Positions | None = None

    @property
    def module(self) -> cst.Module:
        return self.wrapper.module

    @property
    def vocabulary(self) -> Vocabulary:
        return self.query.vocabulary

    @property
    def printed(self) -> ModulePrint:
        """The original module printed once (for the output, the reprint check and positions)."""
        if self._printed is None:
            self._printed = ModulePrint(self.module)
        return self._printed

    @property
    def positions(self) -> Positions:
        """``positions[node]``: the node's ``CodeRange`` in the input, as ``PositionProvider`` gives it."""
        if self._positions is None:
            self._positions = Positions(self.wrapper, self.query.index, self.printed)
        return self._positions

    def fresh(self) -> Context:
        """The same file, options and analyses (they read only the original tree), with no edits or findings yet."""
        return dataclasses.replace(self, plan=Plan(), findings=[])

    def analysis(self, kind: type[AnalysisT]) -> AnalysisT:
        """The file's one instance of an analysis class (built from the context on first use)."""
        if kind not in self._analyses:
            self._analyses[kind] = kind(self)
        return self._analyses[kind]

    def in_alias(self, text: str | None) -> str | None:
        """A finding's ``text``, written with ``dp.``, naming the runtime by the file's alias (see :func:`aliased`).

        Why: a file that already uses the name ``dp`` gets the runtime as ``dpr`` (or ``dp_runtime``...); a report
        written with ``dp.`` would tell the user to call ``dp.barrier()`` where ``dp`` is something else. A file that
        imports the runtime already (a converted one) is left as written: its ``dp`` is the runtime."""
        if not text or self.alias == "dp" or self.query.index.possible({self.vocabulary.runtime_module}):
            return text
        return aliased(text, self.alias, self.printed.code)

    def config(self) -> cst.PartialParserConfig:
        """The file's newline and indentation for new code (a form feed in an indent is layout only)."""
        indent = self.module.default_indent.replace("\f", "") or "    "
        if indent.strip(" \t"):
            indent = "    "
        return cst.PartialParserConfig(
            encoding=self.module.encoding, default_indent=indent, default_newline=self.module.default_newline,
        )


class Rule(cst.CSTVisitor):
    """Base class: subclasses set ``name`` and a docstring (what, why, example, what it leaves alone)."""

    name: ClassVar[str]
    checks_only: ClassVar[bool] = False  # True: also runs on files left unchanged (it only reports)
    # The API generations the rule converts; None: every one the runtime serves (not the vocabulary's
    # legacy_generations, whose files only rules naming them convert; rules that only check run on all)
    generations: ClassVar[tuple[str, ...] | None] = None
    # False for rules whose findings say nothing about how training is distributed (dp.init's placement, printing,
    # files written once, shared random draws): the engine's coverage check does not count them (:mod:`.selfcheck`)
    about_training: ClassVar[bool] = True
    # True for a rule whose declined finding speaks for all of the file's training (a loop the file's generation
    # hides from the training rules): the coverage check then adds no site of its own
    declines_training: ClassVar[bool] = False

    @classmethod
    def applies_to(cls, generation: str | None, vocabulary: Vocabulary) -> bool:
        """Whether the rule runs on a file of ``generation`` (see :attr:`generations`)."""
        if cls.generations is not None:
            return generation in cls.generations
        return cls.checks_only or generation not in vocabulary.legacy_generations

    def __init__(self, ctx: Context) -> None:
        super().__init__()
        self.ctx = ctx
        self.q = ctx.query
        self.vocabulary = ctx.vocabulary

    def run(self) -> None:
        """Visit the module and then :meth:`finish`; the engine calls this once per file."""
        self.q.index.visit(self)
        self.finish()

    def finish(self) -> None:
        """Called after the visit, for rules that decide once they have seen the whole module."""

    # --- reporting --------------------------------------------------------------------------------

    def report(self, node: cst.CSTNode, severity: Severity, message: str, fix: str | None = None,
               effect: str | None = None) -> None:
        """A finding at ``node``; ``effect`` says what a change does to the training (see :class:`Finding`): the
        summary line states the batch and learning-rate policy only as far as changes applied it.

        Messages are written with ``dp.``; the finding names the runtime as the file binds it (:meth:`Context.in_alias`)."""
        start = self.ctx.positions[node].start
        message, fix = self.ctx.in_alias(message), self.ctx.in_alias(fix)
        self.ctx.findings.append(
            Finding(self.ctx.path, start.line, start.column + 1, self.name, severity, message, fix, effect)
        )

    # --- building code ----------------------------------------------------------------------------

    def dp(self, code: str) -> cst.BaseExpression:
        """An expression calling the runtime: ``self.dp("device()")`` -> ``dp.device()``."""
        self.ctx.plan.needs_runtime_import = True
        return cst.parse_expression(f"{self.ctx.alias}.{code}", config=self.ctx.config())

    def main_process_only(self, statements) -> cst.If:
        """``if dp.is_main_process():`` around a group of statements (a ``plan.group`` wrapper), the first one's
        comments and blank lines kept above the ``if``."""
        first = statements[0]
        return cst.If(test=self.dp("is_main_process()"),
                      body=cst.IndentedBlock(body=[first.with_changes(leading_lines=()), *statements[1:]]),
                      leading_lines=first.leading_lines)

    def dp_attribute(self, name: str) -> cst.Attribute:
        """``dp.name`` (to replace a callee: ``torch.save`` -> ``dp.save``)."""
        self.ctx.plan.needs_runtime_import = True
        return cst.Attribute(cst.Name(self.ctx.alias), cst.Name(name))

    def dp_call(self, function: str, *args: cst.BaseExpression | cst.Arg) -> cst.Call:
        """``dp.function(args...)`` built from existing nodes (their formatting kept)."""
        return cst.Call(func=self.dp_attribute(function), args=[a if isinstance(a, cst.Arg) else cst.Arg(a) for a in args])

    def statement(self, code: str) -> cst.BaseStatement:
        """A new statement parsed with the file's newline and indentation; ``{dp}`` is the alias."""
        self.ctx.plan.needs_runtime_import = True
        return cst.parse_statement(code.format(dp=self.ctx.alias), config=self.ctx.config())

    def code(self, node: cst.CSTNode) -> str:
        return self.ctx.module.code_for_node(node)


_DP = re.compile(r"(?<![\w.])dp\.")
_QUOTED = re.compile(r"(`[^`]*`)")


def aliased(text: str, alias: str, source: str) -> str:
    """``text`` with the runtime's ``dp.`` written ``alias.``, except in backquoted quotes of the user's code.

    Why: the report must not tell the user to call ``dp.barrier()`` in a file where ``dp`` is the user's own
    name. A backquoted span quotes either the file (its ``dp`` is the user's, left as written) or code the rule
    suggests (a fix's ``model = dp.distributed_model(model)``, rewritten): a span is the file's when each of its
    parts around an elision (``...``) is text of ``source``.
    """
    parts = _QUOTED.split(text)
    for index, part in enumerate(parts):
        if "dp." not in part:
            continue
        if part.startswith("`") and all(p in source for p in part[1:-1].split("...") if p.strip()):
            continue
        parts[index] = _DP.sub(f"{alias}.", part)
    return "".join(parts)
