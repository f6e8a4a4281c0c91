"""``dpmigrate [options] PATH...``: convert scripts in place, or show, check or copy the conversion.

Modelled on pyupgrade's command line, so that it behaves in pre-commit as users expect:
``main(argv=None) -> int``; ``Rewriting PATH`` on stderr for each file written; exit 0 when
nothing changes, 1 when a file changed (or would change, or holds rank-divergent code that is
reported as an error), 2 when a file could not be converted or written (it is then left
byte-identical, and its path, line and reason are printed). Like ruff and black it also reads a
script from standard input (``dpmigrate -``, for editors), runs only some rules (``--select``,
``--ignore``) and takes a project's defaults from ``[tool.dpmigrate]`` (``config.py``), flags
winning. ``dpmigrate launch ...`` is the launcher (``dpmigrate.launch``). Importing this module
loads no framework and no libcst: the engine is imported only when a file is converted.

On bad input it never hangs, never prints a traceback and never changes a file silently: a FIFO or
device named on the command line is refused (exit 2); ``-o`` never writes through a link in its folder
and refuses to replace a source with its own copy; a notebook (``.ipynb``) has its code cells converted
(``notebooks.py``); a file edited while it was being converted is left as the user left it (exit 2);
Ctrl-C or ``kill`` stops at once with one line and exit 130 or 143 (``stopping.py``). Reading and
converting, in worker processes for ``-j N``, is ``converting.py``; writing is ``writing.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import io
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from . import __version__
from .config import CHOICES, Config, ConfigError
from .config import load as load_config
from .findings import Conversion, Options
from .local.helpers import (
    held_helpers,
    hold,
    imported_helpers,
    read_as_imported_helper,
    read_as_local_module,
    seeded_families,
    training_hints,
)
from .local.modules import scan as scan_local_modules
from .reporting.report import Failure, FileResult, policy_line, render_json, render_text
from .run.converting import Outcome, convert_all, convert_path, convert_source
from .run.progress import Progress, is_terminal
from .run.stopping import Interrupted, interruptible
from .runtime.atomic import remove_stale_temporaries
from .userfiles.copies import clashing_copies, copies_onto_sources, copy_local_modules
from .userfiles.selection import Exclude, PathError, Source, discover
from .userfiles.writing import WriteError, check_replaceable, write_atomic, write_copy


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpmigrate",
        description="Turn single-GPU training scripts into data-parallel ones (in place by default). "
                    "`dpmigrate launch -n N script.py` runs the result on N processes.",
        epilog="Exit status: 0 nothing to change, 1 changed or would change (or rank-divergent code found), "
               "2 a file could not be converted or written, 130/143 stopped by Ctrl-C/SIGTERM.",
    )
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help="files (scripts, or .ipynb notebooks), or folders to search for *.py; `-` reads one script "
                             "from stdin and writes the converted one to stdout")
    what = parser.add_argument_group("what to do (default: rewrite the files in place)")
    what.add_argument("--diff", action="store_true", help="print a unified diff; write nothing")
    what.add_argument("--check", action="store_true", help="write nothing; exit 1 if anything would change")
    what.add_argument("-o", "--output-dir", metavar="DIR", help="write converted copies under DIR, mirroring the tree")
    what.add_argument("--stdin-filename", metavar="PATH",
                      help="with `-`: the script's path, for the report and for finding pyproject.toml")
    what.add_argument("--force-exclude", action="store_true",
                      help="apply [tool.dpmigrate] exclude to the paths named on the command line too "
                           "(as pre-commit names every file)")
    policy = parser.add_argument_group("conversion policy (defaults from [tool.dpmigrate] in pyproject.toml)")
    policy.add_argument("--framework", choices=CHOICES["framework"], help="default: auto")
    policy.add_argument("--batch", choices=CHOICES["batch"],
                        help="per-device: each rank keeps the batch size (global batch grows N times); "
                             "global: each rank takes B/N (default: per-device)")
    policy.add_argument("--scale-lr", choices=CHOICES["scale-lr"],
                        help="scale the learning rate with the world size (default: none)")
    policy.add_argument("--sync-batchnorm", action=argparse.BooleanOptionalAction, default=None,
                        help="synchronise batch normalisation over the ranks in the framework's own form "
                             "(torch/Paddle: dp.Strategy(sync_batchnorm=True), run on GPUs; Keras: synchronized=True)")
    policy.add_argument("--select", action="append", metavar="RULE[,RULE...]",
                        help="run only these rules (see --list-rules); replaces the configured select")
    policy.add_argument("--ignore", action="append", metavar="RULE[,RULE...]",
                        help="never run these rules, even if selected; replaces the configured ignore")
    out = parser.add_argument_group("output")
    out.add_argument("--report", choices=["text", "json", "sarif"], default="text",
                     help="text goes to stderr, json and sarif to stdout, unless --report-file is given")
    out.add_argument("--report-file", metavar="FILE", help="write the report to FILE")
    out.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                     help="color the diff (auto: when stdout is a terminal and NO_COLOR is unset)")
    out.add_argument("-j", "--jobs", type=int, default=1, metavar="N",
                     help="convert N files at a time in separate processes (0: one per CPU)")
    parser.add_argument("--list-rules", action="store_true", help="list the conversion rules and exit")
    parser.add_argument("--version", action="version", version=f"dpmigrate {__version__}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["launch"]:
        from . import launch

        return launch.main(argv[1:])
    if argv[:1] == ["verify"]:
        from . import verify

        return verify.main(argv[1:])
    results: list[FileResult] = []
    with interruptible():
        try:
            return _run(argv, results)
        except Interrupted as stop:  # one line, no traceback; the workers are already gone (convert_all)
            print(f"dpmigrate: stopped by {stop.name} after {len(results)} file{'s' if len(results) != 1 else ''}; "
                  "every file written is complete, the others were left as they were", file=sys.stderr, flush=True)
            return stop.code


def _run(argv: list[str], results: list[FileResult]) -> int:
    """The run itself; ``results`` grows file by file, so that an interrupted run can say how far it got."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.list_rules:
        return _list_rules()
    _validate(parser, args)
    mode = "copy" if args.output_dir else "diff" if args.diff else "check" if args.check else "write"
    try:
        config = load_config(_config_folder(args))
        options = _options(parser, args, config)
    except ConfigError as exc:
        print(f"dpmigrate: error: {exc}", file=sys.stderr)
        return 2
    exclude = Exclude(config.root, config.exclude)
    color = args.color == "always" or (
        args.color == "auto" and is_terminal(sys.stdout) and not os.environ.get("NO_COLOR"))
    if args.paths == ["-"]:
        return _convert_stdin(args, options, exclude, mode, color)
    try:
        sources = discover(args.paths, exclude, args.force_exclude)
    except PathError as exc:
        print(f"dpmigrate: error: {exc}", file=sys.stderr)
        return 2
    if args.output_dir and (clash := clashing_copies(sources)):
        print(f"dpmigrate: error: -o {args.output_dir}: {clash}; convert them in separate runs", file=sys.stderr)
        return 2
    if args.output_dir and (own := copies_onto_sources(sources, args.output_dir)):
        print(f"dpmigrate: error: -o {args.output_dir}: {own}; nothing was written. Choose a folder other than the "
              "sources' own, or drop -o to convert in place", file=sys.stderr)
        return 2
    modules = scan_local_modules(s.path for s in sources)
    if modules.names:  # a script calling its local modules: their loaders, downloads and framework are followed
        options = dataclasses.replace(options, **modules.options())
    with Progress(len(sources), sys.stderr) as progress, \
            contextlib.closing(convert_all(sources, options, args.jobs)) as outcomes:
        # a module another file of the run imports waits: if that file is left alone, so is the module
        imported = modules.imported
        waiting, left_alone, trainers, converted = [], [], [], []
        frameworks: dict[str, str | None] = {}  # a converted script's framework: its helpers naming none are its
        for source, outcome in zip(sources, outcomes):
            conversion = outcome.conversion
            if conversion is not None and conversion.left_alone is not None:
                left_alone.append(conversion)
            if conversion is not None and conversion.left_alone is None and conversion.output != conversion.original:
                converted.append(conversion.path)  # its local modules are converted with it
                frameworks[os.path.realpath(conversion.path)] = conversion.framework
            if conversion is not None and conversion.imported_training_returns:
                trainers.append(dataclasses.replace(conversion, original=b"", output=b""))
            if conversion is not None and os.path.realpath(source.path) in imported:
                waiting.append((source, outcome))
            else:
                _record(results, _apply(source, outcome, args, color, progress), progress)
            progress.advance()
        held = held_helpers([*left_alone, *(o.conversion for _, o in waiting)]) if waiting else {}
        hints = training_hints(trainers)
        for source, outcome in waiting:
            real = os.path.realpath(source.path)
            if (why := held.get(real)) is not None:
                outcome = dataclasses.replace(outcome, conversion=hold(outcome.conversion, why))
            elif real in hints:  # converted again, now knowing which of its loaders a script trains on
                outcome = convert_path(source.path, dataclasses.replace(options, returned_roles=hints[real].returned_roles()))
            _record(results, _apply(source, outcome, args, color, progress), progress)
        given = {os.path.realpath(s.path) for s in sources}
        helpers = imported_helpers(converted, modules.needed, given | set(hints) | set(held))
        for real, hint in [*hints.items(), *helpers.items()]:  # local modules the run was not asked for
            if real in given or real in held:
                continue
            source = hint.source_beside(sources)
            # every rank runs a local module's functions (its prints and writes: the main process's); a helper's
            # downloads are the script's to guard: it runs their calls under dp.main_process_first()
            helper = {"importer_seeds": seeded_families(hint.script), **({
                "ignore": (*options.ignore, "download-main-process-first"),
                "framework": frameworks.get(os.path.realpath(hint.script)) or options.framework} if real in helpers else {})}
            outcome = convert_path(hint.path, dataclasses.replace(options, returned_roles=hint.returned_roles(),
                                                                  **helper))
            if outcome.conversion is not None and real in helpers:
                conversion = read_as_imported_helper(outcome.conversion, hint)
                if conversion is None:
                    continue  # nothing to do there (a module of models): copied unchanged with -o
                outcome = dataclasses.replace(outcome, conversion=conversion)
            elif outcome.conversion is not None:
                outcome = dataclasses.replace(outcome, conversion=read_as_local_module(outcome.conversion, hint))
            _record(results, _apply(source, outcome, args, color, progress), progress)
            sources = [*sources, source]
        if args.output_dir:  # the local modules the copies import, unchanged: a copy runs as it is
            for failure in copy_local_modules(sources, modules.needed, results, args.output_dir, progress.say):
                _record(results, failure, progress)
    order = {s.path: i for i, s in enumerate(sources)}
    results.sort(key=lambda r: order.get(r.path, len(order)))
    return _exit_code(results, reported=_write_report(results, args, mode, options))


def _record(results: list[FileResult], result: FileResult, progress: Progress) -> None:
    if result.failure:
        progress.say(result.failure_line())
    results.append(result)


def _exit_code(results: Sequence[FileResult], reported: bool) -> int:
    if not reported or any(r.failure for r in results):
        return 2
    return int(any(r.changed or any(f.severity == "error" for f in r.findings) for r in results))


def _validate(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    stdin = "-" in args.paths
    if not args.paths:
        parser.error("no PATH given: name the scripts or folders to convert, e.g. `dpmigrate train.py`")
    if stdin and len(args.paths) > 1:
        parser.error("`-` reads one script from stdin; it cannot be combined with other paths "
                     f"({' '.join(args.paths)})")
    if args.stdin_filename and not stdin:
        parser.error("--stdin-filename names the script read from stdin: add `-` as the PATH")
    if stdin and args.output_dir:
        parser.error("with `-` the converted script goes to stdout; -o/--output-dir writes files: drop one")
    if args.output_dir and (args.check or args.diff):
        parser.error("-o/--output-dir writes copies; --check and --diff write nothing: choose one")
    if args.report in ("json", "sarif") and not args.report_file:
        if args.diff:
            parser.error(f"--diff and --report {args.report} would both go to stdout: add --report-file FILE")
        if stdin and not args.check:
            parser.error(f"with `-` the converted script and --report {args.report} would both go to stdout: "
                         "add --report-file FILE")
    if args.jobs < 0:
        parser.error(f"-j/--jobs must be 0 (one per CPU) or more, got {args.jobs}")


def _config_folder(args: argparse.Namespace) -> str:
    """Where the search for pyproject.toml starts: here, or for `-` the folder --stdin-filename names (editors)."""
    if args.paths == ["-"] and args.stdin_filename:
        return os.path.dirname(os.path.abspath(args.stdin_filename))
    return os.getcwd()


def _options(parser: argparse.ArgumentParser, args: argparse.Namespace, config: Config) -> Options:
    """Flags over ``[tool.dpmigrate]`` over the defaults; rule names must be names of rules the engine runs."""
    chosen = {}
    for key in ("select", "ignore"):
        given = getattr(args, key)  # every --select/--ignore value, each maybe comma-separated; None if absent
        names = tuple(n.strip() for value in given or () for n in value.split(",") if n.strip())
        if given is not None and not names:
            parser.error(f"--{key} needs a rule name (see --list-rules)")
        if given is None:
            names = getattr(config, key) or ()
        known = [name for name, _ in _catalog()] if names else []
        unknown = [n for n in names if n not in known]
        if unknown:
            message = (f"unknown rule{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                       f"the rules are: {', '.join(known)}")
            if given is not None:
                parser.error(f"--{key}: {message}")
            raise ConfigError(f"{config.path}: [tool.dpmigrate] {key}: {message}")
        chosen[key] = names
    return Options(framework=args.framework or config.framework or "auto",
                   batch=args.batch or config.batch or "per-device",
                   scale_lr=args.scale_lr or config.scale_lr or "none",
                   sync_batchnorm=args.sync_batchnorm if args.sync_batchnorm is not None else bool(config.sync_batchnorm),
                   **chosen)


def _convert_stdin(args: argparse.Namespace, options: Options, exclude: Exclude, mode: str, color: bool) -> int:
    """``dpmigrate -``: the script on stdin; the converted script (or only the diff) on stdout; the report on stderr.

    Unchanged input, and input that cannot be converted, is echoed byte for byte, so that an editor
    or a pipe never receives less than it sent.
    """
    source = sys.stdin.buffer.read()
    path = args.stdin_filename or "-"
    output, results = source, []
    if not (args.force_exclude and args.stdin_filename and exclude.excludes(path, False, or_its_folders=True)):
        outcome = convert_source(source, path, options)
        conversion = outcome.conversion
        if conversion is None:
            results.append(FileResult(path, failure=outcome.failure))
            print(results[-1].failure_line(), file=sys.stderr, flush=True)
        else:
            results.append(FileResult(path, conversion.changed, conversion.framework, conversion.findings,
                                      left_alone=conversion.left_alone))
            output = conversion.output
            if args.diff and conversion.changed:
                _emit(sys.stdout, _diff(conversion, outcome.encoding, color))
    if mode == "write":
        sys.stdout.flush()
        sys.stdout.buffer.write(output)
        sys.stdout.buffer.flush()
    return _exit_code(results, reported=_write_report(results, args, mode, options))


def _apply(source: Source, outcome: Outcome, args: argparse.Namespace, color: bool, progress: Progress) -> FileResult:
    """Show, write or copy one converted file, as the mode says; reduce it to a small FileResult."""
    conversion = outcome.conversion
    if conversion is None:
        return FileResult(source.path, failure=outcome.failure)
    result = FileResult(source.path, conversion.changed, conversion.framework, conversion.findings,
                        left_alone=conversion.left_alone)
    try:
        if args.output_dir:
            destination = write_copy(args.output_dir, source.relative, conversion.output, like=source.path)
            if conversion.changed:
                progress.say(f"Rewriting {source.path} -> {destination}")
        elif args.diff and conversion.changed:
            progress.clear()
            _emit(sys.stdout, _diff(conversion, outcome.encoding, color))
        elif not args.check and not args.diff and conversion.changed:
            check_replaceable(source.path)
            write_atomic(source.path, conversion.output, expect=(conversion.original, outcome.read_as))
            progress.say(f"Rewriting {source.path}")
        elif not args.check and not args.diff:  # a write cleans these up; an unchanged file must too
            remove_stale_temporaries(os.path.realpath(source.path))
    except WriteError as exc:
        return dataclasses.replace(result, changed=False, failure=Failure(exc.reason))
    except OSError as exc:  # the file vanished or changed type between reading and writing
        return dataclasses.replace(result, changed=False, failure=Failure(f"cannot be written: {exc.strerror or exc}"))
    return result


def _diff(conversion: Conversion, encoding: str, color: bool) -> str:
    # Python's own line breaks only (str.splitlines would also break at form feeds and U+2028)
    before = io.StringIO(conversion.original.decode(encoding), newline="").readlines()
    after = io.StringIO(conversion.output.decode(encoding), newline="").readlines()
    out = []
    for line in difflib.unified_diff(before, after, fromfile=conversion.path, tofile=conversion.path):
        if not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        if color:
            code = ("1" if line[:3] in ("---", "+++") else "36" if line[:2] == "@@"
                    else {"-": "31", "+": "32"}.get(line[:1]))
            if code:
                body = line.rstrip("\r\n")
                line = f"\033[{code}m{body}\033[0m{line[len(body):]}"
        out.append(line)
    return "".join(out)


def _write_report(results: list[FileResult], args: argparse.Namespace, mode: str, options: Options) -> bool:
    """Print or save the report; False when --report-file cannot be written (the report then goes to stderr)."""
    policy = policy_line(options.batch, options.scale_lr, [f for r in results for f in r.findings])
    if args.report == "json":
        text = render_json(results, mode, policy)
    elif args.report == "sarif":
        from .reporting.sarif import render_sarif

        text = render_sarif(results, _catalog())
    else:
        text = render_text(results, policy)
    if args.report_file:  # plainly, not atomically: it may be /dev/stdout or a pipe, never to be replaced
        try:
            with open(args.report_file, "w", encoding="utf-8") as handle:
                handle.write(text)
        except OSError as exc:
            print(f"dpmigrate: error: --report-file {args.report_file}: {exc.strerror or exc}", file=sys.stderr)
            _emit(sys.stderr, text)
            return False
    else:
        _emit(sys.stderr if args.report == "text" else sys.stdout, text)
    return True


def _catalog() -> list[tuple[str, str]]:
    from .rules import rule_catalog  # the rules load only when needed: `dpmigrate --help` stays fast

    return rule_catalog()


def _list_rules() -> int:
    catalog = _catalog()
    width = max((len(name) for name, _ in catalog), default=0)
    for name, doc in catalog:
        print(f"{name:<{width}}  {doc.splitlines()[0]}")
    return 0


def _emit(stream: TextIO, text: str) -> None:
    """Write text a terminal's encoding may not cover (a latin-1 script's diff to an ASCII locale)."""
    try:
        stream.write(text)
    except UnicodeEncodeError:
        stream.write(text.encode(stream.encoding or "ascii", "backslashreplace").decode(stream.encoding or "ascii"))
    stream.flush()
