"""Convert the code cells of a Jupyter notebook (``.ipynb``) as one script, and put them back cell by cell.

A notebook's cells are one program: the model is built in one cell and trained in another, so rules
that follow a model to its optimizer and loop must see them together. The code cells are joined with
a marker comment between them, converted by the engine like any script, and split again at the
markers; markdown and raw cells, outputs, execution counts and metadata are kept as they were.

IPython syntax is not Python: a line magic (``%time``), a shell escape (``!pip``), ``x = !ls``, a help
query (``obj?``) and a whole cell magic (``%%bash``) are each replaced by a placeholder (a comment at
the margin, so that the imports stay the script's header; a statement when indented, so that the block
stays valid) before conversion and restored byte for byte after. If the conversion lost or reordered a marker or a
placeholder, the notebook is refused (left as it was) rather than written with cells mixed up.
Findings are reported by code cell and line within that cell.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable

from ..findings import Conversion, ConversionError, Options

_MARK = "# %% dpmigrate-cell-{}"
_MARK_RE = re.compile(r"^# %% dpmigrate-cell-(\d+)$")
_HOLD = "_dpmigrate_ipython_{}_"
_HOLD_RE = re.compile(r"^[ \t]*(?:# )?_dpmigrate_ipython_(\d+)_[ \t]*$")
_IPYTHON_LINE = re.compile(r"^[ \t]*(?:[%!]|[\w.]+[ \t]*=[ \t]*[%!])|^[^#'\"]*\?\??[ \t]*$")
_BY_HAND = "convert it by hand, or export it with `jupyter nbconvert --to script` and convert the script"


def is_notebook(path: str) -> bool:
    return path.lower().endswith(".ipynb")


def convert_notebook(source: bytes, path: str, options: Options,
                     convert: Callable[[bytes, str, Options], Conversion]) -> Conversion:
    """The notebook with its code cells converted (same bytes if nothing changed); ConversionError if unusable."""
    notebook = _load(source, path)
    cells = [cell for cell in notebook["cells"] if cell.get("cell_type") == "code"]
    texts = [_text(cell, path) for cell in cells]
    held: list[str] = []
    script, starts = [], []
    for index, text in enumerate(texts):
        if index:
            script.append(_MARK.format(index) + "\n")
        starts.append(sum(piece.count("\n") for piece in script) + 1)
        script.append(_hold_ipython(text, held) + "\n")
    try:
        conversion = convert("".join(script).encode("utf-8"), path, options)
    except ConversionError as exc:
        cell, line = _locate(exc.line, starts)
        raise ConversionError(path, f"code cell {cell}: {exc.reason}" if cell else exc.reason, line, exc.col) from None
    findings = tuple(_relocated(f, starts) for f in conversion.findings)
    if not conversion.changed:
        return Conversion(path, source, source, findings, conversion.framework, conversion.generation)
    new_texts = _split(conversion.output.decode("utf-8"), len(texts), held, path)
    for cell, old, new in zip(cells, texts, new_texts):
        if new != old:
            cell["source"] = re.findall(r"[^\n]*\n|[^\n]+", new) if isinstance(cell["source"], list) else new
    output = (json.dumps(notebook, indent=_indent(source), ensure_ascii=False) + "\n").encode("utf-8")
    return Conversion(path, source, output, findings, conversion.framework, conversion.generation)


def _load(source: bytes, path: str) -> dict:
    try:
        notebook = json.loads(source.decode("utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConversionError(path, f"is named .ipynb but is not a notebook (not JSON: {exc}); rename it if it is "
                                    "a script") from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise ConversionError(path, "is named .ipynb but has no list of `cells` (nbformat 4 is needed; upgrade it "
                                    "with `jupyter nbconvert --to notebook --inplace`)")
    return notebook


def _text(cell: dict, path: str) -> str:
    source = cell.get("source", "")
    if isinstance(source, list) and all(isinstance(s, str) for s in source):
        return "".join(source)
    if isinstance(source, str):
        return source
    raise ConversionError(path, f"has a code cell whose `source` is neither text nor a list of lines: {source!r:.60}")


def _hold_ipython(text: str, held: list[str]) -> str:
    """The cell with each IPython-only line (or the whole cell, for a cell magic) replaced by a placeholder."""
    if text.lstrip().startswith("%%"):
        held.append(text)
        return "# " + _HOLD.format(len(held) - 1)
    lines = text.split("\n")
    for number, line in enumerate(lines):
        if _IPYTHON_LINE.match(line):
            held.append(line)
            indent = line[:len(line) - len(line.lstrip())]
            # a comment at the margin keeps the imports a header; an indented block needs a statement
            lines[number] = indent + _HOLD.format(len(held) - 1) if indent else "# " + _HOLD.format(len(held) - 1)
    return "\n".join(lines)


def _split(output: str, count: int, held: list[str], path: str) -> list[str]:
    """The converted script cut back into ``count`` cells, placeholders restored; refused if anything moved."""
    cells: list[list[str]] = [[]]
    restored: list[int] = []
    for line in output.split("\n"):
        mark = _MARK_RE.match(line)
        if mark and int(mark.group(1)) == len(cells):
            cells.append([])
            continue
        hold = _HOLD_RE.match(line)
        if hold:
            restored.append(int(hold.group(1)))
            line = held[int(hold.group(1))]
        cells[-1].append(line)
    stray = any(_MARK_RE.match(line) for lines in cells for line in lines)
    if len(cells) != count or restored != list(range(len(held))) or stray:
        raise ConversionError(path, "the conversion moved code across the notebook's cell boundaries or IPython "
                                    f"lines, so it was not written; {_BY_HAND}")
    texts = ["\n".join(lines) for lines in cells]
    texts[-1] = texts[-1].removesuffix("\n")  # the newline that ended the joined script
    return texts


def _locate(line: int | None, starts: list[int]) -> tuple[int | None, int | None]:
    """(1-based code cell, line in it) of a line of the joined script."""
    if line is None or not starts:
        return None, line
    cell = max(i for i, start in enumerate(starts) if start <= line) if line >= starts[0] else 0
    return cell + 1, line - starts[cell] + 1


def _relocated(finding, starts: list[int]):
    cell, line = _locate(finding.line, starts)
    return dataclasses.replace(finding, line=line, message=f"code cell {cell}: {finding.message}")


def _indent(source: bytes) -> int | None:
    """The indentation the notebook was saved with (Jupyter writes 1), to keep its diff small."""
    match = re.search(rb"\{\r?\n( +)\"", source)
    return len(match.group(1)) if match else None
