"""Convert one file's bytes: pre-filter, parse, detect the framework, run the rules in order, report.

The input is parsed as bytes, so libcst honours a PEP 263 coding cookie and a UTF-8 BOM, and the
output (``module.bytes``) keeps the encoding, line endings, comments and formatting of everything
no rule touched. Every rule reads the original tree and records edits in one plan, applied at the
end (see ``plan.py``); positions in findings are therefore those of the input file.

The framework's rules and vocabulary come from the registry (``dpmigrate.frameworks``): the engine
itself knows no framework. A file that is not plain single-process code of a framework with rules
(already converted, written for data parallelism by hand, starting its own processes, a framework
without rules, two frameworks) is returned byte-identical with a note or a declined finding saying
why; the rules that only check (rank-divergent code) still run on such files of that framework.
``Options.select`` / ``Options.ignore`` run some rules only (a rule's tests run it alone).
"""

from __future__ import annotations

import ast
import dataclasses
import gc
import itertools
import sys

import libcst
from libcst.metadata import MetadataWrapper

from ..findings import Conversion, ConversionError, Finding, Options
from ..frameworks import REGISTRY, may_use_a_framework
from . import selfcheck, star_imports
from .detect import Detection, detect
from .imported_names import local_trainer_calls
from .imports import add_import
from .index import TreeIndex
from .loaders import LoaderFlow
from .plan import apply
from .query import Query
from .rule import Context, Rule
from .unused_imports import without_unused_imports

_ALIASES = ("dp", "dpr", "dp_runtime")
DETECT_RULE = "detect-framework"
UNUSED_IMPORT_RULE = "unused-import"
_RECURSION_LIMIT = 30_000  # Python frames; a level of nesting costs libcst about ten


def convert(source: bytes, path: str, options: Options = Options()) -> Conversion:
    """Return the converted file. Raises ConversionError for a file that is not text or does not parse.

    Deeply nested code (a sum of hundreds of terms is a tree hundreds of levels deep, and libcst
    walks trees recursively) is converted with a higher recursion limit; past what even that allows
    the file is declined with a ConversionError, never a RecursionError traceback.
    """
    if not _helper_of(options) and not may_use_a_framework(source) and not _names_a_local_framework(source, options):
        return Conversion(path=path, original=source, output=source)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, _RECURSION_LIMIT))
    try:
        written = star_imports.write_out(source, path, options)
        if written is not None:
            return star_imports.reported(_convert(written.source, path, options), source, written)
        return _convert(source, path, options)
    except RecursionError:
        raise ConversionError(path, "nests expressions or blocks too deeply for dpmigrate to convert; it was left "
                              "unchanged (split the deepest expression into a few statements)") from None
    finally:
        sys.setrecursionlimit(limit)
        gc.unfreeze()  # the tree goes back to the collector (see _parse_outside_the_collector)


def _helper_of(options: Options) -> bool:
    """A local module converted with the script that imports it, which says its framework (``mod/report.py``, writing
    a JSON report with no framework import: issue 19's cats-and-dogs trainer, every rank writing it)."""
    return options.importer_seeds is not None and options.framework in REGISTRY


_LEFT_ALONE = ("hand-distributed", "multiprocessing", "mixed")  # scripts whose helper modules stay as they are too


def _convert(source: bytes, path: str, options: Options) -> Conversion:
    module = _parse_outside_the_collector(source, path)
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)  # a fresh tree nobody else holds: no copy
    index = TreeIndex(wrapper)  # one index of the tree and one set of metadata, shared by detection and rules
    detection = detect(wrapper, index, options.local_frameworks, options.local_modules, options.local_trainers)
    if detection.status == "none" and _helper_of(options):  # a script's helper naming no framework: its writes
        detection = Detection("convert", options.framework)
    findings = _detection_findings(detection, path, options)
    if detection.status == "none":
        return Conversion(path=path, original=source, output=source, findings=tuple(findings))
    convertible = detection.status == "convert" and options.framework in ("auto", detection.framework)
    output = source
    imported_training: tuple[tuple[str, int], ...] = ()
    rule_set = REGISTRY[detection.framework].rule_set() if detection.status != "mixed" else None
    if rule_set is not None and rule_set.RULES:
        query = Query(wrapper, rule_set.VOCABULARY, index)
        if options.local_trainers:
            query.local_trainer_calls = local_trainer_calls(query.module, index, options.local_modules, options.local_trainers)
        ctx = Context(wrapper, path, options, query, alias=_free_alias(query), generation=detection.generation)
        chosen = _chosen(rule_set.RULES, options)
        _run_rules(ctx, chosen, convert=convertible)
        if convertible:
            output, ctx = _emit_without_divergence(ctx, source, path, chosen)
            # (a rule the user turned off: theirs; a file left whole on purpose says why in its own declined finding)
            whole_file = {r.name for r in chosen if r.declines_training}  # a rule that declined the file's training
            if output != source and all(r in chosen for r in rule_set.RULES if r.about_training) and not any(
                    f.rule in whole_file and f.severity == "declined" for f in ctx.findings):
                silent = {r.name for r in chosen if not r.about_training}
                ctx.findings.extend(selfcheck.uncovered(ctx, [f for f in ctx.findings if f.rule not in silent]))
            if rule_set.VOCABULARY.data_loaders and options.local_modules:  # what it trains on that its modules build
                imported_training = tuple(ctx.analysis(LoaderFlow).imported_training_returns(options.local_modules))
        findings.extend(_once(ctx.findings))
    findings.sort(key=lambda f: (f.line, f.col))
    left_alone = detection.reason if detection.status in _LEFT_ALONE else None
    return Conversion(
        path=path, original=source, output=output, findings=tuple(findings),
        framework=detection.framework, generation=detection.generation, left_alone=left_alone,
        imported_training_returns=imported_training,
    )


def _names_a_local_framework(source: bytes, options: Options) -> bool:
    """The file may import a local module that uses a framework (``Options.local_frameworks``), so it may be
    written for that framework without naming it."""
    return any(module.encode() in source for module, _ in options.local_frameworks)


def _parse_outside_the_collector(source: bytes, path: str) -> libcst.Module:
    """The file's tree, built with Python's cyclic collector off and then frozen (left out of collections).

    The collector scans every live object at each full collection, and a file's tree is millions of
    them (about 40 KB a line): building it, and every allocation after, paid for scanning it again,
    which made a conversion superlinear in the file's length (with a 20k-line file's tree alive,
    ``ast.parse`` of that file took 3.1 s; with the tree frozen, 1.1 s). The tree holds no reference
    cycles (a node only points at its children), so the collector has nothing to find in it; the
    tree is freed by reference counting as ever, and ``convert`` unfreezes it when it returns.
    """
    collecting = gc.isenabled()
    gc.disable()
    try:
        module = _parse(source, path)
    finally:
        if collecting:
            gc.enable()
    gc.freeze()
    return module


def _parse(source: bytes, path: str) -> libcst.Module:
    """libcst's tree of the file, once CPython agrees that it is Python at all.

    libcst's grammar accepts a few files CPython rejects (1000 nested parentheses): those do not
    parse either, and are reported as such.
    """
    try:
        module = libcst.parse_module(source)
    except libcst.ParserSyntaxError as exc:
        raise ConversionError(path, f"does not parse: {exc.message}", exc.raw_line, exc.raw_column + 1) from None
    except (UnicodeDecodeError, LookupError, SyntaxError) as exc:
        raise ConversionError(path, f"is not text in its declared encoding: {exc}") from None
    try:
        ast.parse(source, path)
    except SyntaxError as exc:
        raise ConversionError(path, f"does not parse: {exc.msg}", exc.lineno, exc.offset) from None
    except (ValueError, MemoryError, RecursionError) as exc:
        raise ConversionError(path, f"does not parse: {exc}") from None
    return module


def _detection_findings(detection: Detection, path: str, options: Options) -> list[Finding]:
    def finding(severity, message, fix=None):
        return Finding(path, detection.line, detection.col, DETECT_RULE, severity, message, fix)

    if detection.status == "mixed":
        return [finding(
            "declined", detection.reason,
            "move each framework's training code into its own file and convert each one",
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
        return [finding("note", detection.reason)] if detection.reason else []  # (its framework through a module)
    return [finding("note", detection.reason)]


def _chosen(rules, options: Options) -> list[type[Rule]]:
    """The framework's rules, less those not selected or ignored (names checked by the CLI)."""
    return [r for r in rules if options.runs(r.name)]


def _run_rules(ctx: Context, rules: list[type[Rule]], *, convert: bool) -> None:
    for rule_class in rules:
        if not (convert or rule_class.checks_only) or not rule_class.applies_to(ctx.generation, ctx.vocabulary):
            continue
        try:
            rule_class(ctx).run()
        except Exception as exc:  # a bug in a rule must name the rule and the file, not just crash
            raise ConversionError(
                ctx.path, f"rule {rule_class.name} failed ({type(exc).__name__}: {exc}); the file was "
                "left unchanged. Please report this with the file"
            ) from exc


def _once(findings: list[Finding]) -> list[Finding]:
    """Each finding once (two rules, or one rule twice, may say the same thing of the same site)."""
    return list(dict.fromkeys(findings))


def _emit_without_divergence(ctx: Context, source: bytes, path: str, rules: list[type[Rule]]) -> tuple[bytes, Context]:
    """The converted bytes, checked: a collective the conversion put where only some ranks run it (the engine's
    self-check, :mod:`.selfcheck`) is a bug of the rules, never emitted. The rules are run again without one of
    those that changed the file, the latest first, until the output is clean; that rule's changes are reported as
    declined, with the divergence they would have made. If none helps, the file is left unchanged."""
    output, new = _emit(ctx, source, path)
    problems = selfcheck.divergent_sites(new, ctx.query.index, ctx.alias) if new is not None else []
    if not problems:
        return output, ctx
    changed = [r for r in reversed(rules) if any(f.rule == r.name and f.severity == "change" for f in ctx.findings)]
    for culprit in changed:
        retry = ctx.fresh()
        _run_rules(retry, [r for r in rules if r is not culprit], convert=True)
        retried, new = _emit(retry, source, path)
        if new is None or not selfcheck.divergent_sites(new, retry.query.index, retry.alias):
            retry.findings.extend(_declined_by_self_check(ctx.findings, culprit.name, problems[0]))
            return retried, retry
    ctx.findings[:] = [*(f for f in ctx.findings if f.severity != "change"),
                       *_declined_by_self_check(ctx.findings, None, problems[0])]
    return source, ctx


def _declined_by_self_check(findings: list[Finding], rule: str | None, problem: str) -> list[Finding]:
    """The changes of ``rule`` (every change when None), now declined, saying what they would have made."""
    return [dataclasses.replace(
        f, severity="declined", rule=selfcheck.SELF_CHECK_RULE,
        message=f"not converted ({f.rule}: {f.message}): with it the converted file would run {problem}, which only "
                "some ranks reach, and the job would hang (the engine's self-check)",
        fix="convert this site by hand so that every rank reaches every collective, and please report the file")
        for f in findings if f.severity == "change" and (rule is None or f.rule == rule)]


def _emit(ctx: Context, source: bytes, path: str) -> tuple[bytes, libcst.Module | None]:
    """The converted bytes: the original ones when nothing changed, never a silent change elsewhere.

    Outside the edited statements every byte comes out as it came in, because libcst prints an
    unchanged node as it parsed it. That holds only where libcst reprints the whole original
    file exactly; for the rare file it does not, the conversion is refused rather than risked.
    The original is printed once (``printing.py``): the output reuses its text for every
    top-level statement no edit touched.
    """
    new = apply(ctx.module, ctx.plan, ctx.query.index)
    if new is ctx.module:
        return source, None
    new, removed = without_unused_imports(new, ctx.query.index)
    for statement, name in removed:
        start = ctx.positions[statement].start
        ctx.findings.append(Finding(path, start.line, start.column + 1, UNUSED_IMPORT_RULE, "change",
                                    f"import of `{name}` removed: the conversion replaced its last use"))
    printed = ctx.printed
    if printed.code.encode(ctx.module.encoding) != source:
        raise ConversionError(path, "libcst cannot reprint this file byte for byte, so converting it could change "
                              "code no rule touched; it was left unchanged (please report it with the file)")
    for name in sorted(ctx.plan.standard_imports):
        new = add_import(new, name, None)
    if ctx.plan.needs_runtime_import:
        runtime = ctx.vocabulary.runtime_module
        new = add_import(new, runtime, None if ctx.alias == runtime else ctx.alias)
    output = printed.print(new).encode(new.encoding)
    try:  # never hand back a file that no longer parses (CPython's parser: the one that will run it)
        ast.parse(output, path)
    except SyntaxError as exc:
        raise ConversionError(path, f"the converted file would not parse ({exc.msg}); left unchanged") from exc
    return output, new


def _free_alias(query: Query) -> str:
    """``dp``, or the first of ``dpr``, ``dp_runtime``, ``dp_runtime2``... the file does not use."""
    used = query.names_in(query.module)
    candidates = itertools.chain(_ALIASES, (f"{_ALIASES[-1]}{n}" for n in itertools.count(2)))
    return next(a for a in candidates if a not in used)
