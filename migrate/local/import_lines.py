"""A module's import statements, read without parsing the whole module.

Why: before converting anything, a run looks at what every file imports (``local_modules.scan``:
which local modules, which frameworks). Parsing each whole file with :mod:`ast` for that cost about a
tenth of a ``dpmigrate --check`` over a package tree, where every file imports its neighbours. An
import statement starts its line (indented or not), so the statements are found by their first word
and only their text is parsed.

The answer is a module of those statements, in file order. It never misses an import Python would
run: a file with an import after a colon or a semicolon on one line (``if x: import y``), one declaring
another encoding than UTF-8, or a parenthesised import whose text does not parse alone, is parsed whole
instead. It may hold more: an indented line
of a docstring that reads as an import (``    import numpy as np`` in an example) is taken as one,
which costs at most a look at a module the file does not use.
"""

from __future__ import annotations

import ast
import re

# an import statement's text: its first word at the start of a line, up to the end of its logical line
# (backslash continuations included) or the ")" closing a parenthesised list of names
_STATEMENT = re.compile(rb"^[ \t\f]*((?:from|import)\b(?:[^\n#;()\\]|\\\r?\n)*)(\()?", re.M)
_AFTER_COLON_OR_SEMICOLON = re.compile(rb"[:;][ \t\f]*(?:from|import)[ \t\f\\(]")
# a coding cookie (PEP 263) naming another encoding than UTF-8: a statement's text alone would be read as UTF-8
_OTHER_ENCODING = re.compile(rb"\A(?:[^\n]*\n)?[ \t\f]*#.*?coding[:=][ \t]*(?!utf-?8\b)[-\w.]+", re.I)
_BOM = b"\xef\xbb\xbf"


def import_statements(path: str, source: bytes) -> ast.Module | None:
    """The import statements of ``source`` (an :class:`ast.Module` of them), or the whole module parsed
    when reading them alone could miss one; None when it has to be parsed whole and does not parse."""
    if _AFTER_COLON_OR_SEMICOLON.search(source) or _OTHER_ENCODING.match(source):
        return _parse(path, source)
    source = source.removeprefix(_BOM)
    body: list[ast.stmt] = []
    for match in _STATEMENT.finditer(source):
        text = match.group(1)
        if match.group(2):  # from x import (a, b): up to the closing parenthesis
            end = source.find(b")", match.end())
            if end < 0:
                return _parse(path, source)
            text = source[match.start(1):end + 1]
        try:
            statement = ast.parse(text.strip(), path).body
        except (SyntaxError, ValueError):
            if match.group(2):  # (a comment with a parenthesis inside the list): read the whole file
                return _parse(path, source)
            continue  # prose that starts with "from" or "import"
        body.extend(s for s in statement if isinstance(s, ast.Import | ast.ImportFrom))
    return ast.Module(body=body, type_ignores=[])


def _parse(path: str, source: bytes) -> ast.Module | None:
    try:
        return ast.parse(source, path)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
