"""Framework names a script takes from ``from utils import *`` of a local module, written out in the script.

Why: the rules match by qualified name, and a name a star import binds has none. ACGAN-Paddle's ``train.py``
gets ``paddle`` from ``from utils import *`` (``utils.py`` does ``import paddle``): its optimizers and
``paddle.save`` were invisible, so the loader was sharded while the networks trained apart on each rank, with
nothing said (issue 19 audit). The module's own top-level framework imports (``local_modules.scan`` reads them:
``Options.star_framework_imports``) that the script uses and does not bind itself are written right after its
star import (``import paddle``): the same module objects under the same names, so the script runs as before,
and the conversion then sees them. A second run finds them bound and writes nothing.
"""

from __future__ import annotations

import ast
import dataclasses

from ..findings import Conversion, Finding, Options

RULE = "star-import-framework"


@dataclasses.dataclass
class Written:
    """The source with the imports written out, the finding saying so, and where lines were inserted."""

    source: bytes
    finding: Finding
    inserted: list[tuple[int, int]]  # (line after which, how many), in the original's lines

    def original_line(self, line: int) -> int:
        """A line of the written source as a line of the original (an inserted one: the star import's)."""
        shift = 0
        for after, count in self.inserted:
            if line > after + shift + count:
                shift += count
            elif line > after + shift:
                return after
        return line - shift


def write_out(source: bytes, path: str, options: Options) -> Written | None:
    """``source`` with the framework imports its star imports bring written after them, and the finding saying
    so; None when there is nothing to write (or the file does not parse: the conversion reports it)."""
    if not options.star_framework_imports or b"import *" not in source:
        return None
    try:
        tree = ast.parse(source, path)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    modules = dict(options.star_framework_imports)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    bound = _bound_by_the_file(tree)
    inserts: list[tuple[int, list[str], ast.ImportFrom]] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and [a.name for a in node.names] == ["*"] and node.module in modules:
            wanted = []
            for line in modules[node.module]:
                names = _names_bound_by(line)
                if names & used and not names & bound:
                    wanted.append(line)
                    bound |= names
            if wanted:
                inserts.append((node.end_lineno, wanted, node))
    if not inserts:
        return None
    lines = source.splitlines(keepends=True)
    newline = b"\r\n" if lines and lines[0].endswith(b"\r\n") else b"\n"
    for end, wanted, _ in reversed(inserts):
        if end <= len(lines) and not lines[end - 1].endswith((b"\n", b"\r")):
            lines[end - 1] += newline
        lines[end:end] = [w.encode() + newline for w in wanted]
    first = inserts[0][2]
    written = "; ".join(w for _, wanted, _ in inserts for w in wanted)
    finding = Finding(path, first.lineno, first.col_offset + 1, RULE, "change",
                      f"`from {first.module} import *` brings the framework's names; written out after it ({written}) "
                      "so that the conversion can follow them (the same modules under the same names)")
    return Written(b"".join(lines), finding, [(end, len(wanted)) for end, wanted, _ in inserts])


def reported(conversion: Conversion, original: bytes, written: Written) -> Conversion:
    """The conversion of the written-out source as one of ``original``: its findings at the original's lines,
    this one first; or ``original`` as it was when the conversion changed nothing else (nothing needs the names)."""
    findings = tuple(dataclasses.replace(f, line=written.original_line(f.line)) if f.path == conversion.path else f
                     for f in conversion.findings)
    if conversion.output == conversion.original:
        return dataclasses.replace(conversion, original=original, output=original, findings=findings)
    return dataclasses.replace(conversion, original=original, findings=(written.finding, *findings))


def _names_bound_by(line: str) -> set[str]:
    statement = ast.parse(line).body[0]
    if isinstance(statement, ast.Import):
        return {a.asname or a.name.split(".")[0] for a in statement.names}
    return {a.asname or a.name for a in statement.names}


def _bound_by_the_file(tree: ast.Module) -> set[str]:
    """Names the file binds at its top level: imports (star imports aside), assignments, definitions."""
    bound: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {a.asname or a.name.split(".")[0] for a in node.names if a.name != "*"}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return bound
