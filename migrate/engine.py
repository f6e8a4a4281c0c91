"""Convert one file's bytes: pre-filter, parse, detect the framework, run the rules in order, report.

The input is parsed as bytes, so libcst honours a PEP 263 coding cookie and a UTF-8 BOM, and the
output (``module.bytes``) keeps the encoding, line endings, comments and formatting of everything
no rule touched. Every rule reads the original tree and records edits in one plan, applied at the
end (see ``rules/_plan.py``); positions in findings are therefore those of the input file.

A file that is not plain single-process PyTorch (already converted, written for DDP by hand,
Hogwild-style, another or two frameworks) is returned byte-identical with a note or a declined
finding saying why; the rules that only check (rank-divergent code) still run on PyTorch files.
"""

from __future__ import annotations

import libcst
import libcst.matchers
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import MetadataWrapper

from .detect import Detection, detect
from .findings import Conversion, ConversionError, Finding, Options
from .rules import all_rules
from .rules._base import RUNTIME_MODULE, Context
from .rules._plan import apply
from .rules._query import Query

_IMPORT_LINE = libcst.matchers.SimpleStatementLine(body=[libcst.matchers.ImportFrom() | libcst.matchers.Import()])
_IMPORT_OR_FIRST_LINE = _IMPORT_LINE | libcst.matchers.SimpleStatementLine(body=[  # what AddImportsVisitor skips
    libcst.matchers.Expr(libcst.matchers.SimpleString())
    | libcst.matchers.Assign(targets=[libcst.matchers.AssignTarget(libcst.matchers.Name("__strict__"))])
])
_FRAMEWORK_WORDS = (b"torch", b"tensorflow", b"keras", b"paddle")
_ALIASES = ("dp", "dpr", "dp_runtime")
DETECT_RULE = "detect-framework"


def convert(source: bytes, path: str, options: Options = Options()) -> Conversion:
    """Return the converted file. Raises ConversionError for a file that is not text or does not parse."""
    if not any(word in source for word in _FRAMEWORK_WORDS):
        return Conversion(path=path, original=source, output=source)
    module = _parse(source, path)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)  # a fresh tree nobody else holds: no copy
    query = Query(wrapper)  # one index of the tree and one set of metadata, shared by detection and rules
    detection = detect(wrapper, query.index)
    findings = _detection_findings(detection, path, options)
    if detection.status == "none":
        return Conversion(path=path, original=source, output=source, findings=tuple(findings))
    convertible = detection.status == "convert" and options.framework in ("auto", detection.framework)
    output = source
    if detection.framework == "torch" and detection.status != "mixed":
        ctx = Context(wrapper, path, options, alias=_free_alias(query), shared_query=query)
        _run_rules(ctx, convert=convertible)
        findings.extend(ctx.findings)
        if convertible:
            output = _emit(ctx, path)
    findings.sort(key=lambda f: (f.line, f.col))
    return Conversion(
        path=path, original=source, output=output, findings=tuple(findings),
        framework=detection.framework, generation=detection.generation,
    )


def _parse(source: bytes, path: str) -> libcst.Module:
    try:
        return libcst.parse_module(source)
    except libcst.ParserSyntaxError as exc:
        raise ConversionError(path, f"does not parse: {exc.message}", exc.raw_line, exc.raw_column + 1) from None
    except (UnicodeDecodeError, LookupError, SyntaxError) as exc:
        raise ConversionError(path, f"is not text in its declared encoding: {exc}") from None


def _detection_findings(detection: Detection, path: str, options: Options) -> list[Finding]:
    def finding(severity, message, fix=None):
        return Finding(path, detection.line, detection.col, DETECT_RULE, severity, message, fix)

    if detection.status == "mixed":
        return [finding(
            "declined", detection.reason,
            "move each framework's training code into its own file and convert the PyTorch one",
        )]
    if detection.status == "none":
        return []
    if options.framework not in ("auto", detection.framework):
        return [finding(
            "declined",
            f"--framework {options.framework} was asked for, but the file is written for {detection.framework}",
            f"run with --framework {detection.framework} (or auto)",
        )]
    if detection.status == "convert":
        return []
    return [finding("note", detection.reason)]


def _run_rules(ctx: Context, *, convert: bool) -> None:
    for rule_class in all_rules():
        if not (convert or rule_class.checks_only) or not ctx.options.runs(rule_class.name):
            continue
        try:
            rule_class(ctx).run()
        except Exception as exc:  # a bug in a rule must name the rule and the file, not just crash
            raise ConversionError(
                ctx.path, f"rule {rule_class.name} failed ({type(exc).__name__}: {exc}); the file was "
                "left unchanged. Please report this with the file"
            ) from exc


def _emit(ctx: Context, path: str) -> bytes:
    new = apply(ctx.module, ctx.plan, ctx.query.index)
    if new is ctx.module:
        return ctx.module.bytes
    if ctx.plan.needs_runtime_import:
        new = _add_runtime_import(new, None if ctx.alias == RUNTIME_MODULE else ctx.alias)
    output = new.bytes
    try:
        libcst.parse_module(output)
    except libcst.ParserSyntaxError as exc:  # never hand back a file that no longer parses
        raise ConversionError(path, f"the converted file would not parse ({exc.message}); left unchanged") from exc
    return output


def _add_runtime_import(module: libcst.Module, alias: str | None) -> libcst.Module:
    """``import dpmigrate.runtime.torch as dp`` where libcst's ``AddImportsVisitor`` puts it.

    The visitor only reads and changes the module's leading statements (a docstring, the first
    block of imports, and the statement after it, which may get a blank line before it), yet walks
    and copies the whole tree twice. It is given just those statements, the ones that are not
    imports or a docstring stood in for by a ``pass`` with the same leading lines (all it may
    change of them); the statements and the rest of the body are then put back.
    """
    body = list(module.body)
    end = 1  # the first statement (a docstring, maybe), then the block of imports, then one more
    while end < len(body) and libcst.matchers.matches(body[end], _IMPORT_LINE):
        end += 1
    head = body[: end + 1]
    stand_ins = {i: s for i, s in enumerate(head) if not libcst.matchers.matches(s, _IMPORT_OR_FIRST_LINE)}
    context = CodemodContext()
    AddImportsVisitor.add_needed_import(context, RUNTIME_MODULE, asname=alias)
    top = AddImportsVisitor(context).transform_module(module.with_changes(body=[
        libcst.SimpleStatementLine([libcst.Pass()], leading_lines=s.leading_lines) if i in stand_ins else s
        for i, s in enumerate(head)
    ]))
    new_head = list(top.body)
    for i, original in stand_ins.items():  # the visitor only inserts, before these: count from the end
        position = len(new_head) - (len(head) - i)
        new_head[position] = original.with_changes(leading_lines=new_head[position].leading_lines)
    return top.with_changes(body=[*new_head, *body[end + 1:]])


def _free_alias(query: Query) -> str:
    used = query.names_in(query.module)
    return next((a for a in _ALIASES if a not in used), _ALIASES[-1])
