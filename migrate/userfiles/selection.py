"""Which files a run converts, and whether each one is Python text at all.

Directories are walked for ``*.py`` the way a user expects from a formatter: hidden folders
(``.git``, ``.venv``, ``.tox``...), virtual environments (a folder holding ``pyvenv.cfg``) and
whatever git ignores are skipped, so ``dpmigrate .`` never rewrites a vendored dependency or a
build output. Inside a git work tree git itself answers (``git check-ignore --stdin``, one call
per level of the tree); outside one, a small reader of ``.gitignore`` files does. A project's
``exclude`` patterns (``[tool.dpmigrate]``, same syntax) prune the walk too. A file named on the
command line is always converted, whatever its name, unless ``--force-exclude`` asks that the
patterns apply to it as well (as ruff does, for pre-commit, which names every file).
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
import stat
import subprocess
import tokenize
from collections.abc import Iterable, Sequence


@dataclasses.dataclass(frozen=True)
class Source:
    """A file to convert: ``path`` as shown to the user, ``relative`` to the argument it came from."""

    path: str
    relative: str


class PathError(Exception):
    """A command-line path that does not exist or is neither a regular file nor a directory."""


def kind_of(mode: int) -> str:
    """What a file that is not a regular one is, in words."""
    kinds = [(stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")]
    return next((name for test, name in kinds if test(mode)), "not a regular file")


class NotText(Exception):
    """Bytes that Python itself would refuse to read as source; ``line``/``col`` are 1-based."""

    def __init__(self, reason: str, line: int | None = None, col: int | None = None):
        super().__init__(reason)
        self.reason, self.line, self.col = reason, line, col


class Exclude:
    """A project's ``exclude`` patterns: .gitignore syntax, relative to ``root`` (the pyproject.toml's folder)."""

    def __init__(self, root: str, patterns: Sequence[str] = ()):
        self.root = os.path.abspath(root)
        self.patterns = tuple(patterns)
        self._rules = [rule for rule in map(_parse_gitignore_line, patterns) if rule]

    def __bool__(self) -> bool:
        return bool(self._rules)

    def excludes(self, path: str, is_dir: bool, *, or_its_folders: bool = False) -> bool:
        """Whether a pattern names ``path`` (or, if asked, a folder holding it); paths outside ``root`` never."""
        relative = os.path.relpath(os.path.abspath(path), self.root).replace(os.sep, "/")
        if relative == "." or relative == ".." or relative.startswith("../"):
            return False
        parts = relative.split("/")
        levels = range(1, len(parts) + 1) if or_its_folders else [len(parts)]
        return any(self._matches("/".join(parts[:n]), is_dir or n < len(parts)) for n in levels)

    def _matches(self, relative: str, is_dir: bool) -> bool:
        verdict = False  # the last matching pattern wins, so `!keep.py` can take a file back
        for regex, negate, dir_only in self._rules:
            if (is_dir or not dir_only) and regex.fullmatch(relative):
                verdict = not negate
        return verdict


def discover(paths: Sequence[str], exclude: Exclude | None = None, force_exclude: bool = False) -> list[Source]:
    """Every file to convert under ``paths``, in a stable order: arguments as given, trees sorted.

    ``exclude`` prunes folder walks; with ``force_exclude`` it also drops the paths named in ``paths``.
    """
    exclude = exclude or Exclude(os.curdir)
    found: list[Source] = []
    seen: set[str] = set()
    for arg in paths:
        if force_exclude and exclude.excludes(arg, os.path.isdir(arg), or_its_folders=True):
            continue
        if os.path.isdir(arg):
            candidates: Iterable[Source] = _walk(arg, exclude)
        elif os.path.exists(arg):
            mode = os.stat(arg).st_mode
            if not stat.S_ISREG(mode):  # a FIFO would block the read forever, a device never end
                raise PathError(f"{arg}: is {kind_of(mode)}, not a regular file; dpmigrate converts files and folders "
                                "only (nothing was converted)")
            candidates = [Source(arg, os.path.basename(arg))]
        else:
            raise PathError(f"{arg}: no such file or directory")
        for source in candidates:
            key = os.path.normcase(os.path.abspath(source.path))
            if key not in seen:
                seen.add(key)
                found.append(source)
    return found


def _walk(root: str, exclude: Exclude) -> list[Source]:
    """The ``*.py`` files under ``root``, level by level so that git is asked once per level."""
    found: list[Source] = []
    level = [(root, _oracle_for(root))]
    while level:
        # (path, is_dir, the oracle judging it, the oracle judging what it holds: a nested repo has its own)
        candidates: list[tuple[str, bool, _Oracle, _Oracle]] = []
        for folder, oracle in level:
            try:
                entries = sorted(os.scandir(folder), key=lambda e: e.name)
            except OSError:
                continue  # unreadable folder: nothing of it can be converted, nor broken
            for entry in entries:
                if entry.name.startswith(".") or entry.is_symlink():
                    continue
                if exclude and exclude.excludes(entry.path, entry.is_dir()):
                    continue
                if entry.is_dir():
                    if not os.path.exists(os.path.join(entry.path, "pyvenv.cfg")):
                        inner = _oracle_for(entry.path) if os.path.exists(os.path.join(entry.path, ".git")) else oracle
                        candidates.append((entry.path, True, oracle, inner))
                elif entry.name.endswith(".py") and entry.is_file():
                    candidates.append((entry.path, False, oracle, oracle))
        ignored = _ask(candidates)
        level = []
        for path, is_dir, _, inner in candidates:
            if path in ignored:
                continue
            if is_dir:
                level.append((path, inner))
            else:
                relative = os.path.relpath(path, root)
                found.append(Source(relative if os.path.normpath(root) == os.curdir else path, relative))
    return sorted(found, key=lambda s: s.relative.split(os.sep))


def _ask(candidates: list[tuple[str, bool, _Oracle, _Oracle]]) -> set[str]:
    """The candidate paths their oracle says are ignored (one question per oracle)."""
    by_oracle: dict[int, tuple[_Oracle, list[tuple[str, bool]]]] = {}
    for path, is_dir, oracle, _ in candidates:
        by_oracle.setdefault(id(oracle), (oracle, []))[1].append((path, is_dir))
    ignored: set[str] = set()
    for oracle, items in by_oracle.values():
        ignored |= oracle.ignored(items)
    return ignored


class _Oracle:
    def ignored(self, items: list[tuple[str, bool]]) -> set[str]:
        raise NotImplementedError


class _Git(_Oracle):
    """git's own answer, which also honours ``.git/info/exclude`` and the user's global excludes."""

    def __init__(self, toplevel: str, fallback: _Oracle):
        self.toplevel, self.fallback = toplevel, fallback

    def ignored(self, items: list[tuple[str, bool]]) -> set[str]:
        if not items:
            return set()
        absolute = {os.path.abspath(path): path for path, _ in items}
        proc = subprocess.run(
            ["git", "-C", self.toplevel, "check-ignore", "--stdin", "-z"],
            input=b"".join(os.fsencode(a) + b"\0" for a in absolute), capture_output=True, check=False,
        )
        if proc.returncode not in (0, 1):  # 128: a path git will not judge (beyond a submodule...)
            return self.fallback.ignored(items)
        return {absolute[os.fsdecode(a)] for a in proc.stdout.split(b"\0") if a}


class _Gitignore(_Oracle):
    """Reads ``.gitignore`` files from the walked root down, for trees that are not git work trees.

    Supports what projects write: comments, ``!`` negation, a trailing ``/`` for folders, a
    leading or inner ``/`` to anchor, ``*``, ``?``, ``[...]`` and ``**``; the last match wins.
    """

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self._rules: dict[str, list[tuple[re.Pattern[str], bool, bool]]] = {}

    def ignored(self, items: list[tuple[str, bool]]) -> set[str]:
        return {path for path, is_dir in items if self._match(os.path.abspath(path), is_dir)}

    def _match(self, path: str, is_dir: bool) -> bool:
        verdict = False
        folder = os.path.dirname(path)
        chain = []
        while True:
            chain.append(folder)
            if folder == self.root or os.path.dirname(folder) == folder:
                break
            folder = os.path.dirname(folder)
        for base in reversed(chain):
            relative = os.path.relpath(path, base).replace(os.sep, "/")
            for regex, negate, dir_only in self._rules_of(base):
                if (is_dir or not dir_only) and regex.fullmatch(relative):
                    verdict = not negate
        return verdict

    def _rules_of(self, folder: str) -> list[tuple[re.Pattern[str], bool, bool]]:
        if folder not in self._rules:
            try:
                with open(os.path.join(folder, ".gitignore"), encoding="utf-8", errors="replace") as handle:
                    lines = handle.read().splitlines()
            except OSError:
                lines = []
            self._rules[folder] = [rule for rule in map(_parse_gitignore_line, lines) if rule]
        return self._rules[folder]


def _parse_gitignore_line(line: str) -> tuple[re.Pattern[str], bool, bool] | None:
    if not line.strip() or line.startswith("#"):
        return None
    line = re.sub(r"(?<!\\)\s+$", "", line)
    negate = line.startswith("!")
    line = line[1:] if negate else line.removeprefix("\\")
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    anchored = "/" in line
    body = _glob_to_regex(line.lstrip("/"))
    return re.compile(body if anchored else "(?:.*/)?" + body), negate, dir_only


def _glob_to_regex(glob: str) -> str:
    out, i = [], 0
    while i < len(glob):
        if glob.startswith("**/", i) and (i == 0 or glob[i - 1] == "/"):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("**", i) and i + 2 == len(glob) and (i == 0 or glob[i - 1] == "/"):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 2 if glob.startswith("**", i) else 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        elif glob[i] == "[" and "]" in glob[i + 2:]:
            end = glob.index("]", i + 2)
            inner = glob[i + 1:end]
            out.append("[" + ("^" + inner[1:] if inner[:1] == "!" else inner).replace("\\", "\\\\") + "]")
            i = end + 1
        elif glob[i] == "\\" and i + 1 < len(glob):
            out.append(re.escape(glob[i + 1]))
            i += 2
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return "".join(out)


def _oracle_for(folder: str) -> _Oracle:
    """git when ``folder`` is inside a work tree (and git is installed), else the ``.gitignore`` reader."""
    fallback = _Gitignore(folder)
    try:
        proc = subprocess.run(["git", "-C", folder, "rev-parse", "--show-toplevel"], capture_output=True, check=False)
    except OSError:
        return fallback
    if proc.returncode != 0:
        return fallback
    return _Git(os.fsdecode(proc.stdout.strip()), fallback)


def check_text(source: bytes) -> str:
    """The file's encoding, as Python reads it (BOM, coding comment, else UTF-8); NotText when it is not text."""
    if b"\0" in source:
        line, col = _position(source, source.index(b"\0"))
        raise NotText("is not text: it contains a NUL byte, which Python source cannot hold", line, col)
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(source).readline)
    except SyntaxError as exc:  # an unknown coding name, or non-UTF-8 bytes in the first two lines
        encoding = "utf-8"
        if b"coding" in b"\n".join(source.splitlines()[:2]):
            raise NotText(f"has an unusable encoding declaration ({exc.msg}); declare a known one, "
                          "e.g. `# -*- coding: latin-1 -*-`", exc.lineno or 1, 1) from None
    try:
        source.decode(encoding)
    except UnicodeDecodeError as exc:
        line, col = _position(source, exc.start)
        byte = source[exc.start:exc.start + 1].hex()
        if encoding in ("utf-8", "utf-8-sig"):
            reason = (f"is not UTF-8: byte 0x{byte} cannot be decoded and the file declares no other encoding; "
                      "save it as UTF-8, or name its encoding on the first or second line, "
                      "e.g. `# -*- coding: latin-1 -*-`")
        else:
            reason = (f"is not valid {encoding}, the encoding its coding comment declares: byte 0x{byte} cannot be "
                      "decoded; fix the declaration or re-save the file in that encoding")
        raise NotText(reason, line, col) from None
    return encoding


def _position(source: bytes, offset: int) -> tuple[int, int]:
    """1-based line and column (in bytes) of a byte offset."""
    line_start = source.rfind(b"\n", 0, offset) + 1
    return source.count(b"\n", 0, offset) + 1, offset - line_start + 1
